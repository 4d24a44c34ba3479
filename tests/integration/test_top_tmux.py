"""`rmq top` for real: a `rmq up` cluster (nameserver, SYNC_MASTER, slave as processes).

First `rmq top --once` in a subprocess (a whole frame as text), then the live TUI inside a
detached tmux session on a private tmux socket: the pane is captured until the topology is
on screen; then the slave is killed by pid and its row must turn red (the SGR colour codes of
`capture-pane -e`) while top keeps refreshing; ctrl-C must end top with status 130 (as every
command Ctrl-C stops). The tmux server of this test is killed by its own socket, the cluster
by pid. A missing tmux fails the
test (CI installs it), it is not skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from rmq import Message, Producer, SendStatus

if TYPE_CHECKING:
    from tests.conftest import LocalCluster

pytestmark = pytest.mark.integration

TOPIC = "TopTuiTopic"
ROOT = Path(__file__).resolve().parents[2]
RED = re.compile(r"\x1b\[(?:[0-9;]*;)?31(?:;[0-9;]*)?m")  # SGR foreground red


def produce(namesrv: str, n: int = 5) -> None:
    async def main() -> None:
        async with Producer("top_pg", namesrv) as p:
            for i in range(n):
                r = await p.send(Message(TOPIC, f"m{i}".encode()))
                assert r.status is SendStatus.SEND_OK

    trio.run(main)


def node_lines(cluster: LocalCluster) -> dict[str, tuple[str, int]]:
    """role ("namesrv", "SYNC_MASTER", "SLAVE") -> (address, pid) from `rmq up`'s output."""
    out = {}
    for line in cluster.lines:
        m = re.match(r"^\S+\s+(\S+:\d+)\s+pid\s+(\d+)\s+(\S+)", line)
        if m:
            out[m.group(3) if m.group(3) != "nameserver" else "namesrv"] = (
                m.group(1),
                int(m.group(2)),
            )
    return out


def test_top_once_shows_the_cluster(module_cluster):
    produce(module_cluster.namesrv_addr)
    nodes = node_lines(module_cluster)
    assert {"SYNC_MASTER", "SLAVE"} <= set(nodes), module_cluster.output()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "-n",
            module_cluster.namesrv_addr,
            "top",
            "--once",
            "--interval",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "160", "LINES": "50"},
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in (
        "broker-a",
        "SYNC_MASTER",
        "SLAVE",
        nodes["SYNC_MASTER"][0],
        nodes["SLAVE"][0],
        TOPIC,
        "DefaultCluster",
    ):
        assert needle in out, (needle, out)
    [row] = [ln for ln in out.splitlines() if TOPIC in ln]
    assert "5" in row.split()  # 5 messages over the topic's queues
    assert "DOWN" not in out and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_top_live_in_tmux_node_turns_red_and_ctrl_c_exits(module_cluster, tmp_path):
    tmux = shutil.which("tmux") or "/usr/bin/tmux"
    assert Path(tmux).exists(), "tmux is required for this test (apt-get install tmux)"
    nodes = node_lines(module_cluster)
    slave_addr, slave_pid = nodes["SLAVE"]
    master_addr = nodes["SYNC_MASTER"][0]
    sock = f"rmqtop-{uuid.uuid4().hex[:8]}"  # a private tmux server, killed at the end

    def tm(*args: str) -> str:
        return subprocess.run(
            [tmux, "-L", sock, *args], capture_output=True, text=True, check=True, timeout=10
        ).stdout

    def capture(escapes: bool = False) -> str:
        return tm("capture-pane", "-p", *(["-e"] if escapes else []), "-t", "top")

    def capture_history() -> str:
        return tm("capture-pane", "-p", "-S", "-200", "-t", "top")[-3000:]

    def wait_for(pred: Callable[[str], bool], what: str, timeout: float = 40.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = capture(escapes=True)
            if pred(screen):
                return screen
            time.sleep(0.3)
        raise AssertionError(f"{what} not on screen within {timeout}s:\n{screen!r}")

    # the tmux server inherits this process's environment, where COLUMNS/LINES may be set
    # (rich would take them over the pane's real size): a user's terminal has neither
    # The shell traps SIGINT (a handler, not an ignore, so top gets the default) and prints
    # top's exit status after ctrl-C.
    cmd = (
        f"trap true INT; cd {ROOT} && env -u COLUMNS -u LINES {sys.executable} -m cli.main "
        f"-n {module_cluster.namesrv_addr} top --interval 0.5 --timeout 1; "
        f"echo rmq-top-exit=$?; sleep 60"
    )
    tm("new-session", "-d", "-s", "top", "-x", "160", "-y", "50", cmd)
    try:
        needles = ("broker-a", "SYNC_MASTER", "SLAVE", master_addr, slave_addr, TOPIC)
        plain = re.compile(r"\x1b\[[0-9;]*m")
        wait_for(lambda s: all(n in plain.sub("", s) for n in needles), "the topology")

        os.kill(slave_pid, signal.SIGKILL)  # `rmq up` started it; the pid is from its output

        def slave_red(screen: str) -> bool:
            rows = [
                ln
                for ln in screen.splitlines()
                if slave_addr in plain.sub("", ln) and "DOWN" in plain.sub("", ln)
            ]
            return any(RED.search(ln) for ln in rows)

        screen = plain.sub("", wait_for(slave_red, "the slave's red DOWN row"))
        assert "1 down" in screen
        assert master_addr in screen and TOPIC in screen  # the rest is still shown
        # top keeps refreshing: the clock in the header moves on
        first = capture().splitlines()[0]
        deadline = time.monotonic() + 10  # polled: one slow refresh on a busy host is fine
        while capture().splitlines()[:1] == [first]:
            assert time.monotonic() < deadline, f"the header stayed {first!r} for 10 s"
            time.sleep(0.3)

        tm("send-keys", "-t", "top", "C-c")
        screen = wait_for(lambda s: "rmq-top-exit=" in s, "top's exit status", timeout=15)
        assert "rmq-top-exit=130" in screen, capture_history()
        assert "Traceback" not in capture()
    finally:
        subprocess.run([tmux, "-L", sock, "kill-server"], capture_output=True, timeout=10)
