"""Admin requests and config files surviving a broker restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from broker.config import BrokerConfig
from broker.service import BrokerHandle, run_broker
from broker.store import MessageStoreConfig, run_memory_store
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand


def cfg(tmp_path: Path, **kw: Any) -> BrokerConfig:
    return BrokerConfig(listen_port=0, store=MessageStoreConfig(store_path_root_dir=tmp_path), **kw)


async def start(nursery: trio.Nursery, config: BrokerConfig) -> BrokerHandle:
    return await nursery.start(
        lambda task_status: run_broker(
            config, store_factory=run_memory_store, task_status=task_status
        )
    )


async def test_admin_topics_groups_runtime(tmp_path: Path) -> None:
    async with trio.open_nursery() as n, open_remoting_client() as c:
        b = await start(n, cfg(tmp_path))

        async def call(code, ext=None, body=b""):
            return await c.invoke(b.addr, RemotingCommand.request(code, ext, body))

        ext = {
            "topic": "AT",
            "defaultTopic": "TBW102",
            "readQueueNums": 3,
            "writeQueueNums": 3,
            "perm": 6,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": False,
        }
        assert (await call(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)).code == 0
        bad = dict(ext, topic="bad topic")
        assert (
            await call(RequestCode.UPDATE_AND_CREATE_TOPIC, bad)
        ).code == ResponseCode.SYSTEM_ERROR
        bad = dict(ext, readQueueNums=0)
        assert (
            await call(RequestCode.UPDATE_AND_CREATE_TOPIC, bad)
        ).code == ResponseCode.SYSTEM_ERROR
        r = await call(RequestCode.GET_ALL_TOPIC_CONFIG)
        table = json.loads(r.body_bytes())["topicConfigTable"]
        assert table["AT"]["readQueueNums"] == 3 and table["TBW102"]["perm"] == 7
        assert "dataVersion" in json.loads(r.body_bytes())
        assert (await call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "AT"})).code == 0
        r = await call(RequestCode.GET_ALL_TOPIC_CONFIG)
        assert "AT" not in json.loads(r.body_bytes())["topicConfigTable"]

        group = {"groupName": "AG", "retryMaxTimes": 5, "retryQueueNums": 2}
        r = await call(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, json.dumps(group).encode()
        )
        assert r.code == 0
        r = await call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        sg = json.loads(r.body_bytes())["subscriptionGroupTable"]["AG"]
        assert sg["retryMaxTimes"] == 5 and sg["retryQueueNums"] == 2
        r = await call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, b"{oops")
        assert r.code == ResponseCode.SYSTEM_ERROR

        r = await call(RequestCode.GET_ALL_CONSUMER_OFFSET)
        assert json.loads(r.body_bytes()) == {"offsetTable": {}}
        r = await call(RequestCode.GET_ALL_DELAY_OFFSET)
        assert json.loads(r.body_bytes()) == {"offsetTable": {}}

        r = await call(RequestCode.GET_BROKER_RUNTIME_INFO)
        t = json.loads(r.body_bytes())["table"]
        for key in (
            "brokerVersionDesc",
            "msgPutTotalTodayNow",
            "commitLogMaxOffset",
            "bootTimestamp",
            "runtime",
            "dispatchBehindBytes",
        ):
            assert key in t
        assert t["brokerVersion"] == "407"
        r = await call(RequestCode.GET_BROKER_CONFIG)
        assert r.code == 0 and "brokerName=broker-a" in r.body_bytes().decode()
        n.cancel_scope.cancel()


async def test_slave_refuses_topic_changes_and_sends(tmp_path: Path) -> None:
    store = MessageStoreConfig(store_path_root_dir=tmp_path, broker_role="SLAVE")
    config = BrokerConfig(listen_port=0, broker_id=1, store=store)
    async with trio.open_nursery() as n, open_remoting_client() as c:
        b = await start(n, config)
        ext = {
            "topic": "AT",
            "defaultTopic": "TBW102",
            "readQueueNums": 3,
            "writeQueueNums": 3,
            "perm": 6,
            "topicFilterType": "SINGLE_TAG",
        }
        r = await c.invoke(
            b.addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
        )
        assert r.code == ResponseCode.SYSTEM_ERROR and "slave" in (r.remark or "")
        send = {
            "producerGroup": "pg",
            "topic": "TBW102",
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4,
            "queueId": 0,
            "sysFlag": 0,
            "bornTimestamp": "0",
            "flag": 0,
        }
        r = await c.invoke(b.addr, RemotingCommand.request(RequestCode.SEND_MESSAGE, send, b"x"))
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert r.ext_fields["MSG_REGION"] == "DefaultRegion"
        n.cancel_scope.cancel()


async def test_config_files_survive_restart(tmp_path: Path) -> None:
    config = cfg(tmp_path)
    for round_ in range(2):
        async with trio.open_nursery() as n, open_remoting_client() as c:
            b = await start(n, config)

            async def call(code, ext=None, body=b"", addr=b.addr):
                return await c.invoke(addr, RemotingCommand.request(code, ext, body))

            q = {"consumerGroup": "PG", "topic": "PT", "queueId": 1}
            if round_ == 0:
                ext = {
                    "topic": "PT",
                    "defaultTopic": "TBW102",
                    "readQueueNums": 2,
                    "writeQueueNums": 2,
                    "perm": 6,
                    "topicFilterType": "SINGLE_TAG",
                }
                assert (await call(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)).code == 0
                assert (
                    await call(RequestCode.UPDATE_CONSUMER_OFFSET, dict(q, commitOffset=42))
                ).code == 0
                group = {"groupName": "PG", "retryMaxTimes": 4}
                await call(
                    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                    None,
                    json.dumps(group).encode(),
                )
            else:
                ctl = b.controller
                pt = ctl.topic_config_manager.select_topic_config("PT")
                assert pt is not None and pt.readQueueNums == 2
                assert ctl.subscription_group_manager.table["PG"].retryMaxTimes == 4
                r = await call(RequestCode.QUERY_CONSUMER_OFFSET, q)
                assert r.code == 0 and r.ext_fields["offset"] == "42"
            n.cancel_scope.cancel()
    offsets = json.loads((tmp_path / "config" / "consumerOffset.json").read_text())
    assert offsets == {"offsetTable": {"PT@PG": {"1": 42}}}


async def test_corrupt_config_file_refuses_to_start(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir(parents=True)
    (tmp_path / "config" / "topics.json").write_text("{not json")
    try:
        async with trio.open_nursery() as n:
            await start(n, cfg(tmp_path))
    except BaseException as exc:
        from common.errors import unwrap_group

        err = unwrap_group(exc)
        assert isinstance(err, ValueError) and "topics.json" in str(err)
    else:
        raise AssertionError("broker started with a corrupt topics.json")
    # the file was not overwritten
    assert (tmp_path / "config" / "topics.json").read_text() == "{not json"


async def test_file_store_messages_and_offsets_survive_restart(tmp_path: Path) -> None:
    store = MessageStoreConfig(
        store_path_root_dir=tmp_path,
        mapped_file_size_commit_log=1024 * 1024,
        mapped_file_size_consume_queue=300 * 20,
    )
    config = BrokerConfig(listen_port=0, store=store)
    send = {
        "producerGroup": "pg",
        "topic": "FT",
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 2,
        "queueId": 0,
        "sysFlag": 0,
        "bornTimestamp": "0",
        "flag": 0,
    }
    pull = {
        "consumerGroup": "fg",
        "topic": "FT",
        "queueId": 0,
        "queueOffset": "0",
        "maxMsgNums": 32,
        "sysFlag": 5,
        "commitOffset": "1",
        "suspendTimeoutMillis": "0",
        "subscription": "*",
        "subVersion": "0",
    }
    for round_ in range(2):
        async with trio.open_nursery() as n, open_remoting_client() as c:
            b = await n.start(lambda task_status: run_broker(config, task_status=task_status))
            if round_ == 0:
                for body in (b"one", b"two"):
                    r = await c.invoke(
                        b.addr, RemotingCommand.request(RequestCode.SEND_MESSAGE, send, body)
                    )
                    assert r.code == 0
            r = await c.invoke(b.addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, pull))
            from common.message import decode_records

            assert r.code == 0
            assert [m.body for m in decode_records(r.body_bytes())] == [b"one", b"two"]
            if round_ == 1:
                q = {"consumerGroup": "fg", "topic": "FT", "queueId": 0}
                r = await c.invoke(
                    b.addr, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, q)
                )
                assert r.ext_fields["offset"] == "1"  # committed by the first round's pull
            n.cancel_scope.cancel()


async def test_topic_and_consume_stats_in_fastjson_shape(tmp_path: Path) -> None:
    import re

    async with trio.open_nursery() as n, open_remoting_client() as c:
        b = await start(n, cfg(tmp_path))

        async def call(code, ext=None, body=b""):
            return await c.invoke(b.addr, RemotingCommand.request(code, ext, body))

        ext = {
            "topic": "ST",
            "defaultTopic": "TBW102",
            "readQueueNums": 2,
            "writeQueueNums": 2,
            "perm": 6,
            "topicFilterType": "SINGLE_TAG",
        }
        assert (await call(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)).code == 0
        send = {
            "producerGroup": "pg",
            "topic": "ST",
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 2,
            "queueId": 1,
            "sysFlag": 0,
            "bornTimestamp": "0",
            "flag": 0,
        }
        for _ in range(3):
            assert (await call(RequestCode.SEND_MESSAGE, send, b"x")).code == 0
        await call(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "sg", "topic": "ST", "queueId": 1, "commitOffset": 2},
        )

        r = await call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "ST"})
        text = r.body_bytes().decode()
        # keys are MessageQueue objects, as fastjson writes Map<MessageQueue, TopicOffset>
        pairs = dict(re.findall(r'(\{"brokerName"[^}]*\}):(\{[^}]*\})', text))
        q1 = json.loads(pairs['{"brokerName":"broker-a","queueId":1,"topic":"ST"}'])
        assert q1["maxOffset"] == 3 and q1["minOffset"] == 0 and q1["lastUpdateTimestamp"] > 0
        q0 = json.loads(pairs['{"brokerName":"broker-a","queueId":0,"topic":"ST"}'])
        assert q0 == {"lastUpdateTimestamp": 0, "maxOffset": 0, "minOffset": 0}
        r = await call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "nope"})
        assert r.code == ResponseCode.TOPIC_NOT_EXIST

        r = await call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "sg"})
        text = r.body_bytes().decode()
        assert text.startswith('{"consumeTps":0.0,"offsetTable":{')
        pairs = dict(re.findall(r'(\{"brokerName"[^}]*\}):(\{[^}]*\})', text))
        q1 = json.loads(pairs['{"brokerName":"broker-a","queueId":1,"topic":"ST"}'])
        assert q1["brokerOffset"] == 3 and q1["consumerOffset"] == 2 and q1["lastTimestamp"] > 0

        # consumeTps: what the group pulled over the last minute (BrokerStatsManager GROUP_GET_NUMS)
        pull = {
            "consumerGroup": "sg",
            "topic": "ST",
            "queueId": 1,
            "queueOffset": 0,
            "maxMsgNums": 32,
            "sysFlag": 4,  # FLAG_SUBSCRIPTION: the subscription travels with the pull
            "commitOffset": 0,
            "suspendTimeoutMillis": 0,
            "subscription": "*",
            "subVersion": 0,
        }
        assert (await call(RequestCode.PULL_MESSAGE, pull)).code == 0
        r = await call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "sg"})
        assert json.loads(r.body_bytes().decode().split(',"offsetTable"')[0] + "}") == {
            "consumeTps": 3 / 60
        }
        n.cancel_scope.cancel()
