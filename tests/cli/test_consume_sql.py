"""`rmq consume --sql`: the pull loop with a SQL92 selector (memory_cluster, autojump)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any

import pytest
import trio
from typer.testing import CliRunner

from cli.main import app
from cli.messages.consume import consume_topic
from common.remoting.client import RemotingClient, open_remoting_client
from rmq import Message, Producer
from rmq.errors import ClientError

if TYPE_CHECKING:
    from trio.testing import MockClock

    from tests.conftest import InProcessCluster


@pytest.fixture
def broker_fields() -> dict[str, Any]:
    return {"enable_property_filter": True}


@pytest.fixture
async def remoting(memory_cluster: InProcessCluster) -> AsyncIterator[RemotingClient]:
    async with open_remoting_client(network=memory_cluster.network) as client:
        yield client


async def fill(cluster: InProcessCluster) -> None:
    await cluster.create_topic("T", 2)
    async with Producer("pg", cluster.namesrv, network=cluster.network) as p:
        for i in range(6):
            await p.send(Message("T", f"m{i}", tags="even" if i % 2 == 0 else "odd",
                                 properties={"n": str(i)}))  # fmt: skip


def consume(
    cluster: InProcessCluster, remoting: RemotingClient, **kw: Any
) -> Coroutine[Any, Any, int]:
    return consume_topic(cluster.namesrv, "T", handle_signals=False, remoting=remoting, **kw)


async def test_sql_selects_by_properties(
    memory_cluster: InProcessCluster, remoting: RemotingClient, autojump_clock: MockClock
) -> None:
    await fill(memory_cluster)
    seen: list[bytes] = []
    with trio.fail_after(60):
        n = await consume(
            memory_cluster,
            remoting,
            group="g",
            from_beginning=True,
            follow=False,
            sql="TAGS = 'even' AND n >= 2",
            on_message=lambda m: seen.append(m.body),
        )
    assert n == 2 and sorted(seen) == [b"m2", b"m4"]


async def test_a_bad_expression_fails_before_anything_is_read(
    memory_cluster: InProcessCluster, remoting: RemotingClient, autojump_clock: MockClock
) -> None:
    await fill(memory_cluster)
    with pytest.raises(ClientError, match="line 1, column 3"):
        await consume(memory_cluster, remoting, group="g", sql="n > 'x'", on_message=print)
    with pytest.raises(ClientError, match="give one of them"):
        await consume(memory_cluster, remoting, group="g", sql="n > 1", tags="even",
                      on_message=print)  # fmt: skip


def test_the_option_is_documented() -> None:
    out = CliRunner().invoke(app, ["consume", "--help"]).output
    assert "--sql" in out and "enablePropertyFilter" in out
