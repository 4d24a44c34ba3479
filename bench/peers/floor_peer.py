"""The floor chain of `bench/run_floor_chain.py` as a peer: the ceiling of this design (issue 28).

Three Trio processes on loopback doing only the hops of a SYNC_MASTER send: this process (the
client) writes 4 bytes of length and the body, the master forwards each frame to the slave, the
slave answers 8 bytes, the master answers the client 100 bytes. No store, no codec. It runs in
the same run as Redis, NATS and trio-rmq, so trio-rmq's rate can be read against it beside
theirs. One at a time is one task that writes and reads its own socket; 32 in flight is one
writer task holding 32 frames outstanding and one reader task, as in `run_floor_chain.py`. The
chain answers in order, so each frame's latency is its answer's time minus its write's time.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.peers.measure import Meter, warmup_count

NAME = "Trio floor chain (3 processes, no store, no codec)"
SCENARIOS = ("one", "inflight")


class FloorSystem:
    name = NAME
    scenarios = SCENARIOS

    def __init__(self, port: int, pids: dict[str, int], ready_seconds: float) -> None:
        self.port = port
        self._pids = pids
        self.ready_seconds = ready_seconds

    def pids(self) -> dict[str, int]:
        return self._pids

    def run(self, scenario: str, body: bytes, count: int, concurrency: int) -> dict[str, Any]:
        import trio

        return trio.run(self._run, scenario, body, count, 1 if scenario == "one" else concurrency)

    async def _run(self, scenario: str, body: bytes, count: int, inflight: int) -> dict[str, Any]:
        import trio

        from bench.run_floor_chain import _LEN, ANSWER, _nodelay

        frame = _LEN.pack(len(body)) + body
        stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        _nodelay(stream)
        async with stream:
            pending = 0  # answer bytes read but not yet a whole answer

            async def answers() -> int:
                nonlocal pending
                pending += len(await stream.receive_some(65536))
                n, pending = divmod(pending, ANSWER)
                return n

            async def one(n: int, lat: list[float]) -> None:
                for _ in range(n):
                    t0 = time.perf_counter()
                    await stream.send_all(frame)
                    while not await answers():
                        pass
                    lat.append(time.perf_counter() - t0)

            async def pipelined(n: int, lat: list[float]) -> None:
                slots = trio.Semaphore(inflight)
                sent: collections.deque[float] = collections.deque()

                async def writer() -> None:
                    for _ in range(n):
                        await slots.acquire()
                        sent.append(time.perf_counter())
                        await stream.send_all(frame)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(writer)
                    done = 0
                    while done < n:
                        got = await answers()
                        now = time.perf_counter()
                        for _ in range(got):
                            lat.append(now - sent.popleft())
                            slots.release()
                        done += got

            drive = one if inflight == 1 else pipelined
            await drive(warmup_count(count), [])
            lat: list[float] = []
            with Meter(self.pids()) as meter:
                await drive(count, lat)
            return meter.result(count, lat)


@contextlib.contextmanager
def start(tmp: Path) -> Iterator[FloorSystem]:
    """The chain's slave and master processes (`tmp` is unused: the chain keeps nothing)."""
    from bench.run_floor_chain import floor_chain

    t0 = time.perf_counter()
    with floor_chain("floor") as (port, pids):
        yield FloorSystem(
            port,
            {"floor master": pids["master"], "floor slave": pids["slave"]},
            time.perf_counter() - t0,
        )
