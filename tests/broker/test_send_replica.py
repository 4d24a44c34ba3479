"""SYNC_MASTER sends: the answer waits for the replica (controller.ha.wait_for_replica)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.ha.service import HAService
from broker.processor.send import SendMessageProcessor
from broker.store import MessageStoreConfig, PutMessageStatus, run_memory_store
from common.message_properties import encode_properties
from common.remoting.channel import Channel
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.deferred_answer import DeferredAnswer
from tests.support.replica import FakeHA


class FakeChannel:
    remote_addr = "127.0.0.1:40000"
    closed = False
    attrs: dict = {}


def fake_channel() -> Channel:
    """A FakeChannel where the processors take a Channel: they read only what it has."""
    return cast(Channel, FakeChannel())


async def make_broker(nursery: trio.Nursery, tmp_path: Path, role: str) -> BrokerController:
    cfg = BrokerConfig(listen_port=10911, store=MessageStoreConfig(store_path_root_dir=tmp_path))
    store = await nursery.start(run_memory_store, cfg.store)
    store.broker_role = role
    b = BrokerController(cfg, store)
    b.load()
    return b


def send_request(wait: str = "true") -> RemotingCommand:
    ext = {
        "a": "pg",
        "b": "RT",
        "c": "TBW102",
        "d": 4,
        "e": 0,
        "f": 0,
        "g": 1700000000000,
        "h": 0,
        "i": encode_properties({"UNIQ_KEY": "U1", "WAIT": wait}),
        "j": 0,
    }
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, b"body")


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (PutMessageStatus.PUT_OK, ResponseCode.SUCCESS),
        (PutMessageStatus.FLUSH_SLAVE_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT),
        (PutMessageStatus.SLAVE_NOT_AVAILABLE, ResponseCode.SLAVE_NOT_AVAILABLE),
    ],
)
async def test_sync_master_answer_waits_for_the_replica(autojump_clock, tmp_path, status, code):
    async with trio.open_nursery() as n:
        b = await make_broker(n, tmp_path, "SYNC_MASTER")
        fake_ha = FakeHA(status, n)
        b.ha = cast(HAService, fake_ha)  # the send path calls watch_replica only
        pending = SendMessageProcessor(b).send_inline(send_request(), fake_channel())
        # appended now, answered later, with no task of its own
        assert isinstance(pending, DeferredAnswer) and not pending.done
        assert b.store.get_max_offset_in_queue("RT", 0) == 1
        t0 = trio.current_time()
        resp = await pending.wait()
        assert trio.current_time() - t0 == 3
        assert resp.code == code
        # whatever the replica did, the message is stored and the answer says where
        assert resp.ext_fields["queueOffset"] == "0" and len(resp.ext_fields["msgId"]) == 32
        assert fake_ha.asked == [b.store.get_max_phy_offset()]
        # the put counts once, whatever the replica did (Java: sendOK for these statuses)
        assert b.stats.put_count == 1 and b.stats.put_failed == 0
        # the answer made while the slave works is the one given when it acknowledges
        assert (resp is pending.likely) == (status is PutMessageStatus.PUT_OK)
        n.cancel_scope.cancel()


async def test_a_decided_replica_status_answers_at_once(autojump_clock, tmp_path):
    async with trio.open_nursery() as n:
        b = await make_broker(n, tmp_path, "SYNC_MASTER")
        fake_ha = FakeHA(PutMessageStatus.SLAVE_NOT_AVAILABLE, now=True)
        b.ha = cast(HAService, fake_ha)  # the send path calls watch_replica only
        resp = SendMessageProcessor(b).send_inline(send_request(), fake_channel())
        assert isinstance(resp, RemotingCommand)
        assert resp.code == ResponseCode.SLAVE_NOT_AVAILABLE
        assert resp.ext_fields["queueOffset"] == "0"
        n.cancel_scope.cancel()


@pytest.mark.parametrize(("role", "wait"), [("SYNC_MASTER", "false"), ("ASYNC_MASTER", "true")])
async def test_no_replica_wait(autojump_clock, tmp_path, role, wait):
    async with trio.open_nursery() as n:
        b = await make_broker(n, tmp_path, role)
        fake_ha = FakeHA(PutMessageStatus.SLAVE_NOT_AVAILABLE)
        b.ha = cast(HAService, fake_ha)  # the send path calls watch_replica only
        resp = SendMessageProcessor(b).send_inline(send_request(wait), fake_channel())
        assert isinstance(resp, RemotingCommand) and resp.code == ResponseCode.SUCCESS
        assert fake_ha.asked == []
        n.cancel_scope.cancel()
