"""trio-rmq through `rmq up` (bench/cluster.py), driven by its own client (`rmq`, Trio).

Setups: SYNC_MASTER + one slave (a send returns after the slave has the message), a DLedger
group of 3 (after a quorum appended it), and an ASYNC_MASTER alone (the asynchronous case:
trio-rmq's asynchronous replication is a master whose slave catches up later, and a lone
master is its upper bound; no slave runs). One topic per body size with 8 queues; consuming
is `PullConsumer.pull` over every queue from offset 0 to its end, one task per queue, 32
messages a pull (the broker's per-pull limit, as in RocketMQ).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.cluster import ROOT, Cluster, start_cluster
from bench.peers.measure import Meter, drive_trio, warmup_count

SETUPS: dict[str, tuple[tuple[str, ...], int, tuple[str, ...]]] = {
    # name: (`rmq up` arguments, broker nodes, scenarios)
    "trio-rmq SYNC_MASTER+slave": (
        ("--slaves", "1", "--role", "SYNC_MASTER"),
        2,
        ("one", "inflight", "batch", "consume"),
    ),
    "trio-rmq DLedger 3": (("--dledger", "3"), 3, ("one", "inflight", "batch", "consume")),
    "trio-rmq ASYNC_MASTER alone": (
        ("--slaves", "0", "--role", "ASYNC_MASTER"),
        1,
        ("async", "consume"),
    ),
}
# DLedger members as a user deploying them writes broker.conf: RocketMQ's DLedgerConfig timing
# (a heartbeat every 2 s, a leader given up after 3, votes 300-1000 ms) and nothing about batch
# push, so the member's default decides it (`rmq up --dledger` would set laptop timing)
BROKER_CONF_DEFAULTS = "trio-rmq DLedger 3, broker.conf defaults"
SETUPS[BROKER_CONF_DEFAULTS] = (("--dledger", "3"), 3, ("one", "inflight", "batch"))
UP_BROKER_CONF: dict[str, dict[str, str]] = {
    BROKER_CONF_DEFAULTS: {
        "heartBeatTimeIntervalMs": "2000",
        "maxHeartBeatLeak": "3",
        "minVoteIntervalMs": "300",
        "maxVoteIntervalMs": "1000",
    }
}
# a base checkout (`--base`) of the tree before batch push became the default: its `rmq up`
# sets isEnableBatchPush itself, so a plain broker.conf's (its default, off) is said here
BASE_BROKER_CONF: dict[str, dict[str, str]] = {BROKER_CONF_DEFAULTS: {"isEnableBatchPush": "false"}}
BASE_SUFFIX = " (base)"
QUEUES = 8
PULL = 32
BATCH = 32


class RmqSystem:
    def __init__(self, name: str, cluster: Cluster) -> None:
        self.name = name
        self.scenarios = SETUPS[name.removesuffix(BASE_SUFFIX)][2]
        self.cluster = cluster
        self.topics: set[int] = set()

    @property
    def ready_seconds(self) -> float:
        return self.cluster.ready_seconds

    def pids(self) -> dict[str, int]:
        return {"rmq up": self.cluster.proc.pid, **self.cluster.node_pids}

    def run(self, scenario: str, body: bytes, count: int, concurrency: int) -> dict[str, Any]:
        import trio

        if self.cluster.proc.poll() is not None:
            raise RuntimeError(f"`rmq up` exited:\n{self.cluster.output()}")
        topic = f"PeerBench{len(body)}"
        if len(body) not in self.topics:
            trio.run(self._create_topic, topic)
            self.topics.add(len(body))
        if scenario == "consume":
            return trio.run(self._consume, topic, len(body))
        return trio.run(self._send, scenario, topic, body, count, concurrency)

    async def _create_topic(self, topic: str) -> None:
        import trio

        from rmq import Admin, PullConsumer

        async with Admin(self.cluster.namesrv_addr) as admin:
            await admin.create_topic(topic, queues=QUEUES)
        async with PullConsumer("peer_probe", self.cluster.namesrv_addr) as c:
            with trio.fail_after(20):
                while True:
                    try:
                        if len(await c.fetch_queues(topic)) == QUEUES:
                            return
                    except Exception:  # routed once the broker re-registers
                        pass
                    await trio.sleep(0.05)

    async def _send(
        self, scenario: str, topic: str, body: bytes, count: int, concurrency: int
    ) -> dict[str, Any]:
        from rmq import Message, Producer, SendResult, SendStatus

        def check(result: SendResult) -> None:
            if result.status is not SendStatus.SEND_OK:
                raise RuntimeError(f"send answered {result.status}, expected SEND_OK")

        async with Producer("peer_pg", self.cluster.namesrv_addr, send_timeout=10) as p:

            async def send() -> None:
                check(await p.send(Message(topic, body)))

            async def send_batch() -> None:
                check(await p.send_batch([Message(topic, body) for _ in range(BATCH)]))

            for _ in range(warmup_count(count)):
                await send()
            meter = Meter(self.pids())
            if scenario == "batch":
                batches = count // BATCH
                await drive_trio(send_batch, batches, 1, meter)
                # per message, not per batch (and no per-message latency)
                return meter.result(batches * BATCH)
            return await drive_trio(send, count, 1 if scenario == "one" else concurrency, meter)

    async def _consume(self, topic: str, size: int) -> dict[str, Any]:
        import trio

        from common.model import MessageQueue
        from rmq import PullConsumer, PullStatus

        async with PullConsumer("peer_cg", self.cluster.namesrv_addr, timeout=10) as c:
            queues = await c.fetch_queues(topic)
            ends = {mq: await c.max_offset(mq) for mq in queues}
            expected = sum(ends.values())
            for mq in queues:  # warm-up, untimed: connection, route, first pages
                await c.pull(mq, 0, 1)
            got, bad = 0, 0

            async def drain(mq: MessageQueue) -> None:
                nonlocal got, bad
                offset = 0
                while offset < ends[mq]:
                    r = await c.pull(mq, offset, PULL)
                    if r.status is not PullStatus.FOUND or not r.messages:
                        raise RuntimeError(f"pull {mq.queueId}@{offset} gave {r.status}")
                    got += len(r.messages)
                    bad += sum(1 for m in r.messages if len(m.body) != size)
                    offset = r.next_begin_offset

            with Meter(self.pids()) as meter:
                async with trio.open_nursery() as nursery:
                    for mq in queues:
                        nursery.start_soon(drain, mq)
        if got != expected or bad:
            raise RuntimeError(f"pulled {got} of {expected} messages, {bad} bad bodies")
        return meter.result(got) | {"expected": expected}


@contextlib.contextmanager
def start(tmp: Path, name: str, base: Path | None = None) -> Iterator[RmqSystem]:
    """Setup `name` from this tree, or from the checkout `base` (named `name (base)`)."""
    args, brokers, _ = SETUPS[name]
    conf = dict(UP_BROKER_CONF.get(name, {}))
    if base is not None:
        conf.update(BASE_BROKER_CONF.get(name, {}))
    if conf:
        toml = tmp / "up.toml"
        toml.write_text("[broker_conf]\n" + "".join(f'{k} = "{v}"\n' for k, v in conf.items()))
        args = (*args, "--config", str(toml))
    root = ROOT if base is None else base
    with start_cluster(tmp / "rmq", *args, brokers=brokers, ready_timeout=60, root=root) as cluster:
        yield RmqSystem(name + (BASE_SUFFIX if base is not None else ""), cluster)
