"""What one timed scenario costs: wall time, per-message latency, host and per-process CPU.

`Meter` wraps only the timed part (after connecting and warming up). `drive_asyncio` and
`drive_trio` keep `concurrency` sends in flight until `count` have completed, each task
timing its own sends, so the latencies of in-flight scenarios are per message too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.peers.procs import cpu_seconds, host_busy_seconds
from bench.peers.report import percentile

CLIENT = "bench client"


class Meter:
    """CPU seconds of every server process, of this process (the load generator) and of the
    whole host, and the wall time, between __enter__ and __exit__."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids

    def __enter__(self) -> Meter:
        self.cpu0 = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.client0 = time.process_time()
        self.host0 = host_busy_seconds()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.host = host_busy_seconds() - self.host0
        self.client = time.process_time() - self.client0
        self.cpu = {name: cpu_seconds(pid) - self.cpu0[name] for name, pid in self.pids.items()}

    def result(self, msgs: int, latencies: list[float] | None = None) -> dict[str, Any]:
        cpu_us = {name: 1e6 * s / msgs for name, s in self.cpu.items()}
        cpu_us[CLIENT] = 1e6 * self.client / msgs
        out: dict[str, Any] = {
            "msgs": msgs,
            "seconds": self.seconds,
            "rate": msgs / self.seconds,
            "host_cpu_us": 1e6 * self.host / msgs,
            "cpu_us": cpu_us,
        }
        if latencies:
            latencies.sort()
            out["p50_ms"] = percentile(latencies, 50) * 1000
            out["p99_ms"] = percentile(latencies, 99) * 1000
        return out


class _Workers:
    """``concurrency`` copies of ``worker`` share one count of sends and one latency list; the
    worker only awaits ``send``, so asyncio and Trio run the same one."""

    def __init__(self, send: Callable[[], Awaitable[None]], count: int) -> None:
        self.send = send
        self.count = count
        self.issued = 0
        self.latencies: list[float] = []

    async def worker(self) -> None:
        while self.issued < self.count:
            self.issued += 1
            t = time.perf_counter()
            await self.send()
            self.latencies.append(time.perf_counter() - t)


async def drive_asyncio(
    send: Callable[[], Awaitable[None]], count: int, concurrency: int, meter: Meter
) -> dict[str, Any]:
    w = _Workers(send, count)
    with meter:
        await asyncio.gather(*(w.worker() for _ in range(concurrency)))
    return meter.result(count, w.latencies)


async def drive_trio(
    send: Callable[[], Awaitable[None]], count: int, concurrency: int, meter: Meter
) -> dict[str, Any]:
    import trio

    w = _Workers(send, count)
    with meter:
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(w.worker)
    return meter.result(count, w.latencies)


def warmup_count(count: int) -> int:
    """Untimed sends before each send scenario (connections, caches, first file pages)."""
    return max(10, min(200, count // 20))
