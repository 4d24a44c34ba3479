"""PushConsumer CONSUME_FROM_LAST_OFFSET keeps Java's RebalancePushImpl.computePullFromWhere.

Against a real broker whose queues still start at offset 0, a brand-new group is answered 0
by QUERY_CONSUMER_OFFSET and, as a Java consumer of the same group would, reads the queues
from 0 (the "-1 -> max offset" branch, taken when the broker answers not found, is covered
in test_push_consumer.py). `rmq consume` deliberately differs: tests/cli/
test_consume_follow.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from rmq import ConsumeFromWhere, Message, Producer, PushConsumer

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster

pytestmark = pytest.mark.integration

TOPIC = "PushStart"


@pytest.fixture
async def namesrv(tcp_cluster: InProcessCluster) -> str:
    await tcp_cluster.create_topic(TOPIC, 2)
    return tcp_cluster.namesrv


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

    c = PushConsumer(
        "brand-new",
        namesrv,
        consume_from=ConsumeFromWhere.LAST_OFFSET,
        offset_store_dir=tmp_path / "offsets",
    )
    c.subscribe(TOPIC)
    c.register_listener(listener)
    with trio.fail_after(30):
        async with c:
            await all_in.wait()
    assert sorted(got) == sorted(f"old-{i}".encode() for i in range(6))
