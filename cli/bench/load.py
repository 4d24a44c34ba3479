"""`rmq bench produce|consume`: a load generator over the `rmq` client, and its statistics.

Theory of operation: `bench_produce` runs `inflight` tasks on one `Producer`; each takes the
next request while the run is not over (a message `count`, or a `duration` in seconds), sends
`batch` messages of `size` bytes (`send` for one, `send_batch` for more) and records the
request's latency on Trio's clock. Any send that fails, or that the broker stores with a status
other than SEND_OK, ends the run with that error: a benchmark that silently drops failures
measures the wrong thing. `bench_consume` pulls every readable queue of the topic from its
minimum offset, one task per queue, `batch` messages a request, until `count` messages, the
`duration`, or the end of every queue (the queue max offsets read when it starts).

Each run yields a `BenchResult` (messages, bytes, seconds, msg/s, MB/s and, for produce,
latency min/median/max and p50/p90/p99/p99.9 in ms, nearest-rank). `summarize` reduces several
runs to min/median/max of each number. `render_*` format them for people; `to_json` for
scripts. A `progress(done)` callback lets the command draw a progress bar on stderr.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

if TYPE_CHECKING:
    from common.model import MessageQueue
    from rmq.remoting import Remoting

MB = 1024 * 1024
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


class BenchError(Exception):
    """The run could not measure what it was asked to (a failed send, a bad option)."""


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (nan when empty)."""
    if not sorted_values:
        return math.nan
    k = max(0, math.ceil(p / 100.0 * len(sorted_values)) - 1)
    return sorted_values[min(k, len(sorted_values) - 1)]


def latency_stats(latencies_s: list[float]) -> dict[str, float]:
    """min/median/max and the percentiles of request latencies, in milliseconds."""
    values = sorted(x * 1000.0 for x in latencies_s)
    if not values:
        return {}
    out = {"min": values[0], "median": statistics.median(values), "max": values[-1]}
    for p in PERCENTILES:
        out[f"p{p:g}".replace(".", "")] = percentile(values, p)
    return out


@attrs.frozen
class BenchResult:
    kind: str  # "produce" | "consume"
    msgs: int
    bytes: int
    seconds: float
    requests: int = 0
    latency_ms: dict[str, float] = attrs.field(factory=dict)  # produce only

    @property
    def rate(self) -> float:
        return self.msgs / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds > 0 else 0.0

    def numbers(self) -> dict[str, float]:
        """Every number of the run by name (what `summarize` aggregates)."""
        out = {
            "msgs": float(self.msgs),
            "seconds": self.seconds,
            "msg_per_s": self.rate,
            "mb_per_s": self.mb_per_s,
        }
        out.update({f"latency_{k}_ms": v for k, v in self.latency_ms.items()})
        return out


def summarize(results: list[BenchResult]) -> dict[str, dict[str, float]]:
    """name -> {min, median, max} over the runs."""
    names = list(results[0].numbers()) if results else []
    out = {}
    for name in names:
        values = [r.numbers()[name] for r in results if name in r.numbers()]
        out[name] = {"min": min(values), "median": statistics.median(values), "max": max(values)}
    return out


def to_json(results: list[BenchResult], settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "settings": settings,
        "runs": [r.numbers() for r in results],
        "summary": summarize(results),
    }


def _over(count: int | None, duration: float | None) -> Callable[[int], bool]:
    """A predicate telling, from the messages started so far, whether the run is over."""
    if count is None and duration is None:
        raise BenchError("give a message count or a duration")
    deadline = None if duration is None else trio.current_time() + duration

    def over(started: int) -> bool:
        if count is not None and started >= count:
            return True
        return deadline is not None and trio.current_time() >= deadline

    return over


async def bench_produce(
    namesrv: str,
    topic: str,
    *,
    size: int = 1024,
    batch: int = 1,
    inflight: int = 16,
    count: int | None = 10_000,
    duration: float | None = None,
    group: str = "rmq_bench_pg",
    progress: Callable[[int], None] | None = None,
    remoting: Remoting | None = None,
) -> BenchResult:
    """Send messages as fast as `inflight` concurrent requests allow; see the module doc."""
    from rmq import Message, Producer, SendStatus

    if size < 1 or batch < 1 or inflight < 1:
        raise BenchError("size, batch and inflight must be >= 1")
    if count is None and duration is None:
        # refused before the warm-up, which would store a message
        raise BenchError("give a message count or a duration")
    body = (bytes(range(256)) * (size // 256 + 1))[:size]
    latencies: list[float] = []
    started = done = requests = 0
    async with Producer(group, namesrv, remoting=remoting, send_timeout=10.0) as producer:
        # warm-up: route, connection, the broker's first mapped file; not timed
        first = await producer.send(Message(topic, body))
        if first.status is not SendStatus.SEND_OK:
            raise BenchError(f"the broker stored the warm-up message with {first.status.name}")
        over = _over(count, duration)
        t0 = trio.current_time()

        async def worker() -> None:
            nonlocal started, done, requests
            while not over(started):
                n = batch if count is None else min(batch, count - started)
                started += n
                s = trio.current_time()
                if n == 1:
                    result = await producer.send(Message(topic, body))
                else:
                    result = await producer.send_batch([Message(topic, body) for _ in range(n)])
                latencies.append(trio.current_time() - s)
                if result.status is not SendStatus.SEND_OK:
                    raise BenchError(f"the broker stored a send with {result.status.name}")
                done += n
                requests += 1
                if progress is not None:
                    progress(done)

        async with trio.open_nursery() as nursery:
            for _ in range(inflight):
                nursery.start_soon(worker)
        seconds = trio.current_time() - t0
    return BenchResult("produce", done, done * size, seconds, requests, latency_stats(latencies))


async def bench_consume(
    namesrv: str,
    topic: str,
    *,
    batch: int = 32,
    count: int | None = None,
    duration: float | None = None,
    group: str = "rmq_bench_cg",
    progress: Callable[[int], None] | None = None,
    remoting: Remoting | None = None,
) -> BenchResult:
    """Pull the topic from the start of each queue; see the module doc."""
    from rmq import PullConsumer, PullStatus

    if not 1 <= batch <= 1024:
        raise BenchError("batch must be within 1..1024")
    done = nbytes = requests = 0
    async with PullConsumer(group, namesrv, remoting=remoting, timeout=10.0) as consumer:
        queues = await consumer.fetch_queues(topic)
        starts = {mq: await consumer.min_offset(mq) for mq in queues}
        ends = {mq: await consumer.max_offset(mq) for mq in queues}
        total = sum(max(0, ends[mq] - starts[mq]) for mq in queues)
        if count is not None and count > total:
            raise BenchError(f"topic {topic} holds {total} messages, fewer than --count {count}")
        over = _over(count, duration)
        t0 = trio.current_time()

        async def drain(mq: MessageQueue) -> None:
            nonlocal done, nbytes, requests
            offset = starts[mq]
            while offset < ends[mq] and not over(done):
                r = await consumer.pull(mq, offset, min(batch, ends[mq] - offset))
                requests += 1
                if r.status is PullStatus.OFFSET_ILLEGAL:
                    offset = max(r.min_offset, min(r.next_begin_offset, ends[mq]))
                    continue
                if r.status is not PullStatus.FOUND or not r.messages:
                    break  # nothing more here (e.g. a slave that is behind)
                done += len(r.messages)
                nbytes += sum(len(m.body) for m in r.messages)
                offset = r.next_begin_offset
                if progress is not None:
                    progress(done)

        async with trio.open_nursery() as nursery:
            for mq in queues:
                nursery.start_soon(drain, mq)
        seconds = trio.current_time() - t0
    return BenchResult("consume", done, nbytes, seconds, requests)


# --- printing --------------------------------------------------------------------------------


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


def render_run(i: int, r: BenchResult) -> str:
    """One line per run."""
    line = (
        f"run {i}: {r.msgs:,} msgs in {r.seconds:.2f} s  {_fmt(r.rate)} msg/s  "
        f"{r.mb_per_s:.2f} MB/s"
    )
    if r.latency_ms:
        lat = r.latency_ms
        line += "  latency ms " + " ".join(
            f"{k}={_fmt(lat[k])}"
            for k in ("min", "median", "max", "p50", "p90", "p99", "p999")
            if k in lat
        )
    return line


def render_summary(results: list[BenchResult]) -> list[str]:
    """min / median / max of each number across runs (only when there are several)."""
    if len(results) < 2:
        return []
    lines = [f"over {len(results)} runs (min / median / max):"]
    for name, agg in summarize(results).items():
        lines.append(
            f"  {name:<20} {_fmt(agg['min'])} / {_fmt(agg['median'])} / {_fmt(agg['max'])}"
        )
    return lines
