"""`rmq status` tells the truth about a running local cluster.

* The cluster is `ready` only while every node serves: with a node exited it is
  `degraded: broker-a exited (-9)`, and `ready` again once the node was restarted.
* Node logs are appended across runs, so each start writes a separator line (time, node,
  pid) and "last log lines" come from the current run only, never from an earlier one.
* Logged lines of a node carry a timestamp.

The supervisor runs stand-in nodes (tiny Python scripts) with an injected probe, as in
test_local_supervisor.py; the timestamp test runs a real broker node for a few seconds.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from cli.chaos.port_blocks import free_port_block
from cli.local import render as local_render
from cli.local.state import request
from cli.local.supervisor import Supervisor, run_up
from cli.local.up import ClusterPlan, CommandFor, NodeSpec, UpEvent, plan_cluster

pytestmark = pytest.mark.integration

SERVE = "import sys; print('serving', flush=True); sys.stdin.read()"
CRASH_LATER = (
    "import sys, time; print('serving', flush=True); time.sleep(0.5); "
    "print('this run: out of disk', flush=True); sys.exit(3)"
)
SEPARATOR = re.compile(
    r"^==== \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d rmq up: starting "
    r"(?P<node>\S+) pid (?P<pid>\d+)(?P<again> \(restart \d+\))? ====$"
)


def commands(**scripts: str) -> CommandFor:
    def command_for(node: NodeSpec, plan: ClusterPlan, data_dir: Path) -> list[str]:
        return [sys.executable, "-c", scripts.get(node.name.replace("-", "_"), SERVE)]

    return command_for


async def always_ready(plan: ClusterPlan, nodes: tuple[NodeSpec, ...]) -> bool:
    return True


async def ask(data_dir: Path, op: str, **args: Any) -> dict[str, Any]:
    return await trio.to_thread.run_sync(lambda: request(data_dir, op, args, timeout=20))


async def start(
    nursery: trio.Nursery, data_dir: Path, events: list[UpEvent], **kw: Any
) -> Supervisor:
    plan = plan_cluster(namesrv_port=20030, broker_port=20000, slaves=1)
    kw = {"command_for": commands(), "probe": always_ready, **kw}
    return await nursery.start(
        lambda task_status: run_up(
            plan, data_dir, report=events.append, task_status=task_status, **kw
        )
    )


async def test_status_is_degraded_while_a_node_is_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events: list[UpEvent] = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await start(nursery, tmp_path, events)
            status = await ask(tmp_path, "status")
            assert (status["state"], status["problems"]) == ("ready", [])

            await ask(tmp_path, "kill", node="broker-a")
            status = await ask(tmp_path, "status")
            assert status["state"] == "degraded"
            assert status["problems"] == ["broker-a exited (-9)"]
            capsys.readouterr()
            local_render.status(status)
            out = capsys.readouterr().out
            assert "degraded: broker-a exited (-9)" in out, out
            assert ": ready" not in out

            await ask(tmp_path, "restart", node="broker-a")
            status = await ask(tmp_path, "status")
            assert (status["state"], status["problems"]) == ("ready", [])
        nursery.cancel_scope.cancel()


async def test_last_log_lines_come_from_the_current_run(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    # an earlier `rmq up` left its own last words in the slave's log
    (log_dir / "broker-a-s1.log").write_text(
        "serving\n" + "".join(f"old run: crashed {i}\n" for i in range(10))
    )
    events: list[UpEvent] = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):

            async def whole_cluster_only(plan: ClusterPlan, nodes: tuple[NodeSpec, ...]) -> bool:
                return len(nodes) > 1

            await start(
                nursery,
                tmp_path,
                events,
                probe=whole_cluster_only,
                command_for=commands(broker_a_s1=CRASH_LATER),
            )
            while not any(e.kind == "exited" for e in events):  # noqa: ASYNC110 - a child process
                await trio.sleep(0.05)
            [exited] = [e for e in events if e.kind == "exited"]
            status = await ask(tmp_path, "status")
            slave = next(n for n in status["nodes"] if n["name"] == "broker-a-s1")
            for tail in (exited.detail or "", slave["log_tail"]):
                assert "this run: out of disk" in tail
                assert "old run" not in tail, tail
                first = tail.splitlines()[0]
                m = SEPARATOR.match(first)
                assert m and m["node"] == "broker-a-s1" and int(m["pid"]) == exited.pid, first
            assert status["problems"] == ["broker-a-s1 exited (3)"]

            # a restart is a new run: its own separator, and the tail starts there again
            with pytest.raises(Exception, match="exited again"):
                await ask(tmp_path, "restart", node="broker-a-s1", wait=20)
            status = await ask(tmp_path, "status")
            slave = next(n for n in status["nodes"] if n["name"] == "broker-a-s1")
            first = slave["log_tail"].splitlines()[0]
            m = SEPARATOR.match(first)
            assert m and m["again"] == " (restart 1)" and int(m["pid"]) == slave["pid"], first
            assert slave["log_tail"].count("this run: out of disk") == 1

            # every start of every node is in its log, in order, each before what it printed
            for name in ("namesrv", "broker-a", "broker-a-s1"):
                lines = (log_dir / f"{name}.log").read_text().splitlines()
                starts = [i for i, line in enumerate(lines) if SEPARATOR.match(line)]
                assert len(starts) == (2 if name == "broker-a-s1" else 1), lines
                assert lines[starts[-1] + 1] == "serving", lines
        nursery.cancel_scope.cancel()


def test_node_log_lines_carry_a_timestamp(tmp_path: Path) -> None:
    """A broker node whose nameserver is not there logs its failed registrations."""
    port = free_port_block(10)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.servers.node",
            "broker",
            "--port",
            str(port),
            "--grpc-port",  # as `rmq up` gives it: in the node's block, not the shared 8081
            str(port + 4),
            "--namesrv",
            "127.0.0.1:1",
            "--data-dir",
            str(tmp_path / "b"),
            "--watch-stdin",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while "listening on" in line:
            line = proc.stdout.readline()
        assert re.match(
            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING broker\.registrar: register to name "
            r"server 127\.0\.0\.1:1 failed",
            line,
        ), line
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
