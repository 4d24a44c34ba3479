"""Server processes for the peer benchmark: install, spawn, wait, measure, stop (by pid).

Every process started here is a direct child (`subprocess.Popen`), so stopping it by its pid
cannot hit anything else; `Servers.stop` sends SIGTERM, waits a bound, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

APT_PACKAGES = {"redis-server": "redis-server", "nats-server": "nats-server"}
# import name -> PyPI requirement (the `bench` extra in pyproject.toml)
PY_PACKAGES = {"redis": "redis>=5", "nats": "nats-py>=2.6", "matplotlib": "matplotlib>=3.7"}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def ensure_installed() -> None:
    """Install the peer servers (Debian) and their Python clients (PyPI) if missing."""
    missing = [pkg for binary, pkg in APT_PACKAGES.items() if shutil.which(binary) is None]
    if missing:
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        print(f"installing {' '.join(missing)} (apt-get)", flush=True)
        subprocess.run([*sudo, "apt-get", "update", "-q"], check=True, env=env)
        subprocess.run([*sudo, "apt-get", "install", "-y", "-q", *missing], check=True, env=env)
    wanted = []
    for module, req in PY_PACKAGES.items():
        try:
            importlib.import_module(module)
        except ImportError:
            wanted.append(req)
    if wanted:
        print(f"installing {' '.join(wanted)} (pip)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *wanted], check=True)
        importlib.invalidate_caches()


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports that are bindable right now (the kernel picks them)."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in ports:
            ports.append(port)
    return ports


def accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def wait_accepting(ports: list[int], deadline: float) -> None:
    for port in ports:
        while not accepting(port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"port {port} not accepting connections in time")
            time.sleep(0.01)


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def host_busy_seconds() -> float:
    """CPU time all CPUs spent not idle (/proc/stat: everything but idle and iowait)."""
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in parts[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(values) - values[3] - values[4]) / CLK_TCK


@dataclass
class Servers:
    """The processes of one system under test, by name, and when they were spawned."""

    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    spawned_at: float = 0.0
    ready_seconds: float = 0.0

    def spawn(self, name: str, cmd: list[str], log: Path) -> None:
        if not self.procs:
            self.spawned_at = time.monotonic()
        with log.open("wb") as out:
            self.procs[name] = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    def mark_ready(self) -> None:
        self.ready_seconds = time.monotonic() - self.spawned_at

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} (pid {proc.pid}) exited with {proc.returncode}")

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}

    def stop(self, grace: float = 10.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        end = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


class AsyncioSystem:
    """A peer driven by its asyncio client: the started ``servers`` and one ``_run`` per
    scenario (Redis and NATS share this; trio-rmq runs under Trio)."""

    def __init__(self, servers: Servers) -> None:
        self.servers = servers

    @property
    def ready_seconds(self) -> float:
        return self.servers.ready_seconds

    def pids(self) -> dict[str, int]:
        return self.servers.pids()

    def run(self, scenario: str, body: bytes, count: int, concurrency: int) -> dict[str, Any]:
        self.servers.check_alive()
        return asyncio.run(self._run(scenario, body, count, concurrency))

    async def _run(
        self, scenario: str, body: bytes, count: int, concurrency: int
    ) -> dict[str, Any]:
        raise NotImplementedError
