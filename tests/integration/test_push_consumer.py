"""Push consumers as separate OS processes against a real nameserver + broker.

Three consumers of one group share a topic of 8 queues; 30,000 messages must each be
delivered exactly once while the group is stable, and when one consumer is SIGKILLed mid-run
the broker sees its connection close, tells the group, and the survivors take its queues
within 30 s, losing nothing. Duplicates can only come from messages the killed consumer had
processed but not yet committed; they are counted and reported.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from rmq import Admin, Message, Producer

if TYPE_CHECKING:
    from tests.conftest import ProcessGroup

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHILD = Path(__file__).with_name("push_consumer_child.py")
TOPIC = "PushIT"
GROUP = "push_it"
QUEUES = 8
TOTAL = 30_000
BATCH = 100
ALL_QUEUES = {f"broker-a:{i}" for i in range(QUEUES)}


async def start_servers(procs: ProcessGroup) -> str:
    ns = procs.namesrv()
    procs.broker(
        "broker", namesrvAddr=ns.addr, brokerRole="ASYNC_MASTER", flushDiskType="ASYNC_FLUSH"
    )
    with trio.fail_after(30):
        while True:
            try:
                async with Admin(ns.addr) as admin:
                    info = await admin.cluster_info()
                    if "broker-a" in info.brokerAddrTable:
                        await admin.create_topic(TOPIC, queues=QUEUES)
                        return ns.addr
            except Exception:
                pass
            await trio.sleep(0.2)


def spawn(ns: str, out: Path, name: str) -> subprocess.Popen[bytes]:
    with open(out / f"{name}.stderr", "ab") as log:  # the child keeps its own copy
        return subprocess.Popen(
            [sys.executable, str(CHILD), ns, GROUP, TOPIC, str(out), name],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def owned(out: Path, name: str) -> set[str]:
    try:
        return set((out / f"{name}.queues").read_text().split())
    except OSError:
        return set()


def partitioned(out: Path, names: list[str]) -> bool:
    shares = [owned(out, n) for n in names]
    union = set().union(*shares)
    # every member holds a share (one that has not joined yet owns nothing)
    return union == ALL_QUEUES and sum(map(len, shares)) == QUEUES and all(shares)


async def wait_partitioned(out: Path, names: list[str], limit: float) -> float:
    start = time.monotonic()
    with trio.fail_after(limit):
        while not partitioned(out, names):  # noqa: ASYNC110 (the state is in files of other processes)
            await trio.sleep(0.1)
    return time.monotonic() - start


def deliveries(out: Path, names: list[str]) -> list[tuple[float, str]]:
    got = []
    for n in names:
        path = out / f"{n}.log"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) == 2:  # a SIGKILL may cut the last line
                got.append((float(parts[0]), parts[1]))
    return got


async def wait_all(out: Path, names: list[str], limit: float) -> list[tuple[float, str]]:
    with trio.fail_after(limit):
        while True:
            got = deliveries(out, names)
            if len({b for _, b in got}) >= TOTAL:
                return got
            await trio.sleep(0.5)


async def produce(ns: str, start: int, stop: int) -> None:
    async with Producer("push_it_pg", ns) as p:
        for i in range(start, stop, BATCH):
            await p.send_batch(
                [Message(TOPIC, f"m{j}".encode()) for j in range(i, min(stop, i + BATCH))]
            )


def stop_children(children: Collection[subprocess.Popen[bytes]]) -> None:
    for c in children:
        if c.poll() is None:
            c.terminate()
    for c in children:
        try:
            c.wait(timeout=15)
        except subprocess.TimeoutExpired:
            c.kill()
            c.wait(timeout=5)


async def test_three_consumers_receive_every_message_exactly_once(procs, tmp_path):
    ns = await start_servers(procs)
    out = tmp_path / "out"
    out.mkdir()
    names = ["c1", "c2", "c3"]
    children = [spawn(ns, out, n) for n in names]
    try:
        await wait_partitioned(out, names, 60)
        await produce(ns, 0, TOTAL)
        got = await wait_all(out, names, 90)
        await trio.sleep(2)  # anything delivered twice would show up now
        got = deliveries(out, names)
        counts = collections.Counter(b for _, b in got)
        assert set(counts) == {f"m{i}" for i in range(TOTAL)}
        dups = {b: n for b, n in counts.items() if n > 1}
        assert not dups, f"{len(dups)} messages delivered more than once, e.g. {list(dups)[:5]}"
        per = {n: len(deliveries(out, [n])) for n in names}
        print(f"deliveries per consumer: {per}")
        assert all(per.values()), per  # every member did its share
    finally:
        stop_children(children)


async def test_a_killed_consumer_hands_its_queues_over_and_nothing_is_lost(
    procs, tmp_path, record_property
):
    ns = await start_servers(procs)
    out = tmp_path / "out"
    out.mkdir()
    names = ["k1", "k2", "k3"]
    children = dict(zip(names, (spawn(ns, out, n) for n in names), strict=True))
    try:
        await wait_partitioned(out, names, 60)
        async with trio.open_nursery() as nursery:
            # the kill lands while messages are still being produced and consumed
            nursery.start_soon(produce, ns, 0, TOTAL)
            with trio.fail_after(60):
                while len(deliveries(out, ["k2"])) < 1000:  # noqa: ASYNC110 (files of other processes)
                    await trio.sleep(0.05)
            # taken before the signal: the survivors may take k2's queues over and deliver
            # again before this process, on a busy machine, runs its next line
            killed_at = time.time()
            children["k2"].kill()
            children["k2"].wait(timeout=10)
            produced_by_kill = len(deliveries(out, names))
            handover = await wait_partitioned(out, ["k1", "k3"], 30)
        got = await wait_all(out, names, 90)
        await trio.sleep(2)
        got = deliveries(out, names)
        counts = collections.Counter(b for _, b in got)
        assert set(counts) == {f"m{i}" for i in range(TOTAL)}  # nothing lost
        first_seen: dict[str, float] = {}
        dup_before_kill = 0
        for ts, body in sorted(got):
            if body in first_seen and ts <= killed_at:
                dup_before_kill += 1
            first_seen.setdefault(body, ts)
        dups = sum(n - 1 for n in counts.values() if n > 1)
        report = (
            f"SIGKILL after {produced_by_kill} of {TOTAL} deliveries; handover {handover:.1f}s;"
            f" {dups} duplicate deliveries (all after the kill)"
        )
        print(report)
        record_property("push_consumer_kill", report)
        assert dup_before_kill == 0, f"{dup_before_kill} duplicates before the kill"
    finally:
        stop_children(children.values())


async def in_process_servers(nursery: trio.Nursery, tmp_path: Path) -> str:
    from broker.config import BrokerConfig
    from broker.service import run_broker
    from broker.store import MessageStoreConfig, run_memory_store
    from namesrv.config import NamesrvConfig
    from namesrv.service import run_namesrv

    ns = await nursery.start(
        run_namesrv, NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kv.json"))
    )
    ns_addr = f"127.0.0.1:{ns.port}"
    config = BrokerConfig(
        listen_port=0,
        namesrv_addr=ns_addr,
        store=MessageStoreConfig(store_path_root_dir=tmp_path / "store"),
    )
    await nursery.start(
        lambda task_status: run_broker(
            config, store_factory=run_memory_store, task_status=task_status
        )
    )
    with trio.fail_after(10):
        while True:
            async with Admin(ns_addr) as admin:
                if "broker-a" in (await admin.cluster_info()).brokerAddrTable:
                    await admin.create_topic("OT", queues=4)
                    return ns_addr
            await trio.sleep(0.05)


async def test_orderly_locks_and_retry_through_the_real_broker(tmp_path, nursery):
    from rmq import ConsumeFromWhere, ConsumeStatus, OrderlyStatus, PushConsumer

    ns = await in_process_servers(nursery, tmp_path)
    async with Producer("pg", ns) as p:
        for i in range(40):
            await p.send(Message("OT", f"{i}".encode(), tags="a" if i % 2 else "b"))
    got: list[tuple[int, int]] = []
    suspended = 0

    async def orderly(msgs):
        nonlocal suspended
        if msgs[0].body == b"5" and suspended < 2:
            suspended += 1
            return OrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        got.extend((m.queue_id, m.queue_offset) for m in msgs)

    c = PushConsumer("og", ns, consume_from=ConsumeFromWhere.FIRST_OFFSET)
    c.subscribe("OT", "a || b")
    c.register_orderly_listener(orderly)
    async with c:
        with trio.fail_after(30):
            while len(got) < 40:  # noqa: ASYNC110 (plain predicate)
                await trio.sleep(0.1)
        assert c.assigned_queues()
    assert suspended == 2
    for q in range(4):
        offsets = [o for qq, o in got if qq == q]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)

    # concurrent: one failure goes back through %RETRY% (broker delay level 3 = 10 s)
    seen: list[tuple[bytes, int, str]] = []

    async def failing_once(msgs):
        seen.extend((m.body, m.reconsume_times, m.topic) for m in msgs)
        if msgs[0].body == b"7" and msgs[0].reconsume_times == 0:
            return ConsumeStatus.RECONSUME_LATER

    c = PushConsumer("cg2", ns, consume_from=ConsumeFromWhere.FIRST_OFFSET)
    c.subscribe("OT", "a")
    c.register_listener(failing_once)
    async with c:
        with trio.fail_after(40):
            while len(seen) < 21:  # noqa: ASYNC110 (plain predicate)
                await trio.sleep(0.1)
    assert sorted(b for b, _, _ in seen).count(b"7") == 2
    assert (b"7", 1, "OT") in seen  # redelivered under its own topic, reconsumeTimes 1
    assert {b for b, _, _ in seen} == {f"{i}".encode() for i in range(1, 40, 2)}
