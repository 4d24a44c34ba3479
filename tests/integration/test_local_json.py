"""`--json` of the local-cluster commands, and `rmq status` on a cluster with a dead node.

A real `rmq up` (one nameserver, one ASYNC_MASTER: the smallest cluster) on free loopback
ports in tmp_path. Whatever happens, every process a test started is stopped by pid in a
`finally`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.chaos.port_blocks import free_port_block
from cli.local.state import read_state

pytestmark = pytest.mark.integration


def rmq(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=timeout
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def kill_leftovers(data_dir: Path, pids: list[int]) -> None:
    state = read_state(data_dir)
    if state is not None:
        pids = [state["supervisor_pid"], *(n["pid"] for n in state["nodes"] if n["pid"]), *pids]
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_detached_cluster_commands_print_json(tmp_path: Path) -> None:
    data = tmp_path / "rmq"
    base = free_port_block(20)
    seen: list[int] = []
    try:
        r = rmq(
            "up",
            "--detach",
            "--json",
            "--slaves",
            "0",
            "--data-dir",
            str(data),
            "--namesrv-port",
            str(base + 15),
            "--broker-port",
            str(base),
        )
        assert r.returncode == 0, r.stderr
        up = json.loads(r.stdout)  # one document, nothing else on stdout
        seen += [up["supervisor_pid"], *(n["pid"] for n in up["nodes"])]
        assert up["state"] == "ready" and up["problems"] == []
        assert [(n["name"], n["status"], n["port"]) for n in up["nodes"]] == [
            ("namesrv", "alive", base + 15),
            ("broker-a", "alive", base),
        ]
        # the supervisor's log says where this detached run began
        log = (data / "logs" / "supervisor.log").read_text()
        assert f"rmq up: starting supervisor pid {up['supervisor_pid']} ====" in log

        r = rmq("kill", "broker-a", "--json", "--data-dir", str(data))
        assert r.returncode == 0, r.stderr
        killed = json.loads(r.stdout)
        assert (killed["name"], killed["status"], killed["returncode"]) == (
            "broker-a",
            "exited",
            -signal.SIGKILL,
        )

        # status tells the truth: not "ready" with a dead broker
        status = json.loads(rmq("status", "--json", "--data-dir", str(data)).stdout)
        assert status["state"] == "degraded"
        assert status["problems"] == ["broker-a exited (-9)"]
        r = rmq("status", "--data-dir", str(data))
        assert r.returncode == 0 and "degraded: broker-a exited (-9)" in r.stdout, r.stdout

        r = rmq("restart", "broker-a", "--json", "--data-dir", str(data))
        assert r.returncode == 0, r.stderr
        restarted = json.loads(r.stdout)
        seen.append(restarted["pid"])
        assert (restarted["status"], restarted["restarts"]) == ("alive", 1)
        assert json.loads(rmq("status", "--json", "--data-dir", str(data)).stdout)["state"] == (
            "ready"
        )

        r = rmq("down", "--json", "--data-dir", str(data))
        assert r.returncode == 0, r.stderr
        down = json.loads(r.stdout)
        assert down["stopped"] == ["namesrv", "broker-a"]
        assert down["supervisor_pid"] == up["supervisor_pid"]
        assert not any(alive(p) for p in seen)
    finally:
        kill_leftovers(data, seen)


def test_foreground_up_json_is_one_object_per_line(tmp_path: Path) -> None:
    data = tmp_path / "rmq"
    base = free_port_block(20)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.main",
            "up",
            "--json",
            "--slaves",
            "0",
            "--data-dir",
            str(data),
            "--namesrv-port",
            str(base + 15),
            "--broker-port",
            str(base),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    events: list[dict] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            events.append(json.loads(line))
            if events[-1]["event"] == "ready":
                break
        spawned = {e["node"]["name"]: e for e in events if e["event"] == "spawned"}
        assert set(spawned) == {"namesrv", "broker-a"}
        assert spawned["broker-a"]["node"]["role"] == "ASYNC_MASTER"
        assert spawned["broker-a"]["node"]["port"] == base
        assert events[-1] == {"event": "ready", "node": None}
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        rest = [json.loads(line) for line in out.splitlines()]
        assert [e["event"] for e in rest] == ["stopping", "stopped", "stopped", "stopped"], rest
        assert rest[-1] == {"event": "stopped", "node": None}
        assert {e["node"]["name"] for e in rest[1:3]} == {"namesrv", "broker-a"}
        assert proc.returncode == 130, err  # Ctrl-C's status, after a clean stop
        assert err == "", err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_leftovers(data, [e["pid"] for e in events if e.get("pid")])
