"""Restart benchmark: start-to-ready of a broker with a 1 GiB store.

    .venv/bin/python bench/run_restart_bench.py [--size-mib 1024] [--runs 3]

Theory of operation.  Everything runs in a temporary directory on free loopback ports, and
every process this script starts is stopped by pid (bench/cluster.py).

1. Fill: ``<data>/broker-a`` gets a CommitLog of ``--size-mib`` MiB written in-process through
   the store's own put path (``DefaultMessageStore.append_messages``, batches of 512 messages of
   1 KiB with a UNIQ_KEY and a key each, default store config: 1 GiB CommitLog segments), then
   a clean stop.  The ConsumeQueues and the index are built on the way, as on a real broker.
2. ``rmq up --slaves 0`` on that data (nameserver + the master, supervised): the time from
   spawning ``rmq up`` to its ``ready`` line, with the 1 GiB store after a clean stop.
3. ``--runs`` times each, the master is stopped outside the supervisor and ``rmq restart
   broker-a`` is timed from its spawn to its exit (it returns once the broker serves and is
   registered: start-to-ready, plus the ~0.3 s of the ``rmq`` CLI's own start):
   * clean: SIGTERM, wait for the exit (the store flushes, writes its checkpoint, removes
     ``abort``);
   * SIGKILL: kill -9 while idle (at most one checkpoint interval of writes to recover).
4. In-process, the check recovery makes below the checkpoint after a crash
   (``CommitLog.first_bad_below``: structure and body CRC of every record, the whole last
   segment) timed over the whole filled segment as recovery runs it (the compiled check) and
   with the numpy fallback, best of ``--runs``.
5. The case of the report: ``rmq up`` with one slave (default topology, small store), SIGKILL
   the master, time ``rmq restart broker-a``; ``ready`` for a master includes its slave's HA
   reconnection.

Medians (and all values) are printed; ``--doc`` appends them as a section to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `python bench/run_restart_bench.py` from anywhere

from bench.cluster import start_cluster  # noqa: E402

RMQ = [sys.executable, "-m", "cli.main"]


def fill(root: Path, size: int) -> tuple[int, int, float]:
    """A store of ``size`` CommitLog bytes at ``root``; (bytes, messages, seconds)."""
    import trio

    from broker.store import MessageStoreConfig, PendingPut, run_message_store
    from common.message import MessageExtBrokerInner

    async def main() -> tuple[int, int]:
        cfg = MessageStoreConfig(store_path_root_dir=str(root))
        body = os.urandom(1024)
        n = 0
        async with trio.open_nursery() as nursery:
            store = await nursery.start(run_message_store, cfg)
            # stop short of the segment's end: all of it in one (the last) segment, the case
            # where validating "the last files" reads everything
            while store.get_max_phy_offset() < size - 2 * 1024 * 1024:
                batch = [
                    MessageExtBrokerInner(
                        topic="RestartBench",
                        queue_id=(n // 512) % 8,
                        body=body,
                        properties={"UNIQ_KEY": f"{n + i:032X}", "KEYS": f"k{n + i}"},
                        born_host=("127.0.0.1", 1),
                        store_host=("127.0.0.1", 10911),
                    )
                    for i in range(512)
                ]
                n += len(batch)
                r = store.append_messages(batch)
                if isinstance(r, PendingPut):
                    r = await r.wait()
                if not r.ok:
                    raise RuntimeError(f"fill failed: {r.status}")
                await trio.lowlevel.checkpoint()
            total = store.get_max_phy_offset()
            nursery.cancel_scope.cancel()
        return total, n

    t0 = time.perf_counter()
    total, n = trio.run(main)
    return total, n, time.perf_counter() - t0


def node_pid(data: Path, name: str) -> int:
    out = subprocess.run(
        [*RMQ, "status", "--json", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=30,
    )
    for node in json.loads(out.stdout)["nodes"]:
        if node["name"] == name:
            return int(node["pid"])
    raise RuntimeError(f"no node {name} in `rmq status`")


def wait_gone(pid: int, timeout: float = 30.0) -> None:
    """Until `pid` exited (the supervisor reaps it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    time.sleep(0.02)
                    continue
        except (FileNotFoundError, ProcessLookupError):  # gone before or while reading
            return
        time.sleep(0.02)
    raise RuntimeError(f"pid {pid} did not exit within {timeout} s")


def timed_restart(data: Path, sig: int) -> float:
    pid = node_pid(data, "broker-a")
    os.kill(pid, sig)
    wait_gone(pid)
    time.sleep(0.3)  # the supervisor has reported the exit
    t0 = time.perf_counter()
    done = subprocess.run(
        [*RMQ, "restart", "broker-a", "--data-dir", str(data), "--timeout", "60"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    took = time.perf_counter() - t0
    if done.returncode:
        log = data / "logs" / "broker-a.log"
        tail = log.read_text()[-3000:] if log.exists() else ""
        raise RuntimeError(
            f"rmq restart broker-a exited {done.returncode}:\n{done.stdout}{done.stderr}\n"
            f"--- broker-a.log:\n{tail}"
        )
    return took


def crc_check_times(root: Path, runs: int) -> dict[str, float]:
    """Seconds (best of ``runs``) of the below-checkpoint check over the whole filled segment
    of the store at ``root``: as recovery runs it (``CommitLog.first_bad_below``, the compiled
    check), the numpy path, and the numpy path over the default window (what recovery checked
    before it covered the whole last segment)."""
    from broker.store import commitlog_scan
    from broker.store.commitlog import CommitLog
    from broker.store.config import MessageStoreConfig

    cfg = MessageStoreConfig(store_path_root_dir=str(root))
    cl = CommitLog(str(root / "commitlog"), cfg.mapped_file_size_commit_log, ())
    cl.load()
    try:
        mf = cl.queue.files[-1]
        view, base = mf.view, mf.file_from_offset
        stop = commitlog_scan.scan_segment(view, base).end
        end = base + stop
        window = cfg.crc_check_window_on_recover
        win_start = commitlog_scan.resync(view, base, max(0, stop - window)) or 0
        seg = f"whole segment, {stop >> 20} MiB"
        rc = commitlog_scan._record_check
        kernel = f", CRC by {rc.CRC_KERNEL}" if rc is not None else ""

        def check(start: int, compiled: bool) -> None:
            got = commitlog_scan.check_records(view, base, start, stop, compiled=compiled)
            assert got[1] is None, got

        cases: dict[str, Callable[[], None]] = {
            f"as recovery runs it ({commitlog_scan.check_implementation()}{kernel}), {seg}": (
                lambda: assert_none(cl.first_bad_below(base, end))
            ),
            f"numpy, {seg}": lambda: check(0, False),
            f"numpy, the {window >> 20} MiB window": lambda: check(win_start, False),
        }
        out = {}
        for name, fn in cases.items():
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            out[name] = min(times)
        return out
    finally:
        cl.close()


def assert_none(value: object) -> None:
    assert value is None, value


_RECOVERY = re.compile(
    r"recovery \(after a crash.*checked for (\d+) B from \d+ in ([\d.]+) s.*; ([\d.]+) s$"
)


def recovery_times(log: Path) -> tuple[list[float], list[float]]:
    """(check below the checkpoint, all of recovery) in seconds, for each recovery after a crash
    the broker's log holds that checked anything."""
    crc: list[float] = []
    total: list[float] = []
    for line in log.read_text().splitlines():
        m = _RECOVERY.search(line)
        if m and int(m[1]):
            crc.append(float(m[2]))
            total.append(float(m[3]))
    return crc, total


def med(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s (" + ", ".join(f"{v:.2f}" for v in values) + ")"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--doc", action="store_true", help="append the results to docs/benchmarks.md")
    ap.add_argument(
        "--skip-check", action="store_true", help="do not time the check in-process (step 4)"
    )
    ap.add_argument("--ha-only", action="store_true", help="only the master + slave case (step 5)")
    args = ap.parse_args()
    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="rmq-restart-bench-") as tmp:
        if not args.ha_only:
            big_store(args, Path(tmp) / "big", results)
        ha_restarts(args, Path(tmp) / "ha", results)
    if args.doc:
        append_doc(args, results)


def big_store(args: argparse.Namespace, data: Path, results: dict[str, str]) -> None:
    """Steps 1-4: the 1 GiB store's start, restarts and in-process check."""
    size, n, secs = fill(data / "broker-a", args.size_mib * 1024 * 1024)
    results["store"] = f"{size / 2**30:.2f} GiB CommitLog, {n} messages (filled in {secs:.0f} s)"
    print(results["store"], flush=True)
    checks = {} if args.skip_check else crc_check_times(data / "broker-a", args.runs)
    for name, secs in checks.items():
        results[f"in-process check below the checkpoint: {name}"] = f"{secs:.2f} s"
        print(f"check below the checkpoint, {name}: {secs:.2f} s", flush=True)
    with start_cluster(data, "--slaves", "0", brokers=1, ready_timeout=120) as cluster:
        results["rmq up (clean stop, nameserver included)"] = f"{cluster.ready_seconds:.2f} s"
        print("rmq up ready after", results["rmq up (clean stop, nameserver included)"])
        clean = [timed_restart(data, signal.SIGTERM) for _ in range(args.runs)]
        results["rmq restart broker-a after a clean stop"] = med(clean)
        print("clean", med(clean), flush=True)
        killed = [timed_restart(data, signal.SIGKILL) for _ in range(args.runs)]
        results["rmq restart broker-a after SIGKILL"] = med(killed)
        print("SIGKILL", med(killed), flush=True)
    # what the restarted brokers' recoveries logged (recovery.py's summary line)
    crc, total = recovery_times(data / "logs" / "broker-a.log")
    if crc:
        results["in the broker after SIGKILL: the check below the checkpoint"] = med(crc)
        results["in the broker after SIGKILL: all of recovery"] = med(total)
        print("recoveries after SIGKILL: check", med(crc), "all", med(total), flush=True)


def ha_restarts(args: argparse.Namespace, ha: Path, results: dict[str, str]) -> None:
    """Step 5: the default topology, the master killed and restarted ``--runs`` times."""
    with start_cluster(ha, "--slaves", "1", brokers=2, ready_timeout=120):
        killed = [timed_restart(ha, signal.SIGKILL) for _ in range(args.runs)]
        results["master + slave, rmq restart broker-a after SIGKILL (small store)"] = med(killed)
        print("master+slave SIGKILL", med(killed), flush=True)


def append_doc(args: argparse.Namespace, results: dict[str, str]) -> None:
    cmd = (
        f".venv/bin/python bench/run_restart_bench.py --size-mib {args.size_mib} --runs {args.runs}"
    )
    lines = [
        "",
        f"### Restart: start-to-ready with a {args.size_mib} MiB store",
        "",
        f"`{cmd}` on {datetime.date.today().isoformat()}, {os.cpu_count()} cores shared with "
        "other work. Median of the runs, each run in parentheses; `rmq restart` times include "
        "the `rmq` CLI's own start (~0.3 s).",
        "",
        "| measure | result |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in results.items()),
        "",
    ]
    with open(ROOT / "docs" / "benchmarks.md", "a") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
