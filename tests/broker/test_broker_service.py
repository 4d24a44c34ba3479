"""Processors driven through a real RemotingClient against run_broker (memory store, port 0)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from broker.config import BrokerConfig
from broker.service import BrokerHandle, run_broker
from broker.store import DefaultMessageStore, MessageStoreConfig, run_memory_store
from common.batch_body import encode_batch_body
from common.message import decode_records
from common.message_properties import MessageConst, encode_properties
from common.remoting.channel import Channel
from common.remoting.client import RemotingClient, open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import Body, RemotingCommand
from common.string_hash import java_string_hash


@attrs.define
class Env:
    broker: BrokerHandle
    client: RemotingClient

    @property
    def addr(self) -> str:
        return self.broker.addr

    async def call(
        self, code: int, ext: Mapping[str, object] | None = None, body: Body = b"", **kw: Any
    ) -> RemotingCommand:
        cmd = RemotingCommand.request(code, ext, body)
        for k, v in kw.items():
            setattr(cmd, k, v)
        return await self.client.invoke(self.addr, cmd, timeout=kw.pop("timeout", 20.0))

    async def send(
        self,
        topic: str,
        body: bytes,
        queue_id: int = 0,
        tags: str | None = None,
        props: dict | None = None,
        v2: bool = False,
    ) -> RemotingCommand:
        p = {"WAIT": "true", "UNIQ_KEY": f"U{body.hex()}"}
        if tags:
            p["TAGS"] = tags
        p.update(props or {})
        if v2:
            ext = {
                "a": "pg",
                "b": topic,
                "c": "TBW102",
                "d": 4,
                "e": queue_id,
                "f": 0,
                "g": 1700000000000,
                "h": 0,
                "i": encode_properties(p),
                "j": 0,
                "k": False,
            }
            return await self.call(RequestCode.SEND_MESSAGE_V2, ext, body)
        ext = {
            "producerGroup": "pg",
            "topic": topic,
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4,
            "queueId": queue_id,
            "sysFlag": 0,
            "bornTimestamp": "1700000000000",
            "flag": 0,
            "properties": encode_properties(p),
            "reconsumeTimes": "0",
            "unitMode": "0",
            "batch": "0",
        }
        return await self.call(RequestCode.SEND_MESSAGE, ext, body)

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        group: str = "cg",
        sys_flag: int = 4,
        suspend_ms: int = 0,
        sub: str = "*",
        max_nums: int = 32,
        commit: int = -1,
        timeout: float = 20.0,
    ) -> RemotingCommand:
        ext = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": str(offset),
            "maxMsgNums": max_nums,
            "sysFlag": sys_flag,
            "commitOffset": str(commit),
            "suspendTimeoutMillis": str(suspend_ms),
            "subscription": sub,
            "subVersion": "0",
        }
        return await self.client.invoke(
            self.addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, ext), timeout=timeout
        )


def broker_config(tmp_path: Path, **kw: Any) -> BrokerConfig:
    # small files keep the file store quick to create in tmp_path
    store = MessageStoreConfig(
        store_path_root_dir=tmp_path / "store",
        mapped_file_size_commit_log=64 * 1024 * 1024,
        mapped_file_size_consume_queue=300 * 20,
    )
    return BrokerConfig(listen_port=0, store=store, **kw)


@pytest.fixture(params=["memory", "file"])
async def env(
    request: pytest.FixtureRequest, tmp_path: Path, nursery: trio.Nursery
) -> AsyncIterator[Env]:
    # The same checks against the in-memory store and the file store (run_broker's default).
    factory = run_memory_store if request.param == "memory" else None
    handle = await nursery.start(
        lambda task_status: run_broker(
            broker_config(tmp_path), store_factory=factory, task_status=task_status
        )
    )
    async with open_remoting_client() as client:
        yield Env(handle, client)


async def test_send_auto_creates_topic_and_pull_returns_records(env: Env) -> None:
    r = await env.send("NewTopic", b"hello", queue_id=1)
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert r.ext_fields["MSG_REGION"] == "DefaultRegion"
    assert r.ext_fields["TRACE_ON"] == "true"
    assert r.ext_fields["queueId"] == "1" and r.ext_fields["queueOffset"] == "0"
    assert len(r.ext_fields["msgId"]) == 32
    tc = env.broker.controller.topic_config_manager.select_topic_config("NewTopic")
    assert tc is not None and tc.writeQueueNums == 4 and tc.perm == 6
    r2 = await env.send("NewTopic", b"world", queue_id=1, v2=True)
    assert r2.code == 0 and r2.ext_fields["queueOffset"] == "1"

    p = await env.pull("NewTopic", 1, 0)
    assert p.code == ResponseCode.SUCCESS
    assert p.ext_fields["nextBeginOffset"] == "2"
    assert p.ext_fields["minOffset"] == "0" and p.ext_fields["maxOffset"] == "2"
    assert p.ext_fields["suggestWhichBrokerId"] == "0"
    msgs = decode_records(p.body_bytes())
    assert [m.body for m in msgs] == [b"hello", b"world"]
    m = msgs[0]
    assert m.properties[MessageConst.CLUSTER] == "DefaultCluster"
    assert MessageConst.WAIT not in m.properties  # stripped from the stored string
    assert m.store_host == ("127.0.0.1", env.broker.port)


async def test_send_checks(env: Env) -> None:
    r = await env.send("bad topic!", b"x")
    assert r.code == ResponseCode.SYSTEM_ERROR
    r = await env.send("T1", b"x", queue_id=99)
    assert r.code == ResponseCode.SYSTEM_ERROR and "queueId" in (r.remark or "")
    r = await env.send("T1", b"x", queue_id=-1)
    assert r.code == 0 and 0 <= int(r.ext_fields["queueId"]) < 4
    r = await env.call(RequestCode.SEND_MESSAGE, {"producerGroup": "pg"}, b"x")
    assert r.code == ResponseCode.SYSTEM_ERROR and "topic" in (r.remark or "")
    big = b"x" * (4 * 1024 * 1024 + 1)
    r = await env.send("T1", big)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL
    # default topic without INHERIT -> 17
    ext = {
        "producerGroup": "pg",
        "topic": "T2",
        "defaultTopic": "SELF_TEST_TOPIC",
        "defaultTopicQueueNums": 4,
        "queueId": 0,
        "sysFlag": 0,
        "bornTimestamp": "0",
        "flag": 0,
    }
    r = await env.call(RequestCode.SEND_MESSAGE, ext, b"x")
    assert r.code == ResponseCode.TOPIC_NOT_EXIST
    # the broker is still up
    assert (await env.send("T1", b"ok")).code == 0


async def test_unknown_code_is_not_supported(env: Env) -> None:
    r = await env.call(9999)
    assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


async def test_batch_send(env: Env) -> None:
    body = encode_batch_body([(0, b"a", {"UNIQ_KEY": "1"}), (0, b"b", {"UNIQ_KEY": "2"})])
    ext = {
        "a": "pg",
        "b": "BT",
        "c": "TBW102",
        "d": 4,
        "e": 0,
        "f": 0,
        "g": 0,
        "h": 0,
        "i": encode_properties({"WAIT": "true"}),
        "m": True,
    }
    r = await env.call(RequestCode.SEND_BATCH_MESSAGE, ext, body)
    assert r.code == 0, r.remark
    assert len(r.ext_fields["msgId"].split(",")) == 2
    p = await env.pull("BT", 0, 0)
    got = decode_records(p.body_bytes())
    assert [m.body for m in got] == [b"a", b"b"]
    # stored as Java's MessageExtBatchEncoder does: the message's own string, a separator, then
    # the batch's properties with CLUSTER (WAIT kept: only single sends drop it)
    batch = encode_properties({"WAIT": "true", MessageConst.CLUSTER: "DefaultCluster"})
    records = p.body_bytes()
    for k in ("1", "2"):
        stored = (encode_properties({"UNIQ_KEY": k}) + "\x02" + batch).encode()
        # a record ends with PROPERTIESLENGTH (short) and the properties
        assert len(stored).to_bytes(2, "big") + stored in records
    assert got[1].properties == {
        "UNIQ_KEY": "2",
        "WAIT": "true",
        MessageConst.CLUSTER: "DefaultCluster",
    }


async def test_pull_codes(env: Env) -> None:
    p = await env.pull("Nope", 0, 0)
    assert p.code == ResponseCode.TOPIC_NOT_EXIST
    await env.send("PT", b"x")
    p = await env.pull("PT", 9, 0)
    assert p.code == ResponseCode.SYSTEM_ERROR
    p = await env.pull("PT", 0, 1)  # at the end: not found, header complete
    assert p.code == ResponseCode.PULL_NOT_FOUND
    assert {k: p.ext_fields[k] for k in ("nextBeginOffset", "minOffset", "maxOffset")} == {
        "nextBeginOffset": "1",
        "minOffset": "0",
        "maxOffset": "1",
    }
    assert "suggestWhichBrokerId" in p.ext_fields
    p = await env.pull("PT", 0, 50)
    # Java: past the end with minOffset 0 -> back to 0
    assert p.code == ResponseCode.PULL_OFFSET_MOVED and p.ext_fields["nextBeginOffset"] == "0"
    # subscription from heartbeat required when the SUBSCRIPTION flag is absent
    p = await env.pull("PT", 0, 0, sys_flag=0)
    assert p.code == ResponseCode.SUBSCRIPTION_NOT_EXIST


async def test_pull_tag_filter(env: Env) -> None:
    await env.send("TagT", b"a", tags="A")
    await env.send("TagT", b"b", tags="B")
    await env.send("TagT", b"a2", tags="A")
    p = await env.pull("TagT", 0, 0, sub="A")
    assert p.code == 0
    assert [m.body for m in decode_records(p.body_bytes())] == [b"a", b"a2"]
    assert p.ext_fields["nextBeginOffset"] == "3"
    assert java_string_hash("A") != java_string_hash("B")


async def test_long_poll_woken_by_send(env: Env) -> None:
    await env.send("LP", b"first")
    got: dict[str, Any] = {}

    async def poller() -> None:
        t0 = trio.current_time()
        got["resp"] = await env.pull("LP", 0, 1, sys_flag=6, suspend_ms=15000)
        got["took"] = trio.current_time() - t0

    async with trio.open_nursery() as n:
        n.start_soon(poller)
        await trio.sleep(0.3)
        assert "resp" not in got  # parked
        assert env.broker.controller.pull_hold.waiting_count("LP", 0) == 1
        await env.send("LP", b"second")
    assert got["resp"].code == 0
    assert [m.body for m in decode_records(got["resp"].body_bytes())] == [b"second"]
    assert got["took"] < 5


async def test_long_poll_times_out_with_not_found(env: Env) -> None:
    await env.send("LP2", b"x")
    t0 = trio.current_time()
    p = await env.pull("LP2", 0, 1, sys_flag=6, suspend_ms=300)
    assert p.code == ResponseCode.PULL_NOT_FOUND
    assert p.ext_fields["nextBeginOffset"] == "1"
    assert 0.25 <= trio.current_time() - t0 < 5


async def test_offsets(env: Env) -> None:
    await env.send("OT", b"x")
    await env.send("OT", b"y")
    r = await env.call(
        RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g1", "topic": "OT", "queueId": 0}
    )
    assert r.code == 0 and r.ext_fields["offset"] == "0"  # min offset 0: start at 0
    r = await env.call(
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": "g1", "topic": "OT", "queueId": 0, "commitOffset": "2"},
    )
    assert r.code == 0
    r = await env.call(
        RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g1", "topic": "OT", "queueId": 0}
    )
    assert r.ext_fields["offset"] == "2"
    # commit through pull (COMMIT_OFFSET flag)
    await env.pull("OT", 0, 0, group="g2", sys_flag=5, commit=1)
    assert env.broker.controller.consumer_offset_manager.query_offset("g2", "OT", 0) == 1
    r = await env.call(RequestCode.GET_MAX_OFFSET, {"topic": "OT", "queueId": 0})
    assert r.ext_fields["offset"] == "2"
    r = await env.call(RequestCode.GET_MIN_OFFSET, {"topic": "OT", "queueId": 0})
    assert r.ext_fields["offset"] == "0"
    r = await env.call(RequestCode.GET_EARLIEST_MSG_STORETIME, {"topic": "OT", "queueId": 0})
    assert int(r.ext_fields["timestamp"]) > 0
    r = await env.call(
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "OT", "queueId": 0, "timestamp": "0"}
    )
    assert r.ext_fields["offset"] == "0"
    r = await env.call(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g1"})
    assert r.code == ResponseCode.SYSTEM_ERROR  # missing header field


async def test_view_and_query_message(env: Env) -> None:
    r = await env.send("VT", b"body", props={"KEYS": "k1"})
    from common.message_id import decode_offset_msg_id

    _, phys = decode_offset_msg_id(r.ext_fields["msgId"])
    v = await env.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": phys})
    assert v.code == 0 and decode_records(v.body_bytes())[0].body == b"body"
    v = await env.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": 10**9})
    assert v.code == ResponseCode.SYSTEM_ERROR
    q = await env.call(
        RequestCode.QUERY_MESSAGE,
        {"topic": "VT", "key": "k1", "maxNum": 10, "beginTimestamp": 0, "endTimestamp": 2**62},
    )
    assert q.code == 0 and decode_records(q.body_bytes())[0].body == b"body"
    q = await env.call(
        RequestCode.QUERY_MESSAGE,
        {"topic": "VT", "key": "zz", "maxNum": 10, "beginTimestamp": 0, "endTimestamp": 2**62},
    )
    assert q.code == ResponseCode.QUERY_NOT_FOUND


def heartbeat_body(client_id: str, group: str, topics: list[str], cpp: bool = False) -> bytes:
    if cpp:  # the C++ client: enums as ints, subVersion as string, no producerDataSet
        cpp_subs = [{"subString": "*", "subVersion": "1795313758651", "topic": t} for t in topics]
        return json.dumps(
            {
                "clientID": client_id,
                "consumerDataSet": [
                    {
                        "consumeFromWhere": 0,
                        "consumeType": 1,
                        "groupName": group,
                        "messageModel": 1,
                        "subscriptionDataSet": cpp_subs,
                    }
                ],
            }
        ).encode()
    subs: list[dict[str, object]] = [
        {
            "classFilterMode": False,
            "codeSet": [],
            "expressionType": "TAG",
            "subString": "*",
            "subVersion": 1,
            "tagsSet": [],
            "topic": t,
        }
        for t in topics
    ]
    return json.dumps(
        {
            "clientID": client_id,
            "consumerDataSet": [
                {
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                    "consumeType": "CONSUME_PASSIVELY",
                    "groupName": group,
                    "messageModel": "CLUSTERING",
                    "subscriptionDataSet": subs,
                    "unitMode": False,
                }
            ],
            "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}],
        }
    ).encode()


async def test_heartbeat_consumer_list_and_unregister(env: Env) -> None:
    r = await env.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"})
    assert r.code == ResponseCode.SYSTEM_ERROR and r.remark == "no consumer for this group, G"
    r = await env.call(
        RequestCode.HEART_BEAT,
        None,
        heartbeat_body("c1@1", "G", ["HT"], cpp=True),
        language="CPP",
        version=63,
    )
    assert r.code == 0 and r.version == 407
    tcm = env.broker.controller.topic_config_manager
    retry = tcm.select_topic_config("%RETRY%G")
    assert retry is not None and retry.perm == 6
    r = await env.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"})
    assert r.code == 0 and json.loads(r.body_bytes()) == {"consumerIdList": ["c1@1"]}
    # pull without SUBSCRIPTION flag now finds the heartbeat subscription
    await env.send("HT", b"x")
    p = await env.pull("HT", 0, 0, group="G", sys_flag=0)
    assert p.code == 0
    r = await env.call(RequestCode.UNREGISTER_CLIENT, {"clientID": "c1@1", "consumerGroup": "G"})
    assert r.code == 0
    r = await env.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"})
    assert r.code == ResponseCode.SYSTEM_ERROR
    r = await env.call(RequestCode.HEART_BEAT, None, b"{broken")
    assert r.code == ResponseCode.SYSTEM_ERROR


async def test_notify_consumer_ids_changed_and_close(env: Env, tmp_path: Path) -> None:
    notified = trio.Event()
    seen = []

    async def on_request(cmd: RemotingCommand, channel: Channel) -> None:
        seen.append((cmd.code, cmd.ext_fields.get("consumerGroup")))
        notified.set()

    async with open_remoting_client() as c1, open_remoting_client() as c2:
        c1.set_request_handler(on_request)
        body = heartbeat_body("A", "NG", ["T"])
        await c1.invoke(env.addr, RemotingCommand.request(RequestCode.HEART_BEAT, None, body))
        with trio.fail_after(5):
            await notified.wait()  # A is told about itself joining
        notified = trio.Event()
        await c2.invoke(
            env.addr,
            RemotingCommand.request(RequestCode.HEART_BEAT, None, heartbeat_body("B", "NG", ["T"])),
        )
        with trio.fail_after(5):
            await notified.wait()
        assert (RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, "NG") in seen
        r = await env.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "NG"})
        assert sorted(json.loads(r.body_bytes())["consumerIdList"]) == ["A", "B"]
        notified = trio.Event()
        c2.close()
        with trio.fail_after(5):
            await notified.wait()  # A is told B left
        r = await env.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "NG"})
        assert json.loads(r.body_bytes())["consumerIdList"] == ["A"]


async def test_lock_unlock(env: Env) -> None:
    mq = {"topic": "T", "brokerName": "broker-a", "queueId": 0}
    body = json.dumps({"consumerGroup": "og", "clientId": "A", "mqSet": [mq]}).encode()
    r = await env.call(RequestCode.LOCK_BATCH_MQ, None, body)
    assert r.code == 0 and json.loads(r.body_bytes())["lockOKMQSet"] == [mq]
    other = json.dumps({"consumerGroup": "og", "clientId": "B", "mqSet": [mq]}).encode()
    r = await env.call(RequestCode.LOCK_BATCH_MQ, None, other)
    assert json.loads(r.body_bytes())["lockOKMQSet"] == []
    assert (await env.call(RequestCode.UNLOCK_BATCH_MQ, None, body)).code == 0
    r = await env.call(RequestCode.LOCK_BATCH_MQ, None, other)
    assert json.loads(r.body_bytes())["lockOKMQSet"] == [mq]


async def test_send_that_auto_creates_a_topic_is_answered_once_its_config_is_on_disk(
    env: Env,
) -> None:
    # topics.json is written off the event loop (common/config_file.py WriteBehind); a send
    # must not be acknowledged for a topic a restart would not know
    import threading

    from common.config_file import atomic_write

    gate = threading.Event()
    writer = env.broker.controller.config_writer

    def slow_write(path: Path, data: bytes) -> None:
        gate.wait(10)
        atomic_write(path, data)

    writer.write = slow_write
    topics_json = env.broker.controller.topics_path
    answers: list[RemotingCommand] = []
    async with trio.open_nursery() as n:

        async def send() -> None:
            answers.append(await env.send("Fresh", b"x"))

        n.start_soon(send)
        await trio.sleep(0.3)
        assert answers == []  # appended, but topics.json does not have it yet
        # the event loop is free: other requests are answered meanwhile
        with trio.fail_after(2):
            info = await env.call(RequestCode.GET_BROKER_RUNTIME_INFO)
        assert info.code == ResponseCode.SUCCESS
        assert answers == []
        gate.set()
    assert answers[0].code == ResponseCode.SUCCESS, answers[0].remark
    assert "Fresh" in json.loads(topics_json.read_text())["topicConfigTable"]


@pytest.mark.parametrize("env", ["file"], indirect=True)  # the memory store has no disk
async def test_a_refused_send_is_answered_at_once_while_a_config_write_waits(env: Env) -> None:
    """On a full disk a group or topic file may wait for room: a put refused for the disk is
    answered SERVICE_NOT_AVAILABLE at once, not after syncFlushTimeout."""
    import threading

    from broker.store.clean_service import refuse_puts

    store = env.broker.controller.store
    assert isinstance(store, DefaultMessageStore)
    gate = threading.Event()
    writer = env.broker.controller.config_writer

    def stuck_write(path: Path, data: bytes) -> None:
        gate.wait(10)

    writer.write = stuck_write
    try:
        env.broker.controller.subscription_group_manager.find_subscription_group_config("NewG")
        assert env.broker.controller.config_pending()
        refuse_puts(store.flags, store.config, "a test")
        with trio.fail_after(2):
            r = await env.send("T", b"x")
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and "disk is full" in (r.remark or "")
    finally:
        gate.set()
