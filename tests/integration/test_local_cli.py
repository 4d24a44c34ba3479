"""`rmq up --detach` / `status` / `kill` / `restart` / `down`, and a foreground `rmq up` stopped
by Ctrl-C or `rmq down`: real processes on free loopback ports, data dirs in tmp_path.

Whatever happens, every process a test started (the supervisor and, through it, the nodes) is
stopped by pid in a `finally`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cli.chaos.port_blocks import free_port_block
from cli.local.state import read_state

pytestmark = pytest.mark.integration


def free_block(width: int = 40) -> int:
    """A free port block outside the ephemeral range (cli.chaos.port_blocks)."""
    return free_port_block(width)


def rmq(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=timeout
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by its parent) is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: list[int], timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def kill_leftovers(data_dir: Path, pids: list[int]) -> None:
    """Stop, by pid, the supervisor recorded in `data_dir` and the node pids we saw."""
    state = read_state(data_dir)
    if state is not None:
        pids = [state["supervisor_pid"], *(n["pid"] for n in state["nodes"] if n["pid"]), *pids]
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def state_of(data_dir: Path) -> dict[str, Any]:
    """The local cluster's state file; it must exist."""
    state = read_state(data_dir)
    assert state is not None, f"no state file in {data_dir}"
    return state


def one_error_line(r: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    for fragment in fragments:
        assert fragment in r.stderr, r.stderr


def test_detached_cluster_status_kill_restart_down(tmp_path: Path) -> None:
    data = tmp_path / "rmq"
    base = free_block()
    seen: list[int] = []
    try:
        r = rmq(
            "up",
            "--detach",
            "--data-dir",
            str(data),
            "--namesrv-port",
            str(base + 35),
            "--broker-port",
            str(base),
        )
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        # the same node lines as a foreground `rmq up`, then ready
        pids = {
            m["name"]: int(m["pid"])
            for line in lines
            if (m := re.match(r"(?P<name>\S+)\s+\S+:\d+\s+pid\s+(?P<pid>\d+)\b", line))
        }
        seen += pids.values()
        assert list(pids) == ["namesrv", "broker-a", "broker-a-s1"]
        assert "ready" in lines
        assert re.search(rf"broker-a-s1 +127\.0\.0\.1:{base + 10} .*SLAVE broker-a id 1,", r.stdout)
        sup_pid = state_of(data)["supervisor_pid"]
        seen.append(sup_pid)
        assert all(alive(p) for p in seen)
        assert (data / "logs" / "supervisor.log").exists()

        r = rmq("status", "--data-dir", str(data), "--json")
        assert r.returncode == 0, r.stderr
        status = json.loads(r.stdout)
        assert status["state"] == "ready" and status["supervisor_pid"] == sup_pid
        rows = {n["name"]: n for n in status["nodes"]}
        assert {
            k: (v["role"], v["broker_id"], v["port"], v["pid"], v["status"])
            for k, v in rows.items()
        } == {
            "namesrv": ("NAMESRV", None, base + 35, pids["namesrv"], "alive"),
            "broker-a": ("SYNC_MASTER", 0, base, pids["broker-a"], "alive"),
            "broker-a-s1": ("SLAVE", 1, base + 10, pids["broker-a-s1"], "alive"),
        }
        r = rmq("status", "--data-dir", str(data))
        assert r.returncode == 0 and "broker-a-s1" in r.stdout and "alive" in r.stdout

        # a second cluster on the same data dir is refused before anything starts (its ports
        # stay inside the drawn block: base + 100 could pass 65535 and be refused for that)
        one_error_line(
            rmq(
                "up",
                "--data-dir",
                str(data),
                "--namesrv-port",
                str(base + 36),
                "--broker-port",
                str(base + 20),
            ),
            "already running",
            str(sup_pid),
        )

        r = rmq("kill", "broker-a-s1", "--data-dir", str(data))
        assert r.returncode == 0, r.stderr
        assert "broker-a-s1 killed" in r.stdout
        assert wait_gone([pids["broker-a-s1"]]) == []
        rows = {
            n["name"]: n
            for n in json.loads(rmq("status", "--data-dir", str(data), "--json").stdout)["nodes"]
        }
        assert rows["broker-a-s1"]["status"] == "exited"
        assert rows["broker-a-s1"]["returncode"] == -signal.SIGKILL
        one_error_line(rmq("kill", "broker-a-s1", "--data-dir", str(data)), "not running")
        one_error_line(
            rmq("restart", "nosuchnode", "--data-dir", str(data)),
            "no node named 'nosuchnode'",
            "broker-a-s1",
        )

        r = rmq("restart", "broker-a-s1", "--data-dir", str(data))
        assert r.returncode == 0, r.stderr
        assert f"serving on 127.0.0.1:{base + 10}" in r.stdout
        rows = {
            n["name"]: n
            for n in json.loads(rmq("status", "--data-dir", str(data), "--json").stdout)["nodes"]
        }
        new_pid = rows["broker-a-s1"]["pid"]
        seen.append(new_pid)
        assert rows["broker-a-s1"]["status"] == "alive" and alive(new_pid)
        assert rows["broker-a-s1"]["restarts"] == 1
        # same store: the restarted slave reopened its own directory
        assert (data / "broker-a-s1" / "lock").exists()

        r = rmq("down", "--data-dir", str(data))
        assert r.returncode == 0, r.stderr
        assert "stopped namesrv, broker-a, broker-a-s1" in r.stdout
        # `down` returns once every process is gone
        assert [p for p in seen if alive(p)] == []
        assert read_state(data) is None

        one_error_line(rmq("down", "--data-dir", str(data)), "no cluster is running")
        one_error_line(rmq("status", "--data-dir", str(data)), "no cluster is running")
    finally:
        kill_leftovers(data, seen)


class Foreground:
    """A foreground `rmq up` whose stdout a thread collects."""

    def __init__(self, *args: str) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "up", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.strip() == "ready":
                self.ready.set()

    def pids(self) -> list[int]:
        return [int(m[1]) for line in self.lines if (m := re.search(r" pid (\d+) ", line))]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.thread.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_a_signal_stops_a_foreground_cluster_and_every_node(tmp_path: Path, how: str) -> None:
    base = free_block()
    data = tmp_path / "rmq"
    up = Foreground(
        "--data-dir",
        str(data),
        "--namesrv-port",
        str(base + 35),
        "--broker-port",
        str(base),
        "--slaves",
        "0",
    )
    pids: list[int] = []
    try:
        assert up.ready.wait(60), "\n".join(up.lines)
        pids = up.pids()
        assert len(pids) == 2 and all(alive(p) for p in pids)
        assert state_of(data)["supervisor_pid"] == up.proc.pid
        up.proc.send_signal(getattr(signal, how))
        # every node stops cleanly either way; Ctrl-C's status is 130 as for every command
        assert up.proc.wait(timeout=30) == (130 if how == "SIGINT" else 0)
        up.thread.join(timeout=5)
        assert wait_gone(pids, 5) == []
        assert up.lines[-1] == "stopped"
        assert "broker-a       stopped (exit code 0)" in up.lines
        assert read_state(data) is None  # nothing left for `rmq down` to find
    finally:
        up.close()
        kill_leftovers(data, pids)


def test_rmq_down_and_kill_reach_a_foreground_cluster(tmp_path: Path) -> None:
    base = free_block()
    data = tmp_path / "rmq"
    up = Foreground(
        "--data-dir",
        str(data),
        "--namesrv-port",
        str(base + 35),
        "--broker-port",
        str(base),
        "--slaves",
        "0",
    )
    pids: list[int] = []
    try:
        assert up.ready.wait(60), "\n".join(up.lines)
        pids = up.pids()
        r = rmq("kill", "broker-a", "--data-dir", str(data))
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 10
        while not any("broker-a       killed (exit code -9)" in x for x in up.lines):
            assert time.monotonic() < deadline, "\n".join(up.lines)
            time.sleep(0.05)
        assert up.proc.poll() is None  # the supervisor and the nameserver keep running
        r = rmq("down", "--data-dir", str(data))
        assert r.returncode == 0, r.stderr
        assert up.proc.wait(timeout=30) == 0
        up.thread.join(timeout=5)
        assert wait_gone(pids, 5) == []
        assert up.lines[-1] == "stopped"
    finally:
        up.close()
        kill_leftovers(data, pids)


def test_commands_without_a_cluster_say_so_in_one_line(tmp_path: Path) -> None:
    data = str(tmp_path / "none")
    for args in (["status"], ["down"], ["kill", "broker-a"], ["restart", "broker-a"]):
        one_error_line(rmq(*args, "--data-dir", data), "no cluster is running")
    # a state file left by a supervisor that died: recognised as stale and removed by down
    (tmp_path / "none").mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "none" / "supervisor.json").write_text(
        json.dumps({"supervisor_pid": dead.pid, "socket": str(tmp_path / "x.sock"), "nodes": []})
    )
    one_error_line(rmq("status", "--data-dir", data), f"pid {dead.pid}, is gone")
    one_error_line(rmq("down", "--data-dir", data), "stale state file")
    assert not (tmp_path / "none" / "supervisor.json").exists()


def test_dledger_and_bad_topologies_fail_before_starting_anything(tmp_path: Path) -> None:
    data = tmp_path / "rmq"
    one_error_line(
        rmq("up", "--dledger", "3", "--slaves", "1", "--data-dir", str(data)),
        "--slaves 1 cannot be combined with --dledger 3",
    )
    bad = tmp_path / "cluster.toml"
    bad.write_text("masters = 2\nslavs = 1\n")
    one_error_line(rmq("up", "--config", str(bad), "--data-dir", str(data)), "'slavs'")
    bad.write_text("[nodes.broker-a]\nbroker_conf = { flushDiskType = 'SOMETIMES' }\n")
    one_error_line(
        rmq("up", "--config", str(bad), "--data-dir", str(data)),
        "nodes.broker-a.broker_conf.flushDiskType",
    )
    one_error_line(rmq("up", "--config", str(tmp_path / "missing.toml")), "cannot read")
    assert not data.exists()


def test_a_topology_file_starts_its_cluster_with_its_properties(tmp_path: Path) -> None:
    base = free_block()
    data = tmp_path / "from-file"
    conf = tmp_path / "cluster.toml"
    conf.write_text(
        f'cluster = "FileCluster"\nslaves = 2\nnamesrv_port = {base + 35}\n'
        f'broker_port = {base}\ndata_dir = "{data}"\n'
        "[nodes.broker-a]\nbroker_conf = { maxMessageSize = 2048 }\n"
    )
    seen: list[int] = []
    try:
        # a typed flag wins over the file (slaves 2 -> 0); untyped defaults do not (cluster)
        r = rmq("up", "--detach", "--config", str(conf), "--slaves", "0")
        assert r.returncode == 0, r.stderr
        seen = [n["pid"] for n in state_of(data)["nodes"]]
        assert [n["name"] for n in state_of(data)["nodes"]] == ["namesrv", "broker-a"]
        assert "ASYNC_MASTER broker-a id 0, cluster FileCluster" in r.stdout
        # the broker runs with the file's property: it refuses a body over 2048 bytes
        from rmq import Message, sync

        with sync.Producer("file-pg", f"127.0.0.1:{base + 35}") as p:
            assert p.send(Message("FileTopic", b"x" * 100)).status.name == "SEND_OK"
            with pytest.raises(Exception, match="(?i)too large|size|body"):
                p.send(Message("FileTopic", b"x" * 4096))
        # --config finds the cluster's data dir for the other commands too
        r = rmq("status", "--config", str(conf), "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["cluster"] == "FileCluster"
        r = rmq("down", "--config", str(conf))
        assert r.returncode == 0, r.stderr
        assert wait_gone(seen, 5) == []
    finally:
        kill_leftovers(data, seen)


@pytest.mark.parametrize("command", ["up", "down", "status", "kill", "restart"])
def test_every_command_has_examples_in_its_help(command: str) -> None:
    r = rmq(command, "--help")
    assert r.returncode == 0, r.stderr
    assert "Examples:" in r.stdout and f"rmq {command}" in r.stdout
