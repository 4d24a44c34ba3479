"""A steady producer rides through DLedger leader kills: latency, no errors.

A 3-member DLedger group of real processes (rmq up's laptop timing) serves one producer of our
client with its defaults (send timeout 3 s, 2 retries), one send at a time.  Several times the
leader gets SIGKILL and is restarted a moment later (as tests/integration/test_dledger_kill.py
does).  No send may raise: while the group has no master in the nameserver's route the
producer waits for one (rmq/producer.py, "Riding through a failover").  Printed per run:
kill -> next acknowledgement (the first SEND_OK of a send begun after the kill, as in the
kill test) p50 and max, and the longest single send.

RMQ_RIDE_KILLS=10 runs the 10 kills of bench/run_failover_ride_bench.py (make test: 4).
"""

from __future__ import annotations

import os
import random
import statistics
from typing import TYPE_CHECKING

import pytest
import trio

from rmq import Message, Producer
from rmq.producer import SendStatus

if TYPE_CHECKING:
    from common.remoting.client import RemotingClient
    from tests.integration.conftest import DLedgerFactory

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "RideThrough"
KILLS = int(os.environ.get("RMQ_RIDE_KILLS", "4"))


@pytest.mark.timeout(60 + 15 * KILLS)
async def test_a_steady_producer_sees_no_error_across_leader_kills(
    dledger_factory: DLedgerFactory, raft_client: RemotingClient
) -> None:
    group = await dledger_factory(3)
    leader = await group.leader(raft_client, timeout=60)
    await group.create_topic(raft_client, TOPIC, queues=4)

    errors: list[BaseException] = []
    acked = 0
    longest = 0.0
    stop = trio.Event()
    # (kill time, set by the first acknowledgement of a send begun after it, its time)
    watch: list[tuple[float, trio.Event, list[float]]] = []

    async def produce() -> None:
        nonlocal acked, longest
        n = 0
        async with Producer("ride-through-pg", group.namesrv_addr) as producer:
            while not stop.is_set():
                n += 1
                started = trio.current_time()
                try:
                    r = await producer.send(Message(TOPIC, b"x" * 256, keys=f"k{n}"))
                except Exception as exc:  # what the application would see
                    errors.append(exc)
                    continue
                now = trio.current_time()
                longest = max(longest, now - started)
                assert r.status is SendStatus.SEND_OK
                acked += 1
                if watch and started > watch[-1][0] and not watch[-1][1].is_set():
                    watch[-1][2].append(now)
                    watch[-1][1].set()
                await trio.sleep(0.01)  # steady: about 100 sends a second

    rng = random.Random()
    kill_to_ack: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        for _ in range(KILLS):
            await trio.sleep(rng.uniform(1.0, 2.0))
            killed_at = trio.current_time()
            first_ack = trio.Event()
            watch.append((killed_at, first_ack, []))
            group.kill(leader)
            await trio.sleep(rng.uniform(0.2, 1.0))
            group.restart(leader)
            with trio.fail_after(30):
                await first_ack.wait()
            kill_to_ack.append(watch[-1][2][0] - killed_at)
            leader = await group.leader(raft_client, timeout=30)
        stop.set()

    print(
        f"\nride-through: {KILLS} leader kills, {acked} acknowledged, {len(errors)} send errors "
        f"surfaced; kill -> next ack p50 {statistics.median(kill_to_ack):.2f} s, "
        f"max {max(kill_to_ack):.2f} s; longest send {longest:.2f} s"
    )
    assert errors == [], f"{len(errors)} sends raised, first: {errors[0]!r}"
    assert acked > 20 * KILLS
