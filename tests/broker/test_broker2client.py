"""Broker2Client on the wire, as RocketMQ 4.9's Java admin and clients speak it: raw
INVOKE_BROKER_TO_RESET_OFFSET (222), INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223),
GET_CONSUMER_RUNNING_INFO (307) and CONSUME_MESSAGE_DIRECTLY (309) frames from an admin
connection, and fake member connections (a Java one and a C++ one) that receive
RESET_CONSUMER_CLIENT_OFFSET (220) and answer GET_CONSUMER_STATUS_FROM_CLIENT (221), 307, 309."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

import broker.broker2client as b2c
from broker.service import run_broker
from broker.store import run_memory_store
from common.message import decode_record, decode_records
from common.model import MessageQueue
from common.mq_map import encode_mq_map
from common.remoting.channel import Channel
from common.remoting.client import RemotingClient, open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.reset_offset_body import decode_consumer_table, decode_offset_table
from tests.broker.test_broker_service import Env, broker_config, heartbeat_body

pytestmark = pytest.mark.timeout(60)

T, G = "RT", "RG"


@pytest.fixture
async def env(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Env]:
    handle = await nursery.start(
        lambda task_status: run_broker(
            broker_config(tmp_path), store_factory=run_memory_store, task_status=task_status
        )
    )
    async with open_remoting_client() as client:
        yield Env(handle, client)


def mq(q: int) -> MessageQueue:
    return MessageQueue(T, "broker-a", q)


async def store_times(env: Env, n: int) -> list[int]:
    """Send `n` messages to queue 0 of T (4 queues); their store timestamps."""
    for i in range(n):
        r = await env.send(T, f"m{i}".encode(), queue_id=0)
        assert r.code == 0, r.remark
        await trio.sleep(0.005)  # distinct store times
    p = await env.pull(T, 0, 0, group="probe")
    return [m.store_timestamp for m in decode_records(p.body_bytes())]


async def commit(env: Env, offsets: dict[int, int], group: str = G) -> None:
    for q, off in offsets.items():
        r = await env.call(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": group, "topic": T, "queueId": q, "commitOffset": off},
        )
        assert r.code == 0


class Member:
    """A fake client connection of group G: records what the broker pushes, answers 221/307/309."""

    def __init__(self, client: RemotingClient, client_id: str, language: str) -> None:
        self.client, self.client_id, self.language = client, client_id, language
        self.pushed: list[RemotingCommand] = []
        self.got = trio.Event()
        self.answer_307 = True
        client.set_request_handler(self.handle)

    async def join(self, env: Env) -> None:
        cmd = RemotingCommand.request(
            RequestCode.HEART_BEAT,
            None,
            heartbeat_body(self.client_id, G, [T], cpp=self.language == "CPP"),
        )
        cmd.language = self.language
        r = await self.client.invoke(env.addr, cmd, timeout=5)
        assert r.code == 0

    async def handle(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand | None:
        self.pushed.append(cmd)
        self.got.set()
        if cmd.code == RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT:
            table = encode_mq_map([(mq(0), 7 if self.language == "JAVA" else 8)])
            return cmd.response(body=b'{"messageQueueTable":' + table + b"}")
        if cmd.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            if not self.answer_307:
                await trio.sleep_forever()
            body = b'{"properties":{"PROP_CONSUME_TYPE":"CONSUME_PASSIVELY"},"mqTable":{'
            body += b'{"brokerName":"broker-a","queueId":0,"topic":"RT"}:{"commitOffset":3}}}'
            return cmd.response(body=body, ext_fields={"from": self.client_id})
        if cmd.code == RequestCode.CONSUME_MESSAGE_DIRECTLY:
            msg = decode_record(cmd.body_bytes())
            result = {"consumeResult": "CR_SUCCESS", "remark": msg.body.decode()}
            return cmd.response(body=json.dumps(result).encode())
        return None

    async def wait_pushed(self, code: int) -> RemotingCommand:
        with trio.fail_after(5):
            while True:
                for cmd in self.pushed:
                    if cmd.code == code:
                        return cmd
                self.got = trio.Event()
                await self.got.wait()


async def reset(env: Env, timestamp: int, force: bool = True, **ext: object) -> RemotingCommand:
    fields = {"topic": T, "group": G, "timestamp": timestamp, "isForce": force} | ext
    return await env.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields)


async def test_reset_by_time_answers_the_table_and_pushes_220_in_each_members_form(
    env: Env,
) -> None:
    times = await store_times(env, 4)
    await commit(env, {0: 4, 1: 0, 2: 0, 3: 0})
    async with open_remoting_client() as jc, open_remoting_client() as cc:
        java, cpp = Member(jc, "10.0.0.1@java", "JAVA"), Member(cc, "10.0.0.2@cpp", "CPP")
        await java.join(env)
        await cpp.join(env)
        r = await reset(env, times[1])
        assert r.code == ResponseCode.SUCCESS, r.remark
        # fastjson's Map<MessageQueue, Long>: object keys
        assert r.body_bytes().startswith(b'{"offsetTable":{{"brokerName":"broker-a"')
        assert decode_offset_table(r.body_bytes()) == {mq(0): 1, mq(1): 0, mq(2): 0, mq(3): 0}
        assert env.broker.controller.consumer_offset_manager.offsets_of(G, T) == {
            0: 1,
            1: 0,
            2: 0,
            3: 0,
        }
        pj = await java.wait_pushed(RequestCode.RESET_CONSUMER_CLIENT_OFFSET)
        pc = await cpp.wait_pushed(RequestCode.RESET_CONSUMER_CLIENT_OFFSET)
    for pushed in (pj, pc):
        assert pushed.is_oneway
        assert pushed.ext_fields["topic"] == T and pushed.ext_fields["group"] == G
        assert pushed.ext_fields["timestamp"] == str(times[1])
    assert decode_offset_table(pj.body_bytes())[mq(0)] == 1
    # what rocketmq-client-cpp's ResetOffsetBody::Decode reads: a plain JSON list
    rows = json.loads(pc.body_bytes())["offsetTable"]
    assert {"brokerName": "broker-a", "offset": 1, "queueId": 0, "topic": T} in rows
    assert len(rows) == 4


async def test_latest_earliest_and_force(env: Env) -> None:
    times = await store_times(env, 3)
    await commit(env, {0: 1, 1: 0, 2: 0, 3: 0})
    r = await reset(env, -1)  # mqadmin skipAccumulatedMessage
    assert decode_offset_table(r.body_bytes())[mq(0)] == 3
    r = await reset(env, 0)  # before the first message: the queue's first offset
    assert decode_offset_table(r.body_bytes())[mq(0)] == 0
    # without isForce a queue only moves back: forward to the end is refused per queue
    r = await reset(env, -1, force=False)
    assert decode_offset_table(r.body_bytes())[mq(0)] == 0
    await commit(env, {0: 3})
    r = await reset(env, times[1], force=False)
    assert decode_offset_table(r.body_bytes())[mq(0)] == 1


async def test_offline_group_offsets_change_directly(env: Env) -> None:
    times = await store_times(env, 3)
    await commit(env, {0: 3, 1: 0, 2: 0, 3: 0})
    r = await reset(env, times[2])
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert env.broker.controller.consumer_offset_manager.query_offset(G, T, 0) == 2
    q = await env.call(
        RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": G, "topic": T, "queueId": 0}
    )
    assert q.ext_fields["offset"] == "2"


async def test_reset_bad_input_gets_rocketmq_codes(env: Env) -> None:
    await store_times(env, 1)
    await commit(env, {0: 1})
    r = await env.call(
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
        {"topic": "NoSuchTopic", "group": G, "timestamp": 0, "isForce": True},
    )
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert (
        r.remark == "[reset-offset] reset offset failed, no topic in this broker. topic=NoSuchTopic"
    )
    r = await env.call(
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
        {"topic": T, "group": "NoSuchGroup", "timestamp": 0, "isForce": True},
    )
    assert (r.code, r.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "THe consumer group <NoSuchGroup> not exist",
    )
    r = await reset(env, -7)
    assert r.code == ResponseCode.SYSTEM_ERROR and "invalid timestamp -7" in (r.remark or "")
    r = await env.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": T, "group": G})
    assert r.code == ResponseCode.SYSTEM_ERROR and "timestamp" in (r.remark or "")
    r = await env.call(
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
        {"topic": T, "group": G, "timestamp": "yesterday", "isForce": True},
    )
    assert r.code == ResponseCode.SYSTEM_ERROR
    # nothing above changed the offsets, and the broker still serves
    assert env.broker.controller.consumer_offset_manager.query_offset(G, T, 0) == 1
    assert (await reset(env, 0)).code == ResponseCode.SUCCESS


async def test_consumer_status_merges_every_members_table(env: Env) -> None:
    r = await env.call(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {"topic": T, "group": G})
    assert (r.code, r.remark) == (
        ResponseCode.SYSTEM_ERROR,
        f"No Any Consumer online in the consumer group: [{G}]",
    )
    async with open_remoting_client() as jc, open_remoting_client() as cc:
        java, cpp = Member(jc, "A@1", "JAVA"), Member(cc, "B@2", "CPP")
        await java.join(env)
        await cpp.join(env)
        r = await env.call(
            RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {"topic": T, "group": G}
        )
        assert r.code == 0
        assert decode_consumer_table(r.body_bytes()) == {"A@1": {mq(0): 7}, "B@2": {mq(0): 8}}
        asked = await java.wait_pushed(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT)
        assert asked.ext_fields == {"topic": T, "group": G}
        r = await env.call(
            RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
            {"topic": T, "group": G, "clientAddr": "B@2"},
        )
        assert decode_consumer_table(r.body_bytes()) == {"B@2": {mq(0): 8}}


async def test_running_info_is_relayed_to_the_named_client(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(b2c, "CALL_CLIENT_TIMEOUT", 0.5)
    async with open_remoting_client() as jc:
        java = Member(jc, "A@1", "JAVA")
        await java.join(env)
        ext = {"consumerGroup": G, "clientId": "A@1", "jstackEnable": "false"}
        r = await env.call(RequestCode.GET_CONSUMER_RUNNING_INFO, ext)
        assert r.code == 0 and r.ext_fields.get("from") == "A@1"
        assert b'"commitOffset":3' in r.body_bytes()
        relayed = await java.wait_pushed(RequestCode.GET_CONSUMER_RUNNING_INFO)
        assert relayed.ext_fields["clientId"] == "A@1"
        assert relayed.ext_fields["jstackEnable"] == "false"
        r = await env.call(
            RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": G, "clientId": "Z@9"}
        )
        assert (r.code, r.remark) == (
            ResponseCode.SYSTEM_ERROR,
            f"The Consumer <{G}> <Z@9> not online",
        )
        java.answer_307 = False
        r = await env.call(RequestCode.GET_CONSUMER_RUNNING_INFO, ext)
        assert r.code == ResponseCode.CONSUME_MSG_TIMEOUT
        assert (r.remark or "").startswith(f"consumer <{G}> <A@1> Timeout")
        r = await env.call(RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": G})
        assert r.code == ResponseCode.SYSTEM_ERROR  # clientId is required


async def test_consume_message_directly_relays_the_stored_record(env: Env) -> None:
    sent = await env.send(T, b"direct-body", queue_id=2)
    msg_id = sent.ext_fields["msgId"]
    async with open_remoting_client() as jc:
        java = Member(jc, "A@1", "JAVA")
        await java.join(env)
        ext = {"consumerGroup": G, "clientId": "A@1", "msgId": msg_id}
        r = await env.call(RequestCode.CONSUME_MESSAGE_DIRECTLY, ext)
        assert r.code == 0, r.remark
        assert json.loads(r.body_bytes()) == {
            "consumeResult": "CR_SUCCESS",
            "remark": "direct-body",
        }
        relayed = await java.wait_pushed(RequestCode.CONSUME_MESSAGE_DIRECTLY)
        assert relayed.ext_fields["brokerName"] == "broker-a"
        assert relayed.ext_fields["msgId"] == msg_id
        bad = await env.call(RequestCode.CONSUME_MESSAGE_DIRECTLY, ext | {"msgId": "not-a-msg-id"})
        assert bad.code == ResponseCode.SYSTEM_ERROR
        gone = msg_id[:-16] + "00000000FFFFFF00"
        r = await env.call(RequestCode.CONSUME_MESSAGE_DIRECTLY, ext | {"msgId": gone})
        assert r.code == ResponseCode.SYSTEM_ERROR
