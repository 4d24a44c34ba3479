"""The `rmq up` supervisor (cli.local.supervisor.run_up) with stand-in node processes.

The nodes here are tiny Python scripts, so the supervisor's own rules are tested: a node that
dies fails the cluster with its log tail, a node that ignores SIGTERM is killed after the
bound, readiness has a deadline, shutdown goes slaves -> masters -> nameserver.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import trio

from cli.local.supervisor import run_up
from cli.local.up import ClusterPlan, CommandFor, NodeFailed, NodeSpec, UpEvent, plan_cluster

pytestmark = pytest.mark.integration

SERVE = "import sys; sys.stdin.read()"  # runs until stdin closes or a signal ends it
IGNORE_TERM = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ignoring SIGTERM', flush=True); time.sleep(120)"
)
CRASH = "import sys, time; time.sleep(0.3); print('boom: cannot bind', flush=True); sys.exit(3)"


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


async def never_ready(plan: ClusterPlan, nodes: tuple[NodeSpec, ...]) -> bool:
    return False


async def only_namesrv_ready(plan: ClusterPlan, nodes: tuple[NodeSpec, ...]) -> bool:
    return all(n.kind == "namesrv" for n in nodes)


def alive(pid: int | None) -> bool:
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_ready_then_ordered_stop(tmp_path: Path) -> None:
    plan = plan_cluster(namesrv_port=20090, broker_port=20000, masters=2, slaves=1)
    events: list[UpEvent] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: run_up(
                plan,
                tmp_path,
                report=events.append,
                probe=always_ready,
                command_for=commands(),
                task_status=task_status,
            )
        )
        assert events[-1].kind == "ready"
        pids = [pid_of(e) for e in events if e.kind == "spawned"]
        assert len(pids) == 5 and all(alive(p) for p in pids)
        nursery.cancel_scope.cancel()
    stopped = [node_name(e) for e in events if e.kind == "stopped"]
    assert stopped[:2] == ["broker-a-s1", "broker-b-s1"]
    assert stopped[2:4] == ["broker-a", "broker-b"]
    assert stopped[4] == "namesrv"
    assert not any(alive(p) for p in pids)
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == sorted(
        f"{n.name}.log" for n in plan.nodes
    )


async def test_a_node_that_dies_fails_the_cluster_with_its_log(tmp_path: Path) -> None:
    plan = plan_cluster(namesrv_port=20030, broker_port=20000)
    events: list[UpEvent] = []
    with pytest.raises(NodeFailed, match="broker-a exited with code 3") as info:
        with trio.fail_after(20):
            await run_up(
                plan,
                tmp_path,
                report=events.append,
                probe=only_namesrv_ready,
                command_for=commands(broker_a=CRASH),
            )
    assert "boom: cannot bind" in str(info.value)
    pids = [pid_of(e) for e in events if e.kind == "spawned"]
    assert not any(alive(p) for p in pids)
    assert not any(e.kind == "ready" for e in events)


async def test_a_node_that_dies_after_ready_is_reported_and_the_rest_keep_running(
    tmp_path: Path,
) -> None:
    plan = plan_cluster(namesrv_port=20030, broker_port=20000, slaves=1)
    events: list[UpEvent] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: run_up(
                plan,
                tmp_path,
                report=events.append,
                probe=always_ready,
                command_for=commands(),
                task_status=task_status,
            )
        )
        pids = {node_name(e): pid_of(e) for e in events if e.kind == "spawned"}
        os.kill(pids["broker-a"], signal.SIGKILL)
        with trio.fail_after(10):
            while not any(e.kind == "exited" for e in events):  # noqa: ASYNC110 - a child process
                await trio.sleep(0.05)
        exited = [e for e in events if e.kind == "exited"]
        assert [node_name(e) for e in exited] == ["broker-a"]
        assert exited[0].returncode == -signal.SIGKILL
        assert alive(pids["broker-a-s1"]) and alive(pids["namesrv"])
        nursery.cancel_scope.cancel()
    assert not any(alive(p) for p in pids.values())


async def test_not_ready_in_time_is_an_error(tmp_path: Path) -> None:
    plan = plan_cluster(namesrv_port=20030, broker_port=20000)
    events: list[UpEvent] = []
    with pytest.raises(NodeFailed, match="not ready after 0.5 s"):
        await run_up(
            plan,
            tmp_path,
            report=events.append,
            probe=never_ready,
            command_for=commands(),
            ready_timeout=0.5,
        )
    # every node was started at once (not waiting for the nameserver), and all were stopped
    spawned = [node_name(e) for e in events if e.kind == "spawned"]
    assert spawned == [n.name for n in plan.nodes]
    assert sorted(node_name(e) for e in events if e.kind == "stopped") == sorted(spawned)
    assert not any(alive(pid_of(e)) for e in events if e.kind == "spawned")


async def test_a_node_ignoring_sigterm_is_killed_after_the_bound(tmp_path: Path) -> None:
    plan = plan_cluster(namesrv_port=20030, broker_port=20000)
    events: list[UpEvent] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: run_up(
                plan,
                tmp_path,
                report=events.append,
                probe=always_ready,
                command_for=commands(broker_a=IGNORE_TERM),
                stop_timeout=0.5,
                task_status=task_status,
            )
        )
        # the script has installed its handler once it says so (a fixed wait can lose the
        # race to a slow interpreter start)
        log = tmp_path / "logs" / "broker-a.log"
        with trio.fail_after(30):
            while not (log.exists() and "ignoring SIGTERM" in log.read_text()):  # noqa: ASYNC110
                await trio.sleep(0.05)
        start = trio.current_time()
        nursery.cancel_scope.cancel()
    codes = {node_name(e): e.returncode for e in events if e.kind == "stopped"}
    assert codes["broker-a"] == -9  # SIGKILL
    assert codes["namesrv"] == -15  # SIGTERM
    assert trio.current_time() - start < 5
