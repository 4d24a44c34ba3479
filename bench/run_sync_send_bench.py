"""One-at-a-time sends from plain (non-Trio) code: rmq.sync's direct path against its portal path,
and the Trio Producer, against `rmq up --slaves 1 --role SYNC_MASTER`.

    .venv/bin/python bench/run_sync_send_bench.py [--rounds 3] [--count 3000]

Theory of operation. One detached cluster; a topic with 4 queues; then, per round, each client
in turn (order rotating) sends `count` 1 KiB messages one at a time after 200 untimed ones:

* `sync direct`: `rmq.sync.Producer.send` as users call it (the caller's thread, blocking
  socket: rmq/sync_send.py);
* `sync portal`: the same producer's portal call (`_call("send", ...)`: what `send` did before
  the direct path, one thread hop there and back per send);
* `trio`: `await rmq.Producer.send` in `trio.run`.

Per client and round: msg/s, mean wall microseconds per send, and this process's CPU per send
(user and system, from getrusage: the client's whole cost, the Trio thread included) plus the
master's and slave's CPU per send (/proc). Prints one line per round and client and the medians.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from bench.cluster import cpu_seconds, detached_cluster  # noqa: E402
from rmq import Admin, Message, Producer, SendStatus, sync  # noqa: E402

TOPIC = "SyncSendBench"
BODY = b"x" * 1024


class _Meter:
    """This process's and the brokers' CPU and the wall time from construction to result()."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.r0 = resource.getrusage(resource.RUSAGE_SELF)
        self.c0 = {n: cpu_seconds(p) for n, p in pids.items()}
        self.t0 = time.perf_counter()

    def result(self, count: int) -> dict[str, float]:
        dt = time.perf_counter() - self.t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        out = {
            "msg_per_s": count / dt,
            "wall_us": 1e6 * dt / count,
            "user_us": 1e6 * (r1.ru_utime - self.r0.ru_utime) / count,
            "sys_us": 1e6 * (r1.ru_stime - self.r0.ru_stime) / count,
        }
        for n, p in self.pids.items():
            out[f"{n}_us"] = 1e6 * (cpu_seconds(p) - self.c0[n]) / count
        return out


def _measure(send: Callable[[], object], count: int, pids: dict[str, int]) -> dict[str, float]:
    for _ in range(200):
        send()
    meter = _Meter(pids)
    for _ in range(count):
        send()
    return meter.result(count)


def _check(r: object) -> None:
    if getattr(r, "status", None) is not SendStatus.SEND_OK:
        raise RuntimeError(f"send answered {r}, expected SEND_OK")


def run_sync(ns: str, count: int, pids: dict[str, int], *, direct: bool) -> dict[str, float]:
    with sync.Producer("bench_sync_pg", ns, send_timeout=10) as p:
        if direct:
            return _measure(lambda: _check(p.send(Message(TOPIC, BODY))), count, pids)
        return _measure(lambda: _check(p._run(p._async.send, Message(TOPIC, BODY))), count, pids)


def run_trio(ns: str, count: int, pids: dict[str, int]) -> dict[str, float]:
    async def main() -> dict[str, float]:
        async with Producer("bench_trio_pg", ns, send_timeout=10) as p:
            for _ in range(200):
                _check(await p.send(Message(TOPIC, BODY)))
            meter = _Meter(pids)
            for _ in range(count):
                _check(await p.send(Message(TOPIC, BODY)))
            return meter.result(count)

    return trio.run(main)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=3000)
    args = ap.parse_args()
    clients: dict[str, Callable[[str, int, dict[str, int]], dict[str, float]]] = {
        "sync direct": lambda ns, n, pids: run_sync(ns, n, pids, direct=True),
        "sync portal": lambda ns, n, pids: run_sync(ns, n, pids, direct=False),
        "trio": run_trio,
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in clients}
    with detached_cluster("--slaves", "1", "--role", "SYNC_MASTER") as (ns, nodes):
        pids = {"master": nodes["broker-a"], "slave": nodes["broker-a-s1"]}

        async def create() -> None:
            async with Admin(ns) as admin:
                await admin.create_topic(TOPIC, queues=4)
            await trio.sleep(1)

        trio.run(create)
        names = list(clients)
        for i in range(args.rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                m = clients[name](ns, args.count, pids)
                results[name].append(m)
                print(
                    f"round {i + 1} {name:11s}: {m['msg_per_s']:6,.0f} msg/s, "
                    f"{m['wall_us']:4.0f} us/send; CPU us/send: client {m['user_us']:.0f} user "
                    f"+ {m['sys_us']:.0f} sys, master {m['master_us']:.0f}, "
                    f"slave {m['slave_us']:.0f}",
                    flush=True,
                )
    print("\nmedians over the rounds:")
    print("| client | msg/s | wall us/send | client CPU us/send (user + sys) | master | slave |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, ms in results.items():

        def med(key: str, ms: list[dict[str, float]] = ms) -> float:
            return statistics.median(m[key] for m in ms)

        print(
            f"| {name} | {med('msg_per_s'):,.0f} | {med('wall_us'):.0f} | "
            f"{med('user_us') + med('sys_us'):.0f} ({med('user_us'):.0f} + {med('sys_us'):.0f}) | "
            f"{med('master_us'):.0f} | {med('slave_us'):.0f} |"
        )


if __name__ == "__main__":
    main()
