"""`rmq produce --transaction commit|rollback|unknown [--check-answer ...]`: each message in a
transaction; unknown ones are ended by the answer to the broker's check-back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio
from typer.testing import CliRunner

from cli.main import app
from cli.messages.transaction import Outcome, produce_in_transaction
from rmq import LocalTransactionState, Message

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster

pytestmark = pytest.mark.timeout(60)
runner = CliRunner()


@pytest.fixture
def broker_fields() -> dict[str, Any]:
    return {"transaction_timeout": 0.5, "transaction_check_interval": 0.5}


def delivered(cluster: InProcessCluster, topic: str) -> list[bytes]:
    return [m.body for m in cluster.messages(topic, 0)]


@pytest.mark.parametrize(
    ("outcome", "answer", "expect"),
    [
        (Outcome.commit, None, [b"m"]),
        (Outcome.rollback, None, []),
        (Outcome.unknown, Outcome.commit, [b"m"]),
        (Outcome.unknown, Outcome.rollback, []),
    ],
)
async def test_outcomes(
    memory_cluster: InProcessCluster,
    autojump_clock: trio.abc.Clock,
    outcome: Outcome,
    answer: Outcome | None,
    expect: list[bytes],
) -> None:
    c = memory_cluster
    await c.create_topic("Tx", 1)
    run = await produce_in_transaction(
        c.namesrv,
        [Message("Tx", b"m")],
        group="cli-tx",
        outcome=outcome,
        check_answer=answer,
        check_wait=30,
        network=c.network,
    )
    await trio.sleep(3)
    assert delivered(c, "Tx") == expect
    assert run.unresolved() == []
    if answer is not None:
        assert run.checks == {run.results[0].msg_id: answer.state}


async def test_unknown_without_an_answer_waits_for_none(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    c = memory_cluster
    await c.create_topic("Tx", 1)
    started = trio.current_time()
    run = await produce_in_transaction(
        c.namesrv,
        [Message("Tx", b"m")],
        group="cli-tx",
        outcome=Outcome.unknown,
        network=c.network,
    )
    assert trio.current_time() - started < 5  # returns after sending
    assert run.results[0].local_transaction_state is LocalTransactionState.UNKNOW
    assert delivered(c, "Tx") == []


async def test_the_command_end_to_end(tcp_cluster: InProcessCluster) -> None:
    c = tcp_cluster
    await c.create_topic("Tx", 1)
    args = ["-n", c.namesrv, "produce", "-t", "Tx", "--transaction", "unknown"]
    result = await trio.to_thread.run_sync(
        lambda: runner.invoke(app, [*args, "--check-answer", "commit", "--check-wait", "20", "a"])
    )
    assert result.exit_code == 0, result.output
    assert "transaction" in result.stdout and "UNKNOW" in result.stdout
    assert "check-back for" in result.stdout and "answered COMMIT_MESSAGE" in result.stdout
    result = await trio.to_thread.run_sync(
        lambda: runner.invoke(app, [*args[:-1], "rollback", "--json", "b"])
    )
    assert result.exit_code == 0, result.output
    assert '"transaction": "ROLLBACK_MESSAGE"' in result.stdout
    await trio.sleep(1)
    assert delivered(c, "Tx") == [b"a"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--transaction", "maybe"], "expected commit, rollback or unknown"),
        (["--check-answer", "commit"], "needs --transaction"),
        (["--transaction", "commit", "--delay-level", "2"], "cannot be delayed"),
    ],
)
def test_bad_options_are_refused(extra: list[str], says: str) -> None:
    result = runner.invoke(app, ["-n", "127.0.0.1:1", "produce", "-t", "Tx", *extra, "x"])
    assert result.exit_code == 2 and says in result.output, result.output
    assert "Traceback" not in result.output


def test_help_shows_transaction_examples() -> None:
    result = runner.invoke(app, ["produce", "--help"])
    assert result.exit_code == 0 and "--transaction commit" in result.output
