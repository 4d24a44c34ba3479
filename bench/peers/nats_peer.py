"""NATS JetStream, one server (R1) or a 3-node cluster (R3), driven by nats-py (asyncio).

A publish is `js.publish`, which returns once the stream's leader answers with a PubAck; on
an R3 stream that is after a quorum (2 of 3) stored it: the synchronously replicated case.
JetStream has no asynchronously replicated mode, so that scenario is left out. Consumption
is a pull consumer (no acks, from the first message) fetching batches of 1,000.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.peers.measure import Meter, drive_asyncio, warmup_count
from bench.peers.procs import AsyncioSystem, Servers, free_ports, wait_accepting

NAMES = {1: "NATS JetStream R1", 3: "NATS JetStream R3"}
SCENARIOS = ("one", "inflight", "consume")
FETCH = 1000


def _stream(size: int) -> tuple[str, str]:
    return f"BENCH{size}", f"bench.{size}"


class NatsSystem(AsyncioSystem):
    scenarios = SCENARIOS

    def __init__(self, servers: Servers, ports: list[int], replicas: int) -> None:
        self.name = NAMES[replicas]
        super().__init__(servers)
        self.url = f"nats://127.0.0.1:{ports[0]}"
        self.replicas = replicas
        self.streams: set[int] = set()

    async def _run(
        self, scenario: str, body: bytes, count: int, concurrency: int
    ) -> dict[str, Any]:
        import nats

        nc = await nats.connect(self.url, max_reconnect_attempts=0)
        try:
            js = nc.jetstream(timeout=10)
            name, subject = _stream(len(body))
            if len(body) not in self.streams:
                await self._add_stream(js, name, subject)
                self.streams.add(len(body))
            if scenario == "consume":
                return await self._consume(js, name, subject, len(body))

            async def send() -> None:
                ack = await js.publish(subject, body, stream=name)
                if ack.stream != name or not ack.seq:
                    raise RuntimeError(f"unexpected PubAck {ack}")

            for _ in range(warmup_count(count)):
                await send()
            n = 1 if scenario == "one" else concurrency
            return await drive_asyncio(send, count, n, Meter(self.pids()))
        finally:
            await nc.close()

    async def _add_stream(self, js: Any, name: str, subject: str) -> None:
        from nats.js.api import StorageType, StreamConfig

        config = StreamConfig(
            name=name, subjects=[subject], num_replicas=self.replicas, storage=StorageType.FILE
        )
        # right after start-up an R3 stream can need a moment for its peers to be current
        deadline = time.monotonic() + 30
        while True:
            try:
                await js.add_stream(config)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    async def _consume(self, js: Any, name: str, subject: str, size: int) -> dict[str, Any]:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        expected = (await js.stream_info(name)).state.messages
        config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
        sub = await js.pull_subscribe(subject, durable="bench", stream=name, config=config)
        got, bad = 0, 0
        with Meter(self.pids()) as meter:
            while got < expected:
                msgs = await sub.fetch(min(FETCH, expected - got), timeout=10)
                got += len(msgs)
                bad += sum(1 for m in msgs if len(m.data) != size)
        await sub.unsubscribe()
        await js.delete_consumer(name, "bench")
        if got != expected or bad:
            raise RuntimeError(f"fetched {got} of {expected} messages, {bad} bad bodies")
        return meter.result(got) | {"expected": expected}


async def _jetstream_ready(url: str) -> bool:
    import nats

    try:
        nc = await nats.connect(url, max_reconnect_attempts=0, connect_timeout=1)
    except Exception:
        return False
    try:
        await nc.jetstream(timeout=1).account_info()
        return True
    except Exception:
        return False
    finally:
        await nc.close()


@contextlib.contextmanager
def start(tmp: Path, replicas: int, timeout: float = 30.0) -> Iterator[NatsSystem]:
    ports = free_ports(2 * replicas)
    client, routes = ports[:replicas], ports[replicas:]
    servers = Servers()
    deadline = time.monotonic() + timeout
    try:
        for i in range(replicas):
            d = tmp / f"nats-{i}"
            d.mkdir()
            cmd = ["nats-server", "-a", "127.0.0.1", "-p", str(client[i]), "-js", "-sd", str(d)]
            cmd += ["--server_name", f"n{i}"]
            if replicas > 1:
                others = ",".join(f"nats://127.0.0.1:{p}" for j, p in enumerate(routes) if j != i)
                cmd += ["--cluster_name", "bench", "--cluster", f"nats://127.0.0.1:{routes[i]}"]
                cmd += ["--routes", others]
            servers.spawn(f"nats n{i}", cmd, d / "server.log")
        wait_accepting(client, deadline)
        # ready: every node answers JetStream requests (in a cluster: a meta leader exists)
        for port in client:
            while not asyncio.run(_jetstream_ready(f"nats://127.0.0.1:{port}")):
                servers.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"JetStream on port {port} not ready in time")
                time.sleep(0.02)
        servers.mark_ready()
        yield NatsSystem(servers, client, replicas)
    finally:
        servers.stop()
