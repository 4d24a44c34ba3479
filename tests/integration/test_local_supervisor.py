"""The supervisor's control channel (status / kill / restart / down) with stand-in nodes.

The nodes are tiny Python scripts and the probe is injected, so these tests check the
supervisor's own rules through the real Unix socket and state file: kill shows the node as
exited, restart respawns the same command line, errors are answers (the supervisor stays up),
down stops everything, and the state file disappears with the supervisor.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from cli.errors import ControlError
from cli.local.state import (
    NoCluster,
    Refused,
    control_socket_path,
    read_state,
    request,
    running_supervisor,
)
from cli.local.supervisor import Supervisor, run_up
from cli.local.up import ClusterPlan, CommandFor, NodeSpec, UpEvent, plan_cluster

pytestmark = pytest.mark.integration

SERVE = "import sys; print('serving', flush=True); sys.stdin.read()"
CRASH_LATER = (
    "import sys, time; print('serving', flush=True); time.sleep(0.5); "
    "print('boom: out of disk', flush=True); sys.exit(3)"
)


def node_name(e: UpEvent) -> str:
    assert e.node is not None, e
    return e.node.name


def pid_of(e: UpEvent) -> int:
    assert e.pid is not None, e
    return e.pid


def commands(**scripts: str) -> CommandFor:
    def command_for(node: NodeSpec, plan: ClusterPlan, data_dir: Path) -> list[str]:
        return [sys.executable, "-c", scripts.get(node.name.replace("-", "_"), SERVE)]

    return command_for


async def always_ready(plan: ClusterPlan, nodes: tuple[NodeSpec, ...]) -> bool:
    return True


def alive(pid: int | None) -> bool:
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def ask(data_dir: Path, op: str, **args: Any) -> dict[str, Any]:
    return await trio.to_thread.run_sync(lambda: request(data_dir, op, args, timeout=20))


async def logged(data_dir: Path, node: str, times: int) -> None:
    """Until `node`'s log shows `times` starts of the stand-in script (it prints 'serving')."""
    log = data_dir / "logs" / f"{node}.log"
    while log.read_text().count("serving") < times:  # noqa: ASYNC110 - a child process
        await trio.sleep(0.02)


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


async def test_status_kill_restart_and_down_over_the_socket(tmp_path: Path) -> None:
    events: list[UpEvent] = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            sup = await start(nursery, tmp_path, events)
            state = read_state(tmp_path)
            assert state is not None and state["supervisor_pid"] == os.getpid()
            assert running_supervisor(tmp_path) is not None

            status = await ask(tmp_path, "status")
            assert status["state"] == "ready"
            nodes = {n["name"]: n for n in status["nodes"]}
            assert list(nodes) == ["namesrv", "broker-a", "broker-a-s1"]
            assert all(n["status"] == "alive" and alive(n["pid"]) for n in nodes.values())
            assert nodes["broker-a-s1"]["broker_id"] == 1 and nodes["broker-a-s1"]["port"] == 20010
            assert nodes["broker-a"]["ha_port"] == 20001 and nodes["broker-a"]["vip_port"] == 19998

            await logged(tmp_path, "broker-a", 1)
            old = nodes["broker-a"]["pid"]
            killed = (await ask(tmp_path, "kill", node="broker-a"))["node"]
            assert killed["status"] == "exited" and killed["returncode"] == -signal.SIGKILL
            assert not alive(old)
            exited = [e for e in events if e.kind == "exited"]
            assert [node_name(e) for e in exited] == ["broker-a"] and exited[0].detail is None
            # the state file follows
            state = read_state(tmp_path)
            assert state is not None
            recorded = {n["name"]: n for n in state["nodes"]}
            assert recorded["broker-a"]["status"] == "exited"

            with pytest.raises(Refused, match="broker-a is not running"):
                await ask(tmp_path, "kill", node="broker-a")
            with pytest.raises(Refused, match="no node named 'nosuch'.*broker-a-s1"):
                await ask(tmp_path, "restart", node="nosuch")

            restarted = (await ask(tmp_path, "restart", node="broker-a"))["node"]
            assert restarted["status"] == "alive" and restarted["restarts"] == 1
            assert restarted["pid"] != old and alive(restarted["pid"])
            assert restarted["port"] == 20000  # same plan, same ports
            # a running node restarts too: stopped first, then spawned again
            slave_pid = nodes["broker-a-s1"]["pid"]
            again = (await ask(tmp_path, "restart", node="broker-a-s1"))["node"]
            assert not alive(slave_pid) and alive(again["pid"])
            assert [e.kind for e in events if e.kind.startswith("restart")] == [
                "restarting",
                "restarted",
                "restarting",
                "restarted",
            ]
            # one log per node, appended across restarts (the probe here does not wait for it)
            await logged(tmp_path, "broker-a", 2)

            final = await ask(tmp_path, "status")
            pids = [n["pid"] for n in final["nodes"]]
            await ask(tmp_path, "down")
            with trio.fail_after(10):
                await sup.stop_requested.wait()
    # run_up returned by itself (down), the nursery closed without being cancelled from here
    assert not any(alive(p) for p in pids)
    assert read_state(tmp_path) is None
    assert not control_socket_path(tmp_path).exists()
    with pytest.raises(NoCluster):
        request(tmp_path, "status")
    assert [e.kind for e in events][-1] == "stopped"


async def test_a_crash_after_ready_is_shown_with_its_log_and_can_be_restarted(
    tmp_path: Path,
) -> None:
    events: list[UpEvent] = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            # the cluster is ready at once; a restarted node alone never serves (it crashes)
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
            assert node_name(exited) == "broker-a-s1" and exited.returncode == 3
            assert "boom: out of disk" in (exited.detail or "")
            status = await ask(tmp_path, "status")
            slave = next(n for n in status["nodes"] if n["name"] == "broker-a-s1")
            assert slave["status"] == "exited" and slave["returncode"] == 3
            assert "boom: out of disk" in slave["log_tail"]
            # the others keep running
            assert all(n["status"] == "alive" for n in status["nodes"] if n is not slave)
            # it starts again, and crashes again: the restart says so (with the log)
            with pytest.raises(Refused, match="broker-a-s1 exited again with code 3"):
                await ask(tmp_path, "restart", node="broker-a-s1", wait=10)
        nursery.cancel_scope.cancel()


async def test_bad_requests_get_answers_and_the_supervisor_stays_up(tmp_path: Path) -> None:
    events: list[UpEvent] = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await start(nursery, tmp_path, events)
            with pytest.raises(Refused, match="unknown control operation 'explode'"):
                await ask(tmp_path, "explode")
            path = str(control_socket_path(tmp_path))

            def raw(data: bytes) -> dict:
                with socket.socket(socket.AF_UNIX) as s:
                    s.settimeout(10)
                    s.connect(path)
                    s.sendall(data)
                    s.shutdown(socket.SHUT_WR)
                    return json.loads(s.makefile().readline())

            for junk in (b"not json\n", b"[1, 2]\n", b'{"op": "kill"}\n', b""):
                reply = await trio.to_thread.run_sync(raw, junk)
                assert reply == {"ok": False, "error": "bad control request"}
            assert (await ask(tmp_path, "status"))["state"] == "ready"
        nursery.cancel_scope.cancel()


async def test_a_second_supervisor_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    events: list[UpEvent] = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await start(nursery, tmp_path, events)
        # another process's record (ours is this very process, so fake a live other pid)
        state = read_state(tmp_path)
        assert state is not None
        nursery.cancel_scope.cancel()
    from cli.local.state import write_state

    other = await trio.lowlevel.open_process([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_state(tmp_path, {**state, "supervisor_pid": other.pid, "start_time": None})
        with pytest.raises(ControlError, match=f"already running .*pid {other.pid}"):
            await run_up(
                plan_cluster(namesrv_port=20030, broker_port=20000),
                tmp_path,
                probe=always_ready,
                command_for=commands(),
            )
    finally:
        other.kill()
        await other.wait()
    # refused before spawning anything: the first run's namesrv printed once, no one else since
    assert (tmp_path / "logs" / "namesrv.log").read_text().count("serving") <= 1


async def test_kill_and_restart_wait_for_ready(tmp_path: Path) -> None:
    """Before `ready` the supervisor refuses operations on nodes (the start may still fail)."""

    async def never(plan: ClusterPlan, nodes: tuple[NodeSpec, ...]) -> bool:
        return False

    events: list[UpEvent] = []
    plan = plan_cluster(namesrv_port=20030, broker_port=20000)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: run_up(
                plan,
                tmp_path,
                report=events.append,
                probe=never,
                command_for=commands(),
                ready_timeout=30,
            )
        )
        with trio.fail_after(20):
            while read_state(tmp_path) is None:  # noqa: ASYNC110 - written by the supervisor
                await trio.sleep(0.02)
            status = await ask(tmp_path, "status")
            assert status["state"] == "starting"
            with pytest.raises(Refused, match="the cluster is starting"):
                await ask(tmp_path, "kill", node="broker-a")
        nursery.cancel_scope.cancel()
    assert not any(alive(pid_of(e)) for e in events if e.kind == "spawned")
