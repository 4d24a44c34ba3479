"""PushConsumer CONSUME_FROM_LAST_OFFSET keeps Java's RebalancePushImpl.computePullFromWhere.

Against a real broker whose queues still start at offset 0, a brand-new group is answered 0
by QUERY_CONSUMER_OFFSET and, as a Java consumer of the same group would, reads the queues
from 0 (the "-1 -> max offset" branch is covered over the fake broker, which answers not
found, in test_push_consumer.py). `rmq consume` deliberately differs: tests/cli/
test_consume_follow.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from broker.config import BrokerConfig
from broker.service import run_broker
from broker.store import MessageStoreConfig, run_memory_store
from namesrv.config import NamesrvConfig
from namesrv.service import run_namesrv
from rmq import Admin, ConsumeFromWhere, Message, Producer, PushConsumer

pytestmark = pytest.mark.integration

TOPIC = "PushStart"


@pytest.fixture
async def namesrv(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[str]:
    ns = await nursery.start(
        run_namesrv, NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kv.json"))
    )
    ns_addr = f"127.0.0.1:{ns.port}"
    config = BrokerConfig(
        listen_port=0,
        namesrv_addr=ns_addr,
        store=MessageStoreConfig(store_path_root_dir=tmp_path / "store"),
    )
    await nursery.start(
        lambda task_status: run_broker(
            config, store_factory=run_memory_store, task_status=task_status
        )
    )
    async with Admin(ns_addr) as admin:
        with trio.fail_after(10):
            while True:
                if "broker-a" in (await admin.cluster_info()).brokerAddrTable:
                    break
                await trio.sleep(0.02)
        await admin.create_topic(TOPIC, queues=2)
    yield ns_addr


async def test_new_group_last_offset_reads_a_queue_that_starts_at_zero(namesrv, tmp_path):
    async with Producer("pg", namesrv) as p:
        for i in range(6):
            await p.send(Message(TOPIC, f"old-{i}"))
    got: list[bytes] = []
    all_in = trio.Event()

    async def listener(msgs):
        got.extend(m.body for m in msgs)
        if len(got) >= 6:
            all_in.set()

    c = PushConsumer("brand-new", namesrv, consume_from=ConsumeFromWhere.LAST_OFFSET,
                     offset_store_dir=tmp_path / "offsets")  # fmt: skip
    c.subscribe(TOPIC)
    c.register_listener(listener)
    with trio.fail_after(30):
        async with c:
            await all_in.wait()
    assert sorted(got) == sorted(f"old-{i}".encode() for i in range(6))
