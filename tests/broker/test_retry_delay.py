"""Send-back, retry/DLQ routing and delayed delivery, on the Trio clock (autojump)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import trio
import trio.testing

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.processor.send import SendMessageProcessor
from broker.schedule import SCHEDULE_TOPIC, trio_wall_clock_ms
from broker.store import MessageStoreConfig, run_memory_store
from common.message import MessageExt, MessageExtBrokerInner, decode_records
from common.message_properties import MessageConst, encode_properties
from common.remoting.channel import Channel
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand


class FakeChannel:
    remote_addr = "127.0.0.1:40000"
    closed = False
    attrs: dict = {}


def fake_channel() -> Channel:
    """A FakeChannel where the processors take a Channel: they read only what it has."""
    return cast(Channel, FakeChannel())


async def make_broker(nursery: trio.Nursery, tmp_path: Path) -> BrokerController:
    cfg = BrokerConfig(listen_port=10911, store=MessageStoreConfig(store_path_root_dir=tmp_path))
    store = await nursery.start(run_memory_store, cfg.store)
    clock = trio_wall_clock_ms()
    store.clock = clock  # store timestamps follow the (autojumping) Trio clock
    b = BrokerController(cfg, store)
    b.load()
    b.schedule_service.now_ms = clock
    store.add_arrival_listener(b.pull_hold.notify_message_arriving)
    return b


def all_messages(b: BrokerController, topic: str, queue_id: int = 0) -> list[MessageExt]:
    res = b.store.get_message("t", topic, queue_id, 0, 100)
    return decode_records(b"".join(bytes(x) for x in res.buffers)) if res.buffers else []


async def put(b: BrokerController, topic: str, body: bytes, **props: str) -> int:
    msg = MessageExtBrokerInner(
        topic=topic,
        queue_id=0,
        body=body,
        properties={"UNIQ_KEY": "U1", **props},
        store_host=b.store_host,
    )
    r = await b.store.put_message(msg)
    assert r.ok and r.append is not None
    return r.append.wrote_offset


async def test_delayed_message_is_delivered_when_due(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as n:
        b = await make_broker(n, tmp_path)
        await n.start(b.schedule_service.run)
        await put(b, "DT", b"later", DELAY="2")  # level 2 = 5 s
        assert all_messages(b, "DT") == []
        assert len(all_messages(b, SCHEDULE_TOPIC, 1)) == 1
        await trio.sleep(4.5)
        assert all_messages(b, "DT") == []
        await trio.sleep(1.0)
        got = all_messages(b, "DT")
        assert [m.body for m in got] == [b"later"]
        assert MessageConst.DELAY not in got[0].properties
        assert got[0].properties[MessageConst.REAL_TOPIC] == "DT"
        assert b.schedule_service.offset_table[2] == 1
        # the cursor is persisted as delayOffset.json
        b.persist_offsets()
        assert (tmp_path / "config" / "delayOffset.json").read_text() == '{"offsetTable":{"2":1}}'
        n.cancel_scope.cancel()


async def test_send_back_goes_to_retry_after_delay_then_dlq(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as n:
        b = await make_broker(n, tmp_path)
        await n.start(b.schedule_service.run)
        proc = SendMessageProcessor(b)
        phys = await put(b, "OrigT", b"payload", TAGS="A")
        req = RemotingCommand.request(
            RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "g", "offset": phys, "delayLevel": 0}
        )
        r = await proc.process_send_back(req, fake_channel())
        assert r.code == ResponseCode.SUCCESS
        # reconsumeTimes 0 -> level 3 (10 s); %RETRY%g was created
        assert b.topic_config_manager.select_topic_config("%RETRY%g") is not None
        await trio.sleep(9)
        assert all_messages(b, "%RETRY%g") == []
        await trio.sleep(2)
        (m,) = all_messages(b, "%RETRY%g")
        assert m.body == b"payload" and m.reconsume_times == 1
        assert m.properties[MessageConst.RETRY_TOPIC] == "OrigT"
        assert m.properties[MessageConst.ORIGIN_MESSAGE_ID]
        assert m.properties[MessageConst.TAGS] == "A"

        # negative delay level -> DLQ at once
        req = RemotingCommand.request(
            RequestCode.CONSUMER_SEND_MSG_BACK,
            {"group": "g", "offset": m.commit_log_offset, "delayLevel": -1},
        )
        assert (await proc.process_send_back(req, fake_channel())).code == 0
        (d,) = all_messages(b, "%DLQ%g")
        assert d.properties[MessageConst.RETRY_TOPIC] == "OrigT"
        assert d.reconsume_times == 2

        # unknown offset -> SYSTEM_ERROR, broker still fine
        req = RemotingCommand.request(
            RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "g", "offset": 10**9, "delayLevel": 0}
        )
        assert (await proc.process_send_back(req, fake_channel())).code == ResponseCode.SYSTEM_ERROR
        n.cancel_scope.cancel()


async def test_send_back_max_times_goes_to_dlq(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as n:
        b = await make_broker(n, tmp_path)
        proc = SendMessageProcessor(b)
        msg = MessageExtBrokerInner(
            topic="OT", queue_id=0, body=b"x", reconsume_times=16, store_host=b.store_host
        )
        appended = (await b.store.put_message(msg)).append
        assert appended is not None
        phys = appended.wrote_offset
        req = RemotingCommand.request(
            RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "g", "offset": phys, "delayLevel": 0}
        )
        assert (await proc.process_send_back(req, fake_channel())).code == 0
        assert len(all_messages(b, "%DLQ%g")) == 1
        assert all_messages(b, SCHEDULE_TOPIC, 2) == []
        n.cancel_scope.cancel()


async def test_send_to_retry_topic_over_max_goes_to_dlq(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as n:
        b = await make_broker(n, tmp_path)
        proc = SendMessageProcessor(b)
        ext = {
            "producerGroup": "pg",
            "topic": "%RETRY%g2",
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4,
            "queueId": 0,
            "sysFlag": 0,
            "bornTimestamp": "0",
            "flag": 0,
            "properties": encode_properties({"WAIT": "true"}),
            "reconsumeTimes": "16",
        }
        r = await proc.process_send(
            RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, b"z"), fake_channel()
        )
        assert r.code == 0, r.remark
        assert len(all_messages(b, "%DLQ%g2")) == 1
        ext["reconsumeTimes"] = "3"
        r = await proc.process_send(
            RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, b"z"), fake_channel()
        )
        assert len(all_messages(b, "%RETRY%g2")) == 1
        n.cancel_scope.cancel()
