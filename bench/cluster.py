"""A real `rmq up` cluster in a subprocess, for benchmarks: start, time `ready`, find the broker, stop.

Theory of operation: `start_cluster` picks free loopback ports (the nameserver port P and the
broker blocks B-2 .. B+10k+1 for k extra brokers, each checked by binding it), spawns
`python -m cli.main up --data-dir D --namesrv-port P --broker-port B [extra args]` (e.g.
`--slaves 0 --role ASYNC_MASTER` for a lone master), and reads its stdout in
a thread until the `ready` line. The time from spawning to that line is what a user waits for
`rmq up` (interpreter start and imports of the supervisor included). `rmq up` prints one line
per node with its pid; that is how we find the broker process (falling back to the
supervisor's /proc children list). `stop_cluster` always runs (context manager): SIGTERM to the
supervisor, SIGKILL after a bound; then any node still alive (they stop by themselves when the
supervisor's stdin pipe closes) gets the same treatment, by pid, after checking that the pid
still is one of our node processes (`python -m cli.servers.node ...`, or `cli.main` for older ones).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_NODE_LINE = re.compile(r"^(?P<name>\S+)\s+(?P<addr>\S+:\d+)\s+pid\s+(?P<pid>\d+)\b")


class ClusterError(RuntimeError):
    """The cluster did not start (with its output), or a node died."""


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(brokers: int = 2) -> tuple[int, int]:
    """(namesrv_port, broker_port) with the `brokers` blocks B-2 .. B+10(brokers-1)+1 and P
    all bindable right now."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    span = 10 * brokers + 10
    for _ in range(500):
        base = rng.randrange(20000, 60000 - span, span)
        broker_ports = range(base - 2, base + 10 * (brokers - 1) + 2)
        namesrv_port = base + 10 * brokers + 5
        if all(_port_free(p) for p in (*broker_ports, namesrv_port)):
            return namesrv_port, base
    raise ClusterError("no free block of loopback ports found")


@dataclass
class Cluster:
    proc: subprocess.Popen[str]
    data_dir: Path
    namesrv_port: int
    broker_port: int
    ready_seconds: float = 0.0
    lines: list[str] = field(default_factory=list)
    # (seconds since spawning `rmq up`, line) for every line before `ready`, and `ready`
    timeline: list[tuple[float, str]] = field(default_factory=list)
    node_pids: dict[str, int] = field(default_factory=dict)

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def broker_pid(self) -> int:
        """The master `broker-a`."""
        pid = self.node_pids.get("broker-a")
        if pid is not None:
            return pid
        for pid in _children(self.proc.pid):
            if " broker " in f" {_cmdline(pid)} ":
                return pid
        raise ClusterError(f"cannot find the broker process of `rmq up` pid {self.proc.pid}")

    def pid_of(self, node: str) -> int:
        try:
            return self.node_pids[node]
        except KeyError:
            raise ClusterError(f"`rmq up` printed no node {node}:\n{self.output()}") from None

    def broker_addr(self, index: int = 0) -> str:
        """Listen address of the index-th broker block (0 = broker-a, 1 = its first slave)."""
        return f"127.0.0.1:{self.broker_port + 10 * index}"

    def output(self) -> str:
        return "\n".join(self.lines)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            out += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            pass
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


@contextlib.contextmanager
def start_cluster(
    data_dir: Path,
    *args: str,
    ready_timeout: float = 30.0,
    env: dict[str, str] | None = None,
    brokers: int = 2,
    root: Path = ROOT,
) -> Iterator[Cluster]:
    """`rmq up [args]` with `brokers` broker nodes in all (the default cluster has 2); `root`:
    the checkout whose code runs (another one: a base to compare with, `bench.peers --base`)."""
    namesrv_port, broker_port = free_ports(brokers)
    cmd = [
        sys.executable,
        "-m",
        "cli.main",
        "up",
        "--data-dir",
        str(data_dir),
        "--namesrv-port",
        str(namesrv_port),
        "--broker-port",
        str(broker_port),
        *args,
    ]
    lines: queue.Queue[str | None] = queue.Queue()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=root,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            **({} if root == ROOT else {"PYTHONPATH": str(root)}),
            **(env or {}),
        },
    )
    cluster = Cluster(proc, data_dir, namesrv_port, broker_port)
    threading.Thread(target=_pump, args=(proc, lines), daemon=True).start()
    try:
        deadline = t0 + ready_timeout
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise ClusterError(
                    f"`rmq up` not ready after {ready_timeout} s:\n{cluster.output()}"
                )
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                proc.wait(timeout=5)
                raise ClusterError(
                    f"`rmq up` exited with {proc.returncode} before ready:\n{cluster.output()}"
                )
            cluster.lines.append(line)
            cluster.timeline.append((time.perf_counter() - t0, line))
            m = _NODE_LINE.match(line)
            if m:
                cluster.node_pids[m["name"]] = int(m["pid"])
            if line.strip() == "ready":
                cluster.ready_seconds = time.perf_counter() - t0
                break
        yield cluster
    finally:
        stop_cluster(cluster)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def stop_cluster(cluster: Cluster, *, grace: float = 15.0) -> None:
    """SIGTERM the supervisor, SIGKILL after `grace`; then make sure no node outlives it."""
    proc = cluster.proc
    nodes = dict(cluster.node_pids)
    # the supervisor's children, in case the node lines were never printed
    for pid in _children(proc.pid):
        nodes.setdefault(f"pid{pid}", pid)
    if proc.poll() is None:
        _signal(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    for pid in nodes.values():
        # only processes this harness started (through `rmq up`), and only if still them
        if not _pid_alive(pid) or not is_node_process(pid):
            continue
        _signal(pid, signal.SIGTERM)
        end = time.monotonic() + 5
        while _pid_alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
        if _pid_alive(pid) and is_node_process(pid):
            _signal(pid, signal.SIGKILL)


def is_node_process(pid: int) -> bool:
    """Whether `pid` still runs one of our nodes: `rmq up` spawns `python -m cli.servers.node ...`
    (older versions spawned `python -m cli.main ...`)."""
    cmd = _cmdline(pid)
    return "-m cli.servers.node " in cmd or "-m cli.main " in cmd


def cpu_seconds(pid: int) -> float:
    """User + system CPU time `pid` has used so far (from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # after the ")" that ends comm: fields[0] is state (field 3), utime/stime are fields 14/15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile of `pid` in KiB (from /proc/<pid>/status)."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(value.split()[0])
    return out


@contextlib.contextmanager
def detached_cluster(
    *up_args: str, brokers: int = 2, prefix: str = "rmq-bench-"
) -> Iterator[tuple[str, dict[str, int]]]:
    """`rmq up --detach --json` in a temp data dir on free ports (plus `up_args`), yielding the
    nameserver address and every node's pid by name; `rmq down` on the way out, always."""
    namesrv_port, broker_port = free_ports(brokers=brokers)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        data = str(Path(tmp) / "rmq")
        up = subprocess.run(
            [sys.executable, "-m", "cli.main", "up", "--detach", "--json", "--data-dir", data,
             "--namesrv-port", str(namesrv_port), "--broker-port", str(broker_port), *up_args],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
        )  # fmt: skip
        if up.returncode:
            raise ClusterError(f"rmq up failed: {up.stdout}{up.stderr}")
        try:
            nodes = {n["name"]: n["pid"] for n in json.loads(up.stdout)["nodes"]}
            yield f"127.0.0.1:{namesrv_port}", nodes
        finally:
            subprocess.run(
                [sys.executable, "-m", "cli.main", "down", "--data-dir", data],
                capture_output=True, timeout=120, cwd=ROOT,
            )  # fmt: skip
