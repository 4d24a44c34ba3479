"""Running tests/interop/py5_driver.py (the official RocketMQ 5 Python client) from a test.

`run_py5(python, tmp_path, "produce", "--endpoint", ...)` runs the driver in the client's venv
(`python` from the `py5_python` fixture, tests/interop/conftest.py) with a scratch HOME and
returns its JSON events; a non-zero exit fails the test with the driver's stderr (the client's
log tail is in it). `grpc_endpoint(cluster)` is where `rmq up` says a broker serves gRPC.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import IO, Any

DRIVER = Path(__file__).with_name("py5_driver.py")


def _env(tmp_path: Path, name: str) -> dict[str, str]:
    home = tmp_path / f"home-{name}"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_py5(
    python: Path, tmp_path: Path, *args: str, timeout: float = 180.0, check: bool = True
) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [str(python), str(DRIVER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(tmp_path, args[0]),
    )
    if check:
        assert proc.returncode == 0, (
            f"py5 driver {args[0]} failed ({proc.returncode}):\n{proc.stderr[-6000:]}\n"
            f"{proc.stdout[-2000:]}"
        )
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


class Py5Process:
    """A driver run in the background (a consumer that must be up while something else happens)."""

    def __init__(self, python: Path, tmp_path: Path, *args: str) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [str(python), str(DRIVER), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(tmp_path, f"{args[0]}-bg-{id(self)}"),
        )
        self.events: list[dict[str, Any]] = []
        self.started = threading.Event()
        self._stderr: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True),
            threading.Thread(
                target=lambda f: self._stderr.extend(f), args=(self.proc.stderr,), daemon=True
            ),
        ]
        for t in self._readers:
            t.start()

    def _read(self, f: IO[str]) -> None:
        for line in f:
            if line.startswith("{"):
                ev = json.loads(line)
                self.events.append(ev)
                if ev.get("event") == "started":
                    self.started.set()

    def stop(self) -> None:
        """Kill it if it still runs (a test that failed before `wait`); close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for t in self._readers:
            t.join(timeout=10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()

    def wait(self, timeout: float) -> list[dict[str, Any]]:
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
            rc = self.proc.returncode
        # the reader threads drain the pipes to their end, then the pipes are closed
        for t in self._readers:
            t.join(timeout=10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        assert rc == 0, f"py5 driver {self.args[0]} failed ({rc}):\n{''.join(self._stderr)[-6000:]}"
        return self.events


def grpc_endpoint(data_dir: Path, broker: str | None = None) -> str:
    """host:port of the gRPC endpoint `rmq status --json` reports for a broker (the first
    master / leader when `broker` is None)."""
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "status", "--data-dir", str(data_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    nodes = json.loads(out.stdout)["nodes"]
    brokers = [n for n in nodes if n.get("kind") == "broker"]
    if broker is not None:
        brokers = [n for n in brokers if n["name"] == broker]
    else:
        brokers = [n for n in brokers if n.get("broker_id") == 0] or brokers
    assert brokers, nodes
    node = brokers[0]
    assert node.get("grpc"), (
        f"`rmq status --json` has no gRPC endpoint (`grpc`) for {node['name']}: {node}"
    )
    return str(node["grpc"])


def grpc_endpoints(data_dir: Path) -> dict[str, str]:
    """Every broker node's gRPC endpoint by node name."""
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "status", "--data-dir", str(data_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    nodes = json.loads(out.stdout)["nodes"]
    return {n["name"]: str(n.get("grpc")) for n in nodes if n.get("kind") == "broker"}


def rmq(*args: str, timeout: float = 60.0) -> str:
    """An `rmq` CLI command of this checkout; fails the test on a non-zero exit."""
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, f"rmq {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def sent_ok(events: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    errors = [e for e in events if e["event"] == "send_error"]
    assert not errors, errors[:5]
    sent = [e for e in events if e["event"] == "sent"]
    assert len(sent) == count, (len(sent), events[-5:])
    return sent


def done_of(events: list[dict[str, Any]]) -> dict[str, Any]:
    done = [e for e in events if e["event"] == "done"]
    assert done, events[-10:]
    return done[0]


def acked_bodies(events: list[dict[str, Any]], kind: str = "ack") -> Counter[str]:
    return Counter(str(e["body"]) for e in events if e["event"] == kind)


def cluster_config(directory: Path, **broker_conf: int | str) -> Path:
    """A `rmq up --config` file whose [broker_conf] applies to every broker."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "cluster.toml"
    lines = ["[broker_conf]"]
    for k, v in broker_conf.items():
        lines.append(f"{k} = {json.dumps(v)}")
    path.write_text("\n".join(lines) + "\n")
    return path


# check-backs of half messages within about a second (RocketMQ: 6 s old, every 60 s)
FAST_TRANSACTIONS: dict[str, int | str] = {
    "transactionTimeOut": 1000,
    "transactionCheckInterval": 1000,
}


class Py5:
    """The 5.x client against one cluster: `py5.produce(tmp_path, topic, n, ...)` and so on,
    each a driver run whose events are returned after checking it exited cleanly."""

    def __init__(
        self, python: Path, endpoint: str, namesrv: str, *, tls: bool = False, ca: str = ""
    ) -> None:
        self.python = python
        self.endpoint = endpoint
        self.namesrv = namesrv
        self.tls = tls
        self.ca = ca

    def _conn(self) -> list[str]:
        out = ["--endpoint", self.endpoint]
        if self.tls:
            out.append("--tls")
        if self.ca:
            out += ["--ca", self.ca]
        return out

    def run(
        self, tmp_path: Path, cmd: str, *args: str, timeout: float = 180.0
    ) -> list[dict[str, Any]]:
        return run_py5(self.python, tmp_path, cmd, *self._conn(), *args, timeout=timeout)

    def background(self, tmp_path: Path, cmd: str, *args: str) -> Py5Process:
        return Py5Process(self.python, tmp_path, cmd, *self._conn(), *args)

    def produce(
        self, tmp_path: Path, topic: str, count: int, *args: str, timeout: float = 180.0
    ) -> list[dict[str, Any]]:
        events = self.run(
            tmp_path, "produce", "--topic", topic, "--count", str(count), *args, timeout=timeout
        )
        sent_ok(events, count)
        return events

    def simple(
        self, tmp_path: Path, topic: str, group: str, expect: int, *args: str, timeout: float = 60.0
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        events = self.run(
            tmp_path, "simple-consume", "--topic", topic, "--group", group,
            "--expect", str(expect), "--timeout", str(timeout), *args,
            timeout=timeout + 90,
        )  # fmt: skip
        return events, done_of(events)

    def push(
        self, tmp_path: Path, topic: str, group: str, expect: int, *args: str, timeout: float = 60.0
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        events = self.run(
            tmp_path, "push-consume", "--topic", topic, "--group", group,
            "--expect", str(expect), "--timeout", str(timeout), *args,
            timeout=timeout + 90,
        )  # fmt: skip
        return events, done_of(events)

    def topic(self, name: str, message_type: str = "NORMAL", queues: int = 4) -> None:
        rmq("topic", "create", name, "--message-type", message_type, "--queues", str(queues),
            "-n", self.namesrv)  # fmt: skip

    def group(self, name: str, *args: str) -> None:
        rmq("group", "create", name, *args, "-n", self.namesrv)


def read_topic(namesrv: str, topic: str, *, count: int | None = None) -> list[dict[str, Any]]:
    """Every message of a topic (a DLQ, a retry topic) read back over the 4.x path."""
    args = ["consume", "--topic", topic, "--from-beginning", "--json", "-n", namesrv,
            "--group", f"py5-readback-{os.getpid()}-{threading.get_ident()}"]  # fmt: skip
    if count is not None:
        args += ["--count", str(count)]
    doc = json.loads(rmq(*args))
    return list(doc["messages"])
