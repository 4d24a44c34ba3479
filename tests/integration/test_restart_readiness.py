"""Readiness of a restarted master (`rmq restart`): it waits for running slaves, not dead ones.

Stand-in node processes and an injected probe that applies the real probe's HA rule (a master
serves once it counts an HA connection from every slave the plan gives it) with slaves that
never connect: so only a plan without the dead slave can make the master ready.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from cli.errors import ControlError
from cli.local.supervisor import Supervisor, run_up
from cli.local.up import ClusterPlan, NodeSpec, UpEvent, plan_cluster, slaves_of

pytestmark = pytest.mark.integration

SERVE = "import sys; print('serving', flush=True); sys.stdin.read()"


def command_for(node: NodeSpec, plan: ClusterPlan, data_dir: Path) -> list[str]:
    return [sys.executable, "-c", SERVE]


class Probe:
    """Ready at the first start; afterwards a master serves only when the plan it is probed
    with gives it no slave to wait for (the stand-in slaves never open an HA connection)."""

    def __init__(self) -> None:
        self.started = False

    async def __call__(self, plan: ClusterPlan, nodes: tuple[NodeSpec, ...]) -> bool:
        if not self.started:
            return True
        return all(n.broker_id != 0 or slaves_of(plan, n) == 0 for n in nodes if n.kind == "broker")


async def test_restart_of_a_master_whose_slave_is_dead_does_not_wait_for_it(tmp_path: Path) -> None:
    plan = plan_cluster(namesrv_port=20130, broker_port=20100, slaves=1)
    events: list[UpEvent] = []
    probe = Probe()
    async with trio.open_nursery() as nursery:
        sup: Supervisor = await nursery.start(
            lambda task_status: run_up(
                plan,
                tmp_path,
                report=events.append,
                probe=probe,
                command_for=command_for,
                task_status=task_status,
            )
        )
        probe.started = True
        with trio.fail_after(20):
            await sup.kill("broker-a-s1")
            ns = await sup.restart("broker-a", timeout=10)
        assert ns.node.name == "broker-a" and ns.running
        # with its slave alive, the master still waits for it (that is what `ready` promises)
        with trio.fail_after(20), pytest.raises(ControlError, match="does not serve yet"):
            await sup.restart("broker-a-s1", timeout=5)
            await sup.restart("broker-a", timeout=0.5)
        nursery.cancel_scope.cancel()
