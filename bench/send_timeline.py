"""Where one SYNC_MASTER send spends its time, process by process, one send at a time.

    .venv/bin/python bench/send_timeline.py [--count 5000] [--rounds 3]

Theory of operation. A one-at-a-time send is a relay: the client works, then the master, the
slave, the master again and the client again, each woken by the write of the one before. CPU
per send per process says how much each works in all, not what the send waits for. This script
takes timestamps in all three processes at the points of that relay and lines them up:
``time.perf_counter_ns`` is CLOCK_MONOTONIC, one clock for every process on the host.

The points are function entries and exits, hooked in at start-up, so nothing in the product
changes. The driver writes a ``sitecustomize`` module into a temporary directory and puts it
first on PYTHONPATH, with this checkout's root in RMQ_TIMELINE_ROOT. Every process of
`rmq up --slaves 1 --role SYNC_MASTER` (started by ``bench.cluster.detached_cluster``) then
imports the product from this checkout and installs :func:`install_hooks`. The client (this
process, ``await Producer.send`` as in ``bench/run_floor_chain.py``) installs them itself:

* ``send`` / ``done``: ``Producer.send`` entered / returned (client);
* ``write0`` / ``write1``: ``Channel._write_nowait`` entered / returned: a request leaving
  the client, an answer leaving the master (the write syscall is most of the span);
* ``read``: ``FrameDecoder.feed`` entered: the first work after a read of the socket (master:
  the request; client: the answer);
* ``ha0`` / ``ha1``: ``HAMaster._write_inline`` entered / returned (the transfer to the slave);
* ``transfer``: ``TransferDecoder.feed`` entered (slave: the transfer read);
* ``ack0`` / ``ack1``: the slave's report write (``broker.ha.slave._write_nowait``);
* ``report``: ``ReportDecoder.feed`` entered (master: the slave's ack read).

Each process appends (point, time) to a list and a daemon thread writes the new ones to
``<dir>/ev-<pid>.txt`` every second. After each round of ``--count`` sends (200 untimed ones
first), the events of the three processes are merged in time order and cut into sends from
``send`` to ``done``; a send counts only if every point appears in the relay's order (the
first of each after the one before; the nameserver's heartbeats, every 30 s, could stand in
for a point of the send they fall in).
The output is the median of each step over the sends of a round, and the median of the rounds.
A step between two processes (a write's end to the next process's first point) is the wake-up:
the kernel, the event loop and the task switch until our code runs. A hook costs about a
microsecond, and the sum of the steps is the send's latency with them in.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# the relay, in order: (process, point)
RELAY = [
    ("client", "send"),
    ("client", "write0"),
    ("client", "write1"),
    ("master", "read"),
    ("master", "ha0"),
    ("master", "ha1"),
    ("slave", "transfer"),
    ("slave", "ack0"),
    ("slave", "ack1"),
    ("master", "report"),
    ("master", "write0"),
    ("master", "write1"),
    ("client", "read"),
    ("client", "done"),
]

_SITE = """\
import os, sys
sys.path.insert(0, os.environ["RMQ_TIMELINE_ROOT"])
from bench.send_timeline import install_hooks
install_hooks(os.environ["RMQ_TIMELINE_DIR"])
"""

_MAX_EVENTS = 2_000_000


def install_hooks(out_dir: str) -> None:
    """Wrap the relay's functions in this process to record their points (module doc)."""
    from broker.ha import slave as ha_slave
    from broker.ha.master import HAMaster
    from broker.ha.protocol import ReportDecoder, TransferDecoder
    from common.remoting.channel import Channel
    from common.remoting.codec import FrameDecoder
    from rmq.producer import Producer

    events: list[tuple[str, int]] = []
    clock = time.perf_counter_ns

    def note(point: str) -> None:
        if len(events) < _MAX_EVENTS:
            events.append((point, clock()))

    def around(owner: Any, name: str, enter: str, leave: str | None = None) -> None:
        fn: Callable[..., Any] = getattr(owner, name)

        def hooked(*args: Any, **kw: Any) -> Any:
            note(enter)
            try:
                return fn(*args, **kw)
            finally:
                if leave is not None:
                    note(leave)

        setattr(owner, name, hooked)

    send = Producer.send

    async def hooked_send(*args: Any, **kw: Any) -> Any:
        note("send")
        result = await send(*args, **kw)
        note("done")
        return result

    Producer.send = hooked_send  # type: ignore[method-assign]
    around(Channel, "_write_nowait", "write0", "write1")
    around(FrameDecoder, "feed", "read")
    around(HAMaster, "_write_inline", "ha0", "ha1")
    around(TransferDecoder, "feed", "transfer")
    around(ha_slave, "_write_nowait", "ack0", "ack1")
    around(ReportDecoder, "feed", "report")

    def dump() -> None:
        written = 0
        path = os.path.join(out_dir, f"ev-{os.getpid()}.txt")
        while True:
            time.sleep(1.0)
            n = len(events)
            if n > written:
                with open(path, "a") as f:
                    f.writelines(f"{p} {t}\n" for p, t in events[written:n])
                written = n

    threading.Thread(target=dump, name="timeline-dump", daemon=True).start()


def read_events(out_dir: Path, roles: dict[int, str]) -> list[tuple[int, str, str]]:
    """(time, process, point) of every event of the processes in ``roles``, in time order."""
    out = []
    for pid, role in roles.items():
        path = out_dir / f"ev-{pid}.txt"
        if path.exists():
            for line in path.read_text().splitlines():
                point, t = line.split()
                out.append((int(t), role, point))
    out.sort()
    return out


def steps(events: list[tuple[int, str, str]], since: int) -> list[list[int]]:
    """The relay's step times (ns) of every complete send that started after ``since``."""
    out: list[list[int]] = []
    first = RELAY[0]
    i, n = 0, len(events)
    while i < n:
        t, role, point = events[i]
        if t < since or (role, point) != first:
            i += 1
            continue
        times = [t]
        k, j = 1, i + 1
        while j < n and k < len(RELAY):
            ev = events[j][1:]
            if ev == first:
                break
            if ev == RELAY[k]:
                times.append(events[j][0])
                k += 1
            j += 1
        if k == len(RELAY):
            out.append([b - a for a, b in zip(times, times[1:], strict=False)])
        i = j
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=5000, help="sends one at a time per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import trio

    import bench.run_floor_chain as chain
    from bench.cluster import detached_cluster

    with tempfile.TemporaryDirectory(prefix="rmq-timeline-") as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(_SITE)
        out_dir = Path(tmp) / "events"
        out_dir.mkdir()
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        os.environ["RMQ_TIMELINE_ROOT"] = str(ROOT)
        os.environ["RMQ_TIMELINE_DIR"] = str(out_dir)
        install_hooks(str(out_dir))
        with detached_cluster("--slaves", "1", "--role", "SYNC_MASTER", prefix="rmq-tl-") as (
            ns,
            nodes,
        ):
            roles = {
                nodes["broker-a"]: "master",
                nodes["broker-a-s1"]: "slave",
                os.getpid(): "client",
            }

            async def create() -> None:
                from rmq import Admin

                async with Admin(ns) as admin:
                    await admin.create_topic(chain.TOPIC, queues=4)
                await trio.sleep(1)

            trio.run(create)
            pids = {"master": nodes["broker-a"], "slave": nodes["broker-a-s1"]}
            rounds: list[list[float]] = []
            for r in range(args.rounds):
                since = time.perf_counter_ns()
                result = chain.rmq_client(ns, args.count, 1, pids=pids)
                time.sleep(2.5)  # every process's dump thread has written its events
                sends = steps(read_events(out_dir, roles), since)
                medians = [statistics.median(col) / 1000 for col in zip(*sends, strict=True)]
                rounds.append(medians)
                print(
                    f"round {r + 1}: {len(sends)} sends, p50 {result['p50_us']:.0f} us "
                    f"(the sum of the step medians {sum(medians):.0f} us)",
                    flush=True,
                )
    print("\n| step | median us (rounds) |\n|---|---|")
    for k, (a, b) in enumerate(zip(RELAY, RELAY[1:], strict=False)):
        per = [m[k] for m in rounds]
        label = f"{a[0]} {a[1]} -> {b[0]} {b[1]}"
        print(f"| {label} | {statistics.median(per):.1f} ({', '.join(f'{x:.0f}' for x in per)}) |")
    total = [sum(m) for m in rounds]
    print(f"| sum | {statistics.median(total):.0f} ({', '.join(f'{x:.0f}' for x in total)}) |")


if __name__ == "__main__":
    main()
