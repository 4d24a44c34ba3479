"""mqadmin's operations on the wire, as a 4.9 Java admin client sends them.

Each request is a raw RemotingCommand with the Java request header's field names
(``UpdateBrokerConfig`` has only a body, ``GetProducerConnectionListRequestHeader.producerGroup``,
...) against a broker on an ephemeral port; answers are checked field by field in the shapes
the Java tools parse (``ProducerConnection``, ``ProducerTableInfo``, ...).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.config import BrokerConfig
from broker.configuration import LIVE_KEYS, merge_properties, plan_update
from broker.service import BrokerHandle, run_broker
from broker.store import MessageStoreConfig, run_memory_store
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(30)

Call = Callable[..., Awaitable[RemotingCommand]]


@asynccontextmanager
async def broker(tmp_path: Path, **kw: Any) -> AsyncIterator[tuple[BrokerHandle, Call]]:
    config = BrokerConfig(
        listen_port=0, store=MessageStoreConfig(store_path_root_dir=tmp_path / "store"), **kw
    )
    async with trio.open_nursery() as n, open_remoting_client() as c:
        b: BrokerHandle = await n.start(
            lambda task_status: run_broker(
                config, store_factory=run_memory_store, task_status=task_status
            )
        )

        async def call(code: int, ext: dict[str, Any] | None = None, body: bytes = b"") -> Any:
            return await c.invoke(b.addr, RemotingCommand.request(code, ext, body))

        yield b, call
        n.cancel_scope.cancel()


def props(text: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.decode().splitlines() if "=" in line)


# --- broker config --------------------------------------------------------------------------


async def test_update_broker_config_live_key_persists_and_bumps_version(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("# ours\nbrokerName=broker-a\nlongPollingEnable=true\n")
    async with broker(tmp_path, broker_config_path=str(conf)) as (b, call):
        before = await call(RequestCode.GET_BROKER_CONFIG)
        v0 = json.loads(before.ext_fields["version"])
        assert props(before.body_bytes())["longPollingEnable"] == "true"

        r = await call(
            RequestCode.UPDATE_BROKER_CONFIG,
            None,
            b"longPollingEnable=false\nshortPollingTimeMills=500\n",
        )
        assert (r.code, r.remark) == (ResponseCode.SUCCESS, None)
        after = await call(RequestCode.GET_BROKER_CONFIG)
        v1 = json.loads(after.ext_fields["version"])
        assert v1["counter"] == v0["counter"] + 1
        p = props(after.body_bytes())
        assert p["longPollingEnable"] == "false" and p["shortPollingTimeMills"] == "500"
        # the live config is what the pull path reads
        assert b.controller.config.long_polling_enable is False
        # the file keeps its comment and order; the changed line is replaced in place
        assert conf.read_text() == (
            "# ours\nbrokerName=broker-a\nlongPollingEnable=false\nshortPollingTimeMills=500\n"
        )


async def test_what_get_broker_config_shows_can_be_set_back(tmp_path: Path) -> None:
    """GET_BROKER_CONFIG names each setting as UPDATE_BROKER_CONFIG takes it, in its unit."""
    async with broker(tmp_path) as (b, call):
        shown = props((await call(RequestCode.GET_BROKER_CONFIG)).body_bytes())
        assert shown["brokerName"] == "broker-a" and shown["brokerRole"] == "ASYNC_MASTER"
        assert shown["registerNameServerPeriod"] == "30000"  # milliseconds, as in broker.conf
        assert shown["mappedFileSizeCommitLog"] == str(1024**3)
        before = b.controller.config
        for key in sorted(LIVE_KEYS):
            r = await call(RequestCode.UPDATE_BROKER_CONFIG, None, f"{key}={shown[key]}".encode())
            assert (r.code, r.remark) == (ResponseCode.SUCCESS, None), key
        assert b.controller.config == before


async def test_broker_permission_update_is_live_and_re_registers(tmp_path: Path) -> None:
    async with broker(tmp_path) as (b, call):
        version = b.controller.topic_config_manager.data_version
        r = await call(RequestCode.UPDATE_BROKER_CONFIG, None, b"brokerPermission=4")
        assert r.code == ResponseCode.SUCCESS
        assert b.controller.config.broker_permission == 4
        assert b.controller.topic_config_manager.data_version.counter == version.counter + 1
        # a read-only broker refuses sends with NO_PERMISSION, as RocketMQ's wipeWritePerm
        send = {"a": "pg", "b": "T", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 0, "h": 0}
        r = await call(RequestCode.SEND_MESSAGE_V2, send, b"x")
        assert r.code == ResponseCode.NO_PERMISSION
        # written to the default path: <storePathRootDir>/config/broker.properties
        assert (tmp_path / "store/config/broker.properties").read_text() == "brokerPermission=4\n"


async def test_restart_only_key_is_written_and_named_in_the_remark(tmp_path: Path) -> None:
    async with broker(tmp_path) as (b, call):
        r = await call(RequestCode.UPDATE_BROKER_CONFIG, None, b"maxMessageSize=1024")
        assert r.code == ResponseCode.SUCCESS
        assert "takes effect after a restart: maxMessageSize" in (r.remark or "")
        assert b.controller.config.store.max_message_size == 4 * 1024 * 1024
        assert "maxMessageSize=1024" in (tmp_path / "store/config/broker.properties").read_text()


@pytest.mark.parametrize(
    ("body", "remark"),
    [
        (b"noSuchKey=1", "unknown broker config key noSuchKey"),
        (b"longPollingEnable=maybe", "bad value for longPollingEnable"),
        (b"brokerPermission=six", "bad value for brokerPermission"),
        (b"storePathRootDir=/tmp/evil", "storePathRootDir cannot be changed"),
        (b"\xff\xfe=1", "not UTF-8"),
        (b"".join(b"k%d=1\n" % i for i in range(600)), "too many properties"),
    ],
)
async def test_update_broker_config_refusals_change_nothing(
    tmp_path: Path, body: bytes, remark: str
) -> None:
    async with broker(tmp_path) as (b, call):
        before = b.controller.config
        # a good key next to the bad one is not applied either
        r = await call(RequestCode.UPDATE_BROKER_CONFIG, None, b"traceOn=false\n" + body)
        assert r.code == ResponseCode.SYSTEM_ERROR and remark in (r.remark or "")
        assert b.controller.config is before
        assert not (tmp_path / "store/config/broker.properties").exists()
        assert (await call(RequestCode.GET_BROKER_CONFIG)).code == ResponseCode.SUCCESS


async def test_update_broker_config_empty_body_is_a_no_op(tmp_path: Path) -> None:
    async with broker(tmp_path) as (_b, call):
        assert (await call(RequestCode.UPDATE_BROKER_CONFIG)).code == ResponseCode.SUCCESS
        r = await call(RequestCode.UPDATE_BROKER_CONFIG, None, b"# only a comment\n")
        assert r.code == ResponseCode.SYSTEM_ERROR and "holds no property" in (r.remark or "")


def test_merge_properties_replaces_last_and_appends() -> None:
    text = "a=1\n# a=9\nb : 2\na=3\n"
    assert merge_properties(text, {"a": "5", "c": "x"}) == "a=1\n# a=9\nb : 2\na=5\nc=x\n"
    assert merge_properties("", {"k": "v"}) == "k=v\n"


def test_plan_update_sorts_live_and_restart_keys() -> None:
    plan = plan_update(BrokerConfig(), "traceOn=false\nlistenPort=1234\n")
    assert plan.live == ("traceOn",) and plan.restart == ("listenPort",)
    assert plan.config.trace_on is False and plan.config.listen_port == 10911


# --- producers ------------------------------------------------------------------------------


def heartbeat(client_id: str, *producer_groups: str) -> bytes:
    return json.dumps(
        {
            "clientID": client_id,
            "producerDataSet": [{"groupName": g} for g in producer_groups],
            "consumerDataSet": [],
        }
    ).encode()


async def test_producer_connection_list_and_all_producer_info(tmp_path: Path) -> None:
    async with broker(tmp_path) as (_b, call):
        r = await call(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "PG"})
        assert r.code == ResponseCode.SYSTEM_ERROR
        assert r.remark == "the producer group[PG] not exist"
        r = await call(RequestCode.HEART_BEAT, None, heartbeat("10.0.0.1@p1", "PG", "PG2"))
        assert r.code == ResponseCode.SUCCESS

        r = await call(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "PG"})
        assert r.code == ResponseCode.SUCCESS
        (conn,) = json.loads(r.body_bytes())["connectionSet"]
        assert conn["clientId"] == "10.0.0.1@p1" and conn["clientAddr"].startswith("127.0.0.1:")
        assert (conn["language"], conn["version"]) == ("JAVA", 407)

        r = await call(RequestCode.GET_ALL_PRODUCER_INFO, {})
        data = json.loads(r.body_bytes())["data"]
        assert sorted(data) == ["PG", "PG2"]
        (info,) = data["PG"]
        assert info["clientId"] == "10.0.0.1@p1" and info["remoteIP"] == conn["clientAddr"]
        assert abs(info["lastUpdateTimestamp"] / 1000 - time.time()) < 60

        r = await call(RequestCode.GET_PRODUCER_CONNECTION_LIST, {})
        assert r.code == ResponseCode.SYSTEM_ERROR and "producerGroup" in (r.remark or "")


# --- stats, consume queue, cleaning --------------------------------------------------------


def send_v2(topic: str, queue_id: int, body: bytes) -> dict[str, Any]:
    return {"a": "pg", "b": topic, "c": "TBW102", "d": 2, "e": queue_id} | {
        "f": 0,
        "g": 0,
        "h": 0,
        "i": "TAGS\x01tagA\x02",
    }


def pull(group: str, topic: str, queue_id: int, offset: int) -> dict[str, Any]:
    return {
        "consumerGroup": group,
        "topic": topic,
        "queueId": queue_id,
        "queueOffset": offset,
        "maxMsgNums": 32,
        "sysFlag": 4,  # PullSysFlag.FLAG_SUBSCRIPTION: the subscription is in the header
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subscription": "*",
        "subVersion": 0,
    }


async def test_view_broker_stats_data_and_broker_consume_stats(tmp_path: Path) -> None:
    async with broker(tmp_path) as (b, call):
        for i in range(5):
            r = await call(RequestCode.SEND_MESSAGE_V2, send_v2("ST", 0, b"m%d" % i), b"m")
            assert r.code == ResponseCode.SUCCESS
        r = await call(RequestCode.PULL_MESSAGE, pull("SG", "ST", 0, 0))
        assert r.code == ResponseCode.SUCCESS
        r = await call(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "SG", "topic": "ST", "queueId": 0, "commitOffset": 3},
        )
        assert r.code == ResponseCode.SUCCESS

        r = await call(
            RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS", "statsKey": "ST"}
        )
        assert r.code == ResponseCode.SUCCESS
        data = json.loads(r.body_bytes())
        assert data["statsMinute"] == {"sum": 5, "tps": 5 / 60, "avgpt": 1.0}
        assert data["statsDay"]["sum"] == 5
        r = await call(
            RequestCode.VIEW_BROKER_STATS_DATA,
            {"statsName": "GROUP_GET_NUMS", "statsKey": "ST@SG"},
        )
        assert json.loads(r.body_bytes())["statsMinute"]["sum"] == 5
        r = await call(
            RequestCode.VIEW_BROKER_STATS_DATA,
            {"statsName": "BROKER_PUT_NUMS", "statsKey": "DefaultCluster"},
        )
        assert json.loads(r.body_bytes())["statsHour"]["sum"] == 5
        r = await call(
            RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS", "statsKey": "no"}
        )
        assert (r.code, r.remark) == (
            ResponseCode.SYSTEM_ERROR,
            "The stats <TOPIC_PUT_NUMS> <no> not exist",
        )
        r = await call(RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS"})
        assert r.code == ResponseCode.SYSTEM_ERROR and "statsKey" in (r.remark or "")

        r = await call(RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": "false"})
        assert r.code == ResponseCode.SUCCESS
        text = r.body_bytes().decode()
        assert text.startswith('{"brokerAddr":"' + b.addr + '"') and text.endswith('"totalDiff":2}')
        assert '{"SG":[{"consumeTps":' in text and '"consumerOffset":3' in text
        r = await call(RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": "true"})
        assert '"SG":[]' in r.body_bytes().decode()
        r = await call(RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": "perhaps"})
        assert r.code == ResponseCode.SYSTEM_ERROR


async def test_query_consume_queue(tmp_path: Path) -> None:
    async with broker(tmp_path) as (_b, call):
        for i in range(3):
            await call(RequestCode.SEND_MESSAGE_V2, send_v2("QT", 1, b""), b"body%d" % i)
        ext = {"topic": "QT", "queueId": 1, "index": 1, "count": 10}
        r = await call(RequestCode.QUERY_CONSUME_QUEUE, ext)
        assert r.code == ResponseCode.SUCCESS
        body = json.loads(r.body_bytes())
        assert (body["minQueueIndex"], body["maxQueueIndex"]) == (0, 3)
        units = body["queueData"]
        assert len(units) == 2 and units[0]["physicOffset"] < units[1]["physicOffset"]
        assert all(u["physicSize"] > 0 for u in units)
        from common.message import tags_code

        assert {u["tagsCode"] for u in units} == {tags_code("tagA")}

        r = await call(RequestCode.QUERY_CONSUME_QUEUE, dict(ext, consumerGroup="nobody"))
        assert json.loads(r.body_bytes())["filterData"] == "nobody@QT is not online!"
        r = await call(RequestCode.QUERY_CONSUME_QUEUE, dict(ext, index=99))
        assert r.code == ResponseCode.SUCCESS and r.remark == "Index 99 of 1@QT is not exist!"
        r = await call(RequestCode.QUERY_CONSUME_QUEUE, dict(ext, topic="Nope"))
        assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "1@Nope is not exist!")
        r = await call(RequestCode.QUERY_CONSUME_QUEUE, dict(ext, count=2**62))
        assert len(json.loads(r.body_bytes())["queueData"]) == 2
        r = await call(RequestCode.QUERY_CONSUME_QUEUE, dict(ext, queueId="x"))
        assert r.code == ResponseCode.SYSTEM_ERROR
        for odd in ({"queueId": -1}, {"index": -5}, {"count": -1}, {"index": 2**63 - 1}):
            r = await call(RequestCode.QUERY_CONSUME_QUEUE, dict(ext, **odd))
            assert r.code in (ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR), odd
            assert r.code == ResponseCode.SYSTEM_ERROR or "queueData" not in json.loads(
                r.body_bytes()
            ), odd


async def test_clean_unused_topic_and_expired_consume_queue(tmp_path: Path) -> None:
    async with broker(tmp_path) as (b, call):
        await call(RequestCode.SEND_MESSAGE_V2, send_v2("Keep", 0, b""), b"x")
        await call(RequestCode.SEND_MESSAGE_V2, send_v2("Gone", 0, b""), b"x")
        # the topic left the table, its queues did not (what cleanUnusedTopic is for)
        b.controller.topic_config_manager.delete_topic_config("Gone")
        assert "Gone" in b.store.topic_queues()
        assert (await call(RequestCode.CLEAN_UNUSED_TOPIC)).code == ResponseCode.SUCCESS
        assert "Gone" not in b.store.topic_queues() and "Keep" in b.store.topic_queues()
        # nothing expired yet: every queue stays
        assert (await call(RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE)).code == ResponseCode.SUCCESS
        assert "Keep" in b.store.topic_queues()


# --- ACL admin ------------------------------------------------------------------------------

ACL_FILE = """\
globalWhiteRemoteAddresses: []
accounts:
  - accessKey: adminKey1
    secretKey: adminSecret1
    whiteRemoteAddress: 127.0.0.1
    admin: true
"""


async def test_acl_admin_updates_deletes_and_white_list(tmp_path: Path) -> None:
    import yaml

    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL_FILE)
    async with broker(tmp_path, acl_enable=True, acl_file=str(acl_file)) as (b, call):
        me = {"AccessKey": "adminKey1"}
        r = await call(RequestCode.GET_BROKER_CLUSTER_ACL_INFO, me)
        assert r.code == ResponseCode.SUCCESS
        v0 = json.loads(r.ext_fields["version"])
        assert r.ext_fields["brokerName"] == "broker-a" and r.ext_fields["brokerAddr"] == b.addr
        assert str(acl_file) in json.loads(r.ext_fields["allAclFileVersion"])

        create = me | {
            "accessKey": "newUser1",
            "secretKey": "newSecret1",
            "defaultTopicPerm": "DENY",
            "topicPerms": "T1=PUB,T2=SUB",
            "admin": "false",
        }
        r = await call(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, create)
        assert (r.code, r.remark) == (ResponseCode.SUCCESS, None)
        acl = b.controller.acl
        assert acl is not None and "newUser1" in acl.config.accounts
        doc = yaml.safe_load(acl_file.read_text())
        (user,) = [a for a in doc["accounts"] if a["accessKey"] == "newUser1"]
        assert user["topicPerms"] == ["T1=PUB", "T2=SUB"] and user["admin"] is False
        # an update keeps what it does not name
        r = await call(
            RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,
            me | {"accessKey": "newUser1", "whiteRemoteAddress": "10.0.0.*"},
        )
        assert r.code == ResponseCode.SUCCESS
        doc = yaml.safe_load(acl_file.read_text())
        (user,) = [a for a in doc["accounts"] if a["accessKey"] == "newUser1"]
        assert user["secretKey"] == "newSecret1" and user["whiteRemoteAddress"] == "10.0.0.*"
        r = await call(RequestCode.GET_BROKER_CLUSTER_ACL_INFO, me)
        assert json.loads(r.ext_fields["version"])["counter"] == v0["counter"] + 2

        # refused edits leave the file alone
        before = acl_file.read_text()
        r = await call(
            RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, me | {"accessKey": "short", "secretKey": "x"}
        )
        assert r.code == ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED
        assert "longer than 6" in (r.remark or "")
        r = await call(
            RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,
            me | {"accessKey": "otherUser", "secretKey": "otherSecret", "whiteRemoteAddress": "x"},
        )
        assert r.code == ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED
        r = await call(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, me)
        assert r.code == ResponseCode.SYSTEM_ERROR and "accessKey" in (r.remark or "")
        r = await call(RequestCode.DELETE_ACL_CONFIG, me | {"accessKey": "nobody12"})
        assert r.code == ResponseCode.DELETE_ACL_CONFIG_FAILED
        assert acl_file.read_text() == before

        r = await call(RequestCode.DELETE_ACL_CONFIG, me | {"accessKey": "newUser1"})
        assert r.code == ResponseCode.SUCCESS and "newUser1" not in acl.config.accounts

        white = me | {"globalWhiteAddrs": "10.1.1.*,192.168.0.1"}
        r = await call(
            RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, white | {"aclFileFullPath": "/etc/x"}
        )
        assert r.code == ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED
        r = await call(RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, white)
        assert r.code == ResponseCode.SUCCESS
        doc = yaml.safe_load(acl_file.read_text())
        assert doc["globalWhiteRemoteAddresses"] == ["10.1.1.*", "192.168.0.1"]
        r = await call(RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, me)
        assert json.loads(r.body_bytes())["globalWhiteAddrs"] == ["10.1.1.*", "192.168.0.1"]
        # a bad address rule is refused, not written
        r = await call(
            RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, me | {"globalWhiteAddrs": "1.2.3.x/"}
        )
        assert r.code == ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED
        # without the account's AccessKey nothing passes the guard
        r = await call(RequestCode.DELETE_ACL_CONFIG, {"accessKey": "adminKey1"})
        assert r.code == ResponseCode.NO_PERMISSION


async def test_acl_admin_without_acl_enabled(tmp_path: Path) -> None:
    async with broker(tmp_path) as (_b, call):
        r = await call(
            RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,
            {"accessKey": "newUser1", "secretKey": "s" * 8},
        )
        assert r.code == ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED
        assert "aclEnable=false" in (r.remark or "")
        r = await call(RequestCode.DELETE_ACL_CONFIG, {"accessKey": "newUser1"})
        assert r.code == ResponseCode.DELETE_ACL_CONFIG_FAILED
        r = await call(RequestCode.GET_BROKER_CLUSTER_ACL_INFO)
        assert r.code == ResponseCode.SYSTEM_ERROR
