"""Redis streams, primary + one replica, driven by redis-py's asyncio client.

Synchronous replication is `XADD` followed by `WAIT 1 <timeout>` on the same connection (sent
as one pipeline, so one round trip per message; WAIT answers once the replica has
acknowledged every write of that connection so far). Asynchronous is `XADD` alone.
Consumption is `XRANGE` in pages of 1,000 from the first entry to the last.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.peers.measure import Meter, drive_asyncio, warmup_count
from bench.peers.procs import AsyncioSystem, Servers, free_ports, wait_accepting

NAME = "Redis primary+replica"
SCENARIOS = ("one", "inflight", "async", "consume")
WAIT_TIMEOUT_MS = 5000
PAGE = 1000


class RedisSystem(AsyncioSystem):
    name = NAME
    scenarios = SCENARIOS

    def __init__(self, servers: Servers, port: int) -> None:
        super().__init__(servers)
        self.port = port

    async def _run(
        self, scenario: str, body: bytes, count: int, concurrency: int
    ) -> dict[str, Any]:
        import redis.asyncio as aioredis

        stream = f"bench{len(body)}"
        client = aioredis.Redis(port=self.port, max_connections=concurrency + 4)
        try:
            if scenario == "consume":
                return await self._consume(client, stream, len(body))
            replicated = scenario != "async"
            fields = {b"b": body}

            async def send() -> None:
                if not replicated:
                    await client.xadd(stream, fields)  # type: ignore[arg-type]
                    return
                async with client.pipeline(transaction=False) as pipe:
                    pipe.xadd(stream, fields)  # type: ignore[arg-type]
                    pipe.wait(1, WAIT_TIMEOUT_MS)
                    _, acked = await pipe.execute()
                if acked < 1:
                    raise RuntimeError(f"WAIT: the replica acknowledged {acked} (need 1)")

            for _ in range(warmup_count(count)):
                await send()
            n = 1 if scenario == "one" else concurrency
            return await drive_asyncio(send, count, n, Meter(self.pids()))
        finally:
            await client.aclose()

    async def _consume(self, client: Any, stream: str, size: int) -> dict[str, Any]:
        expected = await client.xlen(stream)
        first = await client.xrange(stream, count=1)  # warm-up, untimed
        if not first:
            raise RuntimeError(f"stream {stream} is empty")
        got, bad, start = 0, 0, "-"
        with Meter(self.pids()) as meter:
            while True:
                page = await client.xrange(stream, min=start, max="+", count=PAGE)
                if not page:
                    break
                got += len(page)
                bad += sum(1 for _, f in page if len(f[b"b"]) != size)
                start = "(" + page[-1][0].decode()
        if got != expected or bad:
            raise RuntimeError(f"XRANGE read {got} of {expected} entries, {bad} bad bodies")
        return meter.result(got) | {"expected": expected}


def _replica_up(port: int) -> bool:
    import redis

    with redis.Redis(port=port, socket_timeout=1) as r:
        info = r.info("replication")
    return info.get("master_link_status") == "up"


@contextlib.contextmanager
def start(tmp: Path, timeout: float = 30.0) -> Iterator[RedisSystem]:
    primary, replica = free_ports(2)
    servers = Servers()
    deadline = time.monotonic() + timeout
    try:
        for name, port, extra in (
            ("redis primary", primary, []),
            ("redis replica", replica, ["--replicaof", "127.0.0.1", str(primary)]),
        ):
            d = tmp / name.replace(" ", "-")
            d.mkdir()
            cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d)]
            # no diskless-sync delay: the default waits 5 s for more replicas before the first
            # full sync, which would be most of the measured start-up
            cmd += ["--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"]
            cmd += extra
            servers.spawn(name, cmd, d / "server.log")
        wait_accepting([primary, replica], deadline)
        while not _replica_up(replica):
            servers.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis replica never reported master_link_status:up")
            time.sleep(0.01)
        servers.mark_ready()
        yield RedisSystem(servers, primary)
    finally:
        servers.stop()
