"""Pop on the remoting port, spoken as RocketMQ 5's Java client speaks it: raw POP_MESSAGE,
ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME frames with the headers of
``MQClientAPIImpl.popMessageAsync`` / ``ackMessageAsync`` / ``changeInvisibleTimeAsync``, against
``run_broker`` with the file store; then the broker restarts on the same files and the pop state
(in flight, acked, the group's offsets) is as it was."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import trio

from broker.service import run_broker
from common.message import decode_records
from common.mq_map import parse_mq_map
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from tests.broker.test_broker_service import Env, broker_config


def pop_cmd(group: str, topic: str, *, invisible: int = 3000, poll: int = 0, **kw: Any) -> Any:
    ext = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": -1,
        "maxMsgNums": 32,
        "invisibleTime": invisible,
        "pollTime": poll,
        "bornTime": int(time.time() * 1000),
        "initMode": 1,  # ConsumeInitMode.MIN
        "expType": "TAG",
        "exp": "*",
        "order": False,
    }
    ext.update(kw)
    return ext


def ack_ext(group: str, topic: str, pop_ck: str) -> dict[str, Any]:
    # DefaultMQPushConsumerImpl.ackAsync: the real topic, queue and offset out of POP_CK
    f = pop_ck.split(" ")
    real = f"%RETRY%{group}_{topic}" if f[4] == "1" else topic
    return {
        "consumerGroup": group,
        "topic": real,
        "queueId": int(f[6]),
        "extraInfo": pop_ck,
        "offset": int(f[7]),
    }


class Running:
    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.done = trio.Event()

    async def stop(self) -> None:
        self.scope.cancel()
        await self.done.wait()


async def start(nursery: trio.Nursery, tmp_path: Path) -> tuple[Running, Any]:
    run_ = Running()
    cfg = broker_config(tmp_path, revive_interval=0.1, flush_consumer_offset_interval=3600.0)

    async def run(task_status: trio.TaskStatus[Any]) -> None:
        try:
            with run_.scope:
                await run_broker(cfg, task_status=task_status)
        finally:
            run_.done.set()

    handle = await nursery.start(run)
    return run_, handle


async def test_pop_ack_change_on_the_wire_and_after_restart(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    running, handle = await start(nursery, tmp_path)
    async with open_remoting_client() as client:
        env = Env(handle, client)
        for i in range(3):
            r = await env.send("PT", b"w%d" % i, queue_id=i % 2)
            assert r.code == ResponseCode.SUCCESS, r.remark
        # a queue id out of range / an unknown topic, as RocketMQ answers them
        r = await env.call(RequestCode.POP_MESSAGE, pop_cmd("PG", "PT", queueId=99))
        assert r.code == ResponseCode.SYSTEM_ERROR
        r = await env.call(RequestCode.POP_MESSAGE, pop_cmd("PG", "NOPE"))
        assert r.code == ResponseCode.TOPIC_NOT_EXIST

        r = await env.call(RequestCode.POP_MESSAGE, pop_cmd("PG", "PT"))
        assert r.code == ResponseCode.SUCCESS, r.remark
        for k in ("popTime", "invisibleTime", "reviveQid", "restNum", "startOffsetInfo"):
            assert k in r.ext_fields, k
        assert r.ext_fields["invisibleTime"] == "3000"
        msgs = decode_records(r.body_bytes())
        assert sorted(m.body for m in msgs) == [b"w0", b"w1", b"w2"]
        cks = {m.body: m.properties["POP_CK"] for m in msgs}
        assert {m.topic for m in msgs} == {"PT"}
        # msgOffsetInfo "0 <queue> <offsets>" per queue, as the client parses it
        assert set(r.ext_fields["msgOffsetInfo"].split(";")) == {"0 0 0,1", "0 1 0"}

        # rmq top's numbers: all three in flight, none ready (GET_CONSUME_STATS's "inflight")
        r = await env.call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "PG", "topic": "PT"})
        _, table = parse_mq_map(r.body_bytes(), "offsetTable")
        stats = {mq.queueId: v for mq, v in table}
        assert [stats[q].get("inflight", 0) for q in (0, 1)] == [2, 1]
        assert [stats[q]["brokerOffset"] - stats[q]["consumerOffset"] for q in (0, 1)] == [0, 0]

        # ack w0; change w1 to 60 s; leave w2
        r = await env.call(RequestCode.ACK_MESSAGE, ack_ext("PG", "PT", cks[b"w0"]))
        assert r.code == ResponseCode.SUCCESS, r.remark
        ext = ack_ext("PG", "PT", cks[b"w1"]) | {"invisibleTime": 60_000}
        r = await env.call(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext)
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert r.ext_fields["invisibleTime"] == "60000"
        # the old handle is refused for another change
        r = await env.call(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext)
        assert r.code == ResponseCode.NO_MESSAGE
        # a handle that does not parse
        bad = ack_ext("PG", "PT", cks[b"w2"]) | {"extraInfo": "x y"}
        r = await env.call(RequestCode.ACK_MESSAGE, bad)
        assert r.code == ResponseCode.MESSAGE_ILLEGAL

        # a 4.x consumer of another group pulls all three from offset 0 meanwhile
        pull = {
            "consumerGroup": "PULLER",
            "topic": "PT",
            "queueId": 0,
            "queueOffset": 0,
            "maxMsgNums": 32,
            "sysFlag": 0x4,
            "commitOffset": 0,
            "suspendTimeoutMillis": 0,
            "subscription": "*",
            "subVersion": 0,
        }
        r = await env.call(RequestCode.PULL_MESSAGE, pull)
        assert r.code == ResponseCode.SUCCESS
        assert [m.body for m in decode_records(r.body_bytes())] == [b"w0", b"w2"]

    # restart on the same files, offsets never flushed: the revive log rebuilds everything
    await running.stop()
    running, handle = await start(nursery, tmp_path)
    async with open_remoting_client() as client:
        env = Env(handle, client)
        got: list[tuple[bytes, int]] = []
        with trio.fail_after(15):
            while not got:
                r = await env.call(RequestCode.POP_MESSAGE, pop_cmd("PG", "PT", poll=2000))
                if r.code == ResponseCode.SUCCESS:
                    back = decode_records(r.body_bytes())
                    got += [(m.body, m.reconsume_times) for m in back]
                    # from the pop retry topic: answered as PT, the handle marked retry
                    assert r.ext_fields["startOffsetInfo"].startswith("1 0 ")
                    assert [m.topic for m in back] == ["PT"]
                    pop_ck = back[0].properties["POP_CK"]
                    assert pop_ck.split(" ")[4] == "1"
                else:
                    assert r.code == ResponseCode.POLLING_TIMEOUT, (r.code, r.remark)
        # w2 (never acked) is back from the pop retry topic, its second attempt; w0 (acked)
        # and w1 (invisible for 60 s) are not, and nothing was popped twice from PT
        assert got == [(b"w2", 1)]
        r = await env.call(RequestCode.ACK_MESSAGE, ack_ext("PG", "PT", pop_ck))
        assert r.code == ResponseCode.SUCCESS, r.remark
        r = await env.call(RequestCode.POP_MESSAGE, pop_cmd("PG", "PT"))
        assert r.code == ResponseCode.POLLING_TIMEOUT
    await running.stop()


async def test_batch_ack_with_a_java_bitset(tmp_path: Path, nursery: trio.Nursery) -> None:
    running, handle = await start(nursery, tmp_path)
    async with open_remoting_client() as client:
        env = Env(handle, client)
        for i in range(3):
            assert (await env.send("BT", b"b%d" % i, queue_id=0)).code == ResponseCode.SUCCESS
        r = await env.call(RequestCode.POP_MESSAGE, pop_cmd("BG", "BT", queueId=0, invisible=1000))
        msgs = decode_records(r.body_bytes())
        assert [m.body for m in msgs] == [b"b0", b"b1", b"b2"]
        f = msgs[0].properties["POP_CK"].split(" ")
        # BatchAck as the Java client's fastjson2 writes it: the BitSet's toByteArray as numbers;
        # positions 0 and 2 acked
        ack = {"c": "BG", "t": "BT", "r": "0", "so": int(f[0]), "q": 0, "rq": int(f[3])}
        ack |= {"pt": int(f[1]), "it": int(f[2]), "b": [5]}
        body = json.dumps({"brokerName": f[5], "acks": [ack]}).encode()
        r = await env.call(RequestCode.BATCH_ACK_MESSAGE, {}, body)
        assert r.code == ResponseCode.SUCCESS, r.remark
        r = await env.call(RequestCode.BATCH_ACK_MESSAGE, {}, b'{"acks":[]}')
        assert r.code == ResponseCode.NO_MESSAGE
        r = await env.call(RequestCode.BATCH_ACK_MESSAGE, {}, b"not json")
        assert r.code == ResponseCode.NO_MESSAGE
        got: list[bytes] = []
        with trio.fail_after(10):
            while not got:
                r = await env.call(RequestCode.POP_MESSAGE, pop_cmd("BG", "BT", poll=1000))
                got = [m.body for m in decode_records(r.body_bytes())] if r.body_bytes() else []
        assert got == [b"b1"]
    await running.stop()


async def test_fifo_changed_invisible_time_survives_a_restart_on_files(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A FIFO pop (order=true) for 2 s, its invisible time changed to 60 s, the broker
    restarted on its files: past the 2 s the queue stays locked (RocketMQ 5 persists the new
    time with its order info); the changed handle acks and the next message follows."""
    running, handle = await start(nursery, tmp_path)
    async with open_remoting_client() as client:
        env = Env(handle, client)
        for i in range(2):
            assert (await env.send("FT", b"f%d" % i, queue_id=0)).code == ResponseCode.SUCCESS
        cmd = pop_cmd("FG", "FT", queueId=0, invisible=2000, maxMsgNums=1, order=True)
        r = await env.call(RequestCode.POP_MESSAGE, cmd)
        assert r.code == ResponseCode.SUCCESS, r.remark
        popped_at = time.monotonic()
        (f0,) = decode_records(r.body_bytes())
        assert f0.body == b"f0"
        pop_ck = f0.properties["POP_CK"]
        ext = ack_ext("FG", "FT", pop_ck) | {"invisibleTime": 60_000}
        r = await env.call(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext)
        assert r.code == ResponseCode.SUCCESS, r.remark
    await running.stop()
    running, handle = await start(nursery, tmp_path)
    async with open_remoting_client() as client:
        env = Env(handle, client)
        await trio.sleep(max(0.0, popped_at + 3.0 - time.monotonic()))
        r = await env.call(RequestCode.POP_MESSAGE, cmd)
        assert r.code == ResponseCode.POLLING_TIMEOUT, (r.code, r.remark)
        r = await env.call(RequestCode.ACK_MESSAGE, ack_ext("FG", "FT", pop_ck))
        assert r.code == ResponseCode.SUCCESS, r.remark
        r = await env.call(RequestCode.POP_MESSAGE, cmd)
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert [m.body for m in decode_records(r.body_bytes())] == [b"f1"]
    await running.stop()
