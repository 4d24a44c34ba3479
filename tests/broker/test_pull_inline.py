"""PULL_MESSAGE runs inline: the first pass is synchronous, a parked pull leaves an awaitable."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.processor.pull import PullMessageProcessor
from broker.store import MessageStoreConfig, PutMessageResult, run_memory_store
from common.message import MessageExtBrokerInner, decode_records
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
    b = BrokerController(cfg, store)
    b.load()
    store.add_arrival_listener(b.pull_hold.notify_message_arriving)
    b.topic_config_manager.create_topic_in_send_message_method("PT", "TBW102", 4, 0)
    return b


def put(b: BrokerController, body: bytes) -> None:
    msg = MessageExtBrokerInner(
        topic="PT", queue_id=0, body=body, properties={"UNIQ_KEY": body.hex()}
    )
    put = b.store.append_message(msg)
    assert isinstance(put, PutMessageResult) and put.ok


def pull_request(offset: int, suspend_ms: int) -> RemotingCommand:
    ext = {
        "consumerGroup": "cg",
        "topic": "PT",
        "queueId": 0,
        "queueOffset": offset,
        "maxMsgNums": 32,
        "sysFlag": 6 if suspend_ms else 4,  # SUSPEND | SUBSCRIPTION
        "commitOffset": -1,
        "suspendTimeoutMillis": suspend_ms,
        "subscription": "*",
        "subVersion": 0,
    }
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, ext)


async def test_found_is_answered_synchronously(autojump_clock, tmp_path):
    async with trio.open_nursery() as n:
        b = await make_broker(n, tmp_path)
        put(b, b"one")
        resp = PullMessageProcessor(b).pull_inline(pull_request(0, 15000), fake_channel())
        assert isinstance(resp, RemotingCommand) and resp.code == ResponseCode.SUCCESS
        assert [m.body for m in decode_records(resp.body_bytes())] == [b"one"]
        n.cancel_scope.cancel()


async def test_parked_pull_is_registered_before_its_task_runs(autojump_clock, tmp_path):
    async with trio.open_nursery() as n:
        b = await make_broker(n, tmp_path)
        put(b, b"one")
        pending = PullMessageProcessor(b).pull_inline(pull_request(1, 15000), fake_channel())
        assert not isinstance(pending, RemotingCommand)
        # the waiter exists already: an arrival right now (before anything awaits) wakes it
        assert b.pull_hold.waiting_count("PT", 0) == 1
        put(b, b"two")
        t0 = trio.current_time()
        assert not isinstance(pending, RemotingCommand)
        resp = await pending
        assert trio.current_time() - t0 < 1
        assert resp.code == ResponseCode.SUCCESS
        assert [m.body for m in decode_records(resp.body_bytes())] == [b"two"]
        assert b.pull_hold.waiting_count() == 0
        n.cancel_scope.cancel()


async def test_parked_pull_times_out_and_unregisters(autojump_clock, tmp_path):
    async with trio.open_nursery() as n:
        b = await make_broker(n, tmp_path)
        pending = PullMessageProcessor(b).pull_inline(pull_request(0, 3000), fake_channel())
        t0 = trio.current_time()
        assert not isinstance(pending, RemotingCommand)
        resp = await pending
        assert trio.current_time() - t0 == 3.0
        assert resp.code == ResponseCode.PULL_NOT_FOUND
        assert b.pull_hold.waiting_count() == 0
        n.cancel_scope.cancel()
