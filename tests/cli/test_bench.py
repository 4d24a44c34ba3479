"""`rmq bench`: statistics, the produce/consume loops against the real servers in process
(memory_cluster; a failing broker through tests.support.tap.Tap), and the command's error paths
through typer's runner."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from cli.bench.load import (
    BenchError,
    BenchResult,
    bench_consume,
    bench_produce,
    latency_stats,
    percentile,
    render_run,
    render_summary,
    summarize,
    to_json,
)
from cli.main import app
from common.errors import TopicNotExistError
from common.remoting.client import open_remoting_client
from common.remoting.codes import ResponseCode

if TYPE_CHECKING:
    from common.message import MessageExt
    from tests.conftest import InProcessCluster


@pytest.fixture
async def cluster(memory_cluster):
    await memory_cluster.create_topic("B", 4)
    return memory_cluster


@pytest.fixture
async def remoting(cluster):
    """The commands take a RemotingClient (`remoting=`): one on the cluster's network."""
    async with open_remoting_client(network=cluster.network) as client:
        yield client


def stored(cluster: InProcessCluster, topic: str = "B") -> list[MessageExt]:
    return [m for q in range(4) for m in cluster.messages(topic, q)]


def test_percentiles_nearest_rank():
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99
    assert percentile(values, 99.9) == 100 and percentile(values, 0) == 1
    assert math.isnan(percentile([], 50))
    stats = latency_stats([0.001, 0.003, 0.002])
    assert stats["min"] == pytest.approx(1) and stats["max"] == pytest.approx(3)
    assert stats["median"] == pytest.approx(2) and stats["p999"] == pytest.approx(3)
    assert set(stats) == {"min", "median", "max", "p50", "p90", "p99", "p999"}
    assert latency_stats([]) == {}


def test_summary_over_runs_and_json():
    runs = [BenchResult("produce", 100, 100 * 1024, s, 100, {"p99": s}) for s in (1.0, 2.0, 4.0)]
    agg = summarize(runs)
    assert agg["msg_per_s"] == {"min": 25.0, "median": 50.0, "max": 100.0}
    assert agg["latency_p99_ms"]["median"] == 2.0
    doc = to_json(runs, {"size": 1024})
    assert doc["settings"] == {"size": 1024} and len(doc["runs"]) == 3
    assert render_summary(runs[:1]) == []
    assert "msg_per_s" in "\n".join(render_summary(runs))
    assert "100 msgs" in render_run(1, runs[0]) and "p99=1.00" in render_run(1, runs[0])
    full = BenchResult("produce", 1, 1, 1.0, 1, latency_stats([0.001, 0.002]))
    assert "min=1.00" in render_run(2, full) and "p999=2.00" in render_run(2, full)
    assert runs[0].mb_per_s == pytest.approx(100 * 1024 / 1024 / 1024)


async def test_produce_count_sends_exactly_that_many_plus_warmup(cluster, remoting, autojump_clock):
    seen: list[int] = []
    r = await bench_produce(
        cluster.namesrv,
        "B",
        size=100,
        batch=3,
        inflight=4,
        count=20,
        progress=seen.append,
        remoting=remoting,
    )
    assert (r.msgs, r.bytes) == (20, 2000)
    assert r.requests == 7  # 6 batches of 3 and one of 2
    assert len(stored(cluster)) == 21  # + the warm-up message
    assert seen and seen[-1] == 20 and seen == sorted(seen)
    assert set(r.latency_ms) >= {"min", "median", "max", "p50", "p90", "p99", "p999"}


async def test_produce_for_a_duration(cluster, remoting):
    # the real clock: the in-memory broker answers at once, so an autojump clock would never
    # move
    r = await bench_produce(
        cluster.namesrv, "B", size=10, inflight=2, count=None, duration=0.2, remoting=remoting
    )
    assert r.msgs > 0 and len(stored(cluster)) == r.msgs + 1
    assert 0.2 <= r.seconds < 5


async def test_produce_failure_ends_the_run(cluster, autojump_clock):
    tap = cluster.tap()
    # the warm-up is stored, then the broker answers "stored, but the slave did not ack"
    tap.fail(cluster.addr(), ResponseCode.SUCCESS, *[ResponseCode.FLUSH_SLAVE_TIMEOUT] * 5)
    async with open_remoting_client(network=tap) as remoting:
        with pytest.raises(BenchError, match="FLUSH_SLAVE_TIMEOUT"):
            await bench_produce(cluster.namesrv, "B", inflight=1, count=10, remoting=remoting)


async def test_produce_rejects_bad_options(cluster, remoting):
    with pytest.raises(BenchError):
        await bench_produce(cluster.namesrv, "B", size=0, remoting=remoting)
    with pytest.raises(BenchError, match="count or a duration"):
        await bench_produce(cluster.namesrv, "B", count=None, remoting=remoting)


async def test_consume_reads_back_everything_or_count(cluster, remoting, autojump_clock):
    ns = cluster.namesrv
    await bench_produce(ns, "B", size=50, inflight=3, count=40, remoting=remoting)
    everything = await bench_consume(ns, "B", batch=7, count=None, duration=60.0, remoting=remoting)
    assert (everything.msgs, everything.bytes) == (41, 41 * 50)
    some = await bench_consume(ns, "B", batch=5, count=10, remoting=remoting)
    assert 10 <= some.msgs <= 10 + 4 * 5  # stops within one pull per queue of the count
    with pytest.raises(BenchError, match="fewer than --count"):
        await bench_consume(ns, "B", count=1000, remoting=remoting)
    with pytest.raises(TopicNotExistError):
        await bench_consume(ns, "Nope", count=1, remoting=remoting)


@pytest.mark.parametrize("kind", ["produce", "consume"])
def test_cli_nameserver_down_is_one_line_exit_1(kind: str) -> None:
    result = CliRunner().invoke(app, ["-n", "127.0.0.1:1", "bench", kind, "--count", "5"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot connect"), result.output
    assert "Traceback" not in result.output


def test_cli_help_has_examples_and_bad_option_is_refused():
    runner = CliRunner()
    for args in (
        ["bench", "--help"],
        ["bench", "produce", "--help"],
        ["bench", "consume", "--help"],
        ["top", "--help"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 0 and "Examples:" in result.output, args
    bad = runner.invoke(app, ["bench", "produce", "--inflight", "0"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


async def test_produce_without_count_or_duration_is_refused_before_storing_anything(
    cluster, remoting, autojump_clock
):
    with pytest.raises(BenchError, match="count or a duration"):
        await bench_produce(cluster.namesrv, "B", count=None, duration=None, remoting=remoting)
    assert stored(cluster) == []  # not even the warm-up message
