"""Our consumers with SQL92 selectors (and tags as before) against the real servers in process.

broker-a runs with ``enablePropertyFilter=true``; a second broker without it shows the start
refused with the broker's reason, as is a bad expression (the position in it included).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio

from common.message import MessageExt
from rmq import (
    ConsumeFromWhere,
    LitePullConsumer,
    Message,
    MessageSelector,
    Producer,
    PullConsumer,
    PushConsumer,
)
from rmq.errors import ClientError

if TYPE_CHECKING:
    from trio.testing import MockClock

    from tests.conftest import InProcessCluster

ORDERS = [("paid", "50"), ("paid", "250"), ("refunded", "300"), ("paid", "999")]


@pytest.fixture
def broker_fields() -> dict[str, Any]:
    return {"enable_property_filter": True}


@pytest.fixture
async def cluster(memory_cluster: InProcessCluster) -> InProcessCluster:
    await memory_cluster.create_topic("Orders", 1)
    async with Producer("pg", memory_cluster.namesrv, network=memory_cluster.network) as p:
        for i, (tag, amount) in enumerate(ORDERS):
            await p.send(
                Message("Orders", f"o{i}".encode(), tags=tag, properties={"amount": amount})
            )
    return memory_cluster


async def ignore(msgs: list[MessageExt]) -> None:
    """The listener of consumers that never start."""


def test_selectors_are_built_as_rocketmq_builds_them() -> None:
    sql = MessageSelector.by_sql("a > 1").subscription("T")
    assert (sql.expressionType, sql.subString, sql.tagsSet, sql.codeSet) == (
        "SQL92",
        "a > 1",
        [],
        [],
    )
    tag = MessageSelector.by_tag("B || A").subscription("T")
    assert (tag.expressionType, tag.tagsSet) == ("TAG", ["A", "B"])
    assert MessageSelector.of("*") == MessageSelector.by_tag()
    with pytest.raises(ClientError):
        MessageSelector.by_sql(" ")
    with pytest.raises(ClientError):
        MessageSelector.by_tag("||")


async def consume(
    cluster: InProcessCluster, expression: Any, n: int, group: str = "sqlg"
) -> list[bytes]:
    got: list[bytes] = []
    done = trio.Event()

    async def listener(msgs: list[MessageExt]) -> None:
        got.extend(m.body for m in msgs)
        if len(got) >= n:
            done.set()

    c = PushConsumer(
        group,
        cluster.namesrv,
        network=cluster.network,
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
    )
    c.subscribe("Orders", expression)
    c.register_listener(listener)
    async with c:
        with trio.fail_after(30):
            await done.wait()
        await trio.sleep(2)  # nothing else arrives
    return sorted(got)


async def test_push_consumer_gets_only_what_the_sql_selects(
    cluster: InProcessCluster, autojump_clock: MockClock
) -> None:
    sel = MessageSelector.by_sql("TAGS = 'paid' AND amount > 100")
    assert await consume(cluster, sel, 2) == [b"o1", b"o3"]


async def test_push_consumer_with_tags_as_before(
    cluster: InProcessCluster, autojump_clock: MockClock
) -> None:
    assert await consume(cluster, "refunded", 1) == [b"o2"]
    assert await consume(cluster, MessageSelector.by_tag("refunded"), 1, "tagg2") == [b"o2"]


async def test_start_fails_when_the_broker_refuses_sql(
    cluster: InProcessCluster, autojump_clock: MockClock
) -> None:
    await cluster.start_broker("broker-b", broker_name="broker-b")  # enablePropertyFilter off
    await cluster.create_topic("OnB", 1, nodes=("broker-b",))
    c = PushConsumer("g2", cluster.namesrv, network=cluster.network)
    c.subscribe("OnB", MessageSelector.by_sql("a > 1"))
    c.register_listener(ignore)
    with pytest.raises(ClientError, match="does not support consumer to filter message by SQL92"):
        async with c:
            pass


async def test_start_fails_on_a_bad_expression_saying_where(
    cluster: InProcessCluster, autojump_clock: MockClock
) -> None:
    c = PushConsumer("g3", cluster.namesrv, network=cluster.network)
    c.subscribe("Orders", MessageSelector.by_sql("amount > 'x'"))
    c.register_listener(ignore)
    with pytest.raises(ClientError, match="line 1, column 8"):
        async with c:
            pass


async def test_pull_consumer_pulls_with_a_selector(
    cluster: InProcessCluster, autojump_clock: MockClock
) -> None:
    async with PullConsumer("pullg", cluster.namesrv, network=cluster.network) as c:
        (mq,) = await c.fetch_queues("Orders")
        r = await c.pull(mq, 0, selector=MessageSelector.by_sql("amount BETWEEN 200 AND 400"))
        assert [m.body for m in r.messages] == [b"o1", b"o2"]
        assert r.next_begin_offset == 4
        r = await c.pull(mq, 0, tags="paid")  # the old form
        assert [m.body for m in r.messages] == [b"o0", b"o1", b"o3"]
        with pytest.raises(ClientError):
            await c.pull(mq, 0, tags="paid", selector=MessageSelector.by_sql("a > 1"))
        with pytest.raises(ClientError, match="column"):
            await c.check_selector("Orders", MessageSelector.by_sql("a >"))


async def test_lite_pull_consumer_polls_with_a_selector(
    cluster: InProcessCluster, autojump_clock: MockClock
) -> None:
    c = LitePullConsumer(
        "liteg", cluster.namesrv, network=cluster.network, consume_from="FIRST_OFFSET"
    )
    c.set_selector("Orders", MessageSelector.by_sql("amount < 100 OR TAGS = 'refunded'"))
    async with c:
        c.assign(await c.fetch_queues("Orders"))
        got: list[bytes] = []
        with trio.move_on_after(10):
            while len(got) < 2:
                got.extend(m.body for m in await c.poll(timeout=1.0))
        assert got == [b"o0", b"o2"]
        with pytest.raises(ClientError):
            c.set_selector("Orders", "*")  # selectors are set before the start


async def test_lite_pull_start_fails_on_a_bad_selector(
    cluster: InProcessCluster, autojump_clock: MockClock
) -> None:
    c = LitePullConsumer("liteg2", cluster.namesrv, network=cluster.network)
    c.set_selector("Orders", MessageSelector.by_sql("amount IN (1)"))
    with pytest.raises(ClientError, match="refuses the SQL92"):
        async with c:
            pass
