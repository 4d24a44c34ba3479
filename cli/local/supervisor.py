"""The `rmq up` supervisor: one OS process per node, watched from one Trio nursery.

Theory of operation:

* Every node of the plan has a `NodeState`. Spawning a node opens its process (stdout and
  stderr appended to `<data-dir>/logs/<node>.log`, stdin a pipe only the supervisor holds, its
  own session so a terminal Ctrl-C reaches only the supervisor) and starts one watcher task for
  that process in the supervisor's nursery. The watcher is the only place that learns a
  process ended: it records the exit code, sets the state's `exited` event and reports.
* Before `ready`, a node that exits fails the whole start (`NodeFailed`, with its log tail):
  the user asked for a cluster and did not get it. After `ready`, a node that exits is shown
  (exit code, last log lines) and the others keep running: a slave must outlive its master,
  that is what it is for. Such a node can be started again (`restart`).
* `kill` sends SIGKILL and waits for the watcher to see the exit; `restart` stops the node
  (SIGTERM, SIGKILL after `stop_timeout`) when it runs and spawns the same command line again:
  same ports, same store directory, same log file (appended). A restarted node is
  `restarting` until the readiness probe sees it serve, then `alive` again (a restarted
  master waits for the HA connections of its running slaves only). An exit the
  supervisor asked for (`exit_requested`) is never reported as a crash.
* Shutdown (`stop_all`, shielded by the caller) goes slaves -> masters -> nameserver, so each
  broker unregisters while the nameserver still listens; SIGKILL after `stop_timeout`; every
  child is reaped, so nothing outlives the supervisor. Should the supervisor itself die, every
  child sees EOF on its stdin and stops by itself.
* `snapshot()` is what `rmq status` shows and what the state file records: the cluster's
  state (`ready` only while every node serves; `degraded` with the reasons when one has
  exited or is being restarted) and per node its name, role, brokerId, ports, pid, status,
  last exit code and, for an exited node, the last lines its current run logged.
* Each start of a node writes a separator line with the time and pid into its log (which
  is appended to across runs and restarts), and the node's tail is read from there on, so
  "last log lines" never show an earlier run.
"""

from __future__ import annotations

import enum
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from cli.errors import ControlError
from cli.local.state import control_channel
from cli.local.up import (
    ClusterPlan,
    CommandFor,
    NodeFailed,
    NodeSpec,
    Probe,
    UpEvent,
    log_tail,
    node_command,
    probe_cluster,
    with_separator,
    write_node_config,
)
from common.errors import RmqError, unwrapping_groups


class NodeStatus(enum.Enum):
    STARTING = "starting"  # spawned, the cluster is not ready yet
    ALIVE = "alive"
    EXITED = "exited"  # ended without the supervisor stopping it (crash or `rmq kill`)
    RESTARTING = "restarting"  # being stopped or respawned, or respawned and not serving yet
    STOPPING = "stopping"
    STOPPED = "stopped"


class ClusterState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    # never the supervisor's own state: what `rmq status` shows for READY while a node does
    # not serve (exited, being restarted), so "ready" always means every node serves
    DEGRADED = "degraded"
    STOPPING = "stopping"


@attrs.define(eq=False)
class NodeState:
    node: NodeSpec
    log_path: Path
    process: trio.Process | None = None  # the latest process; None before the first spawn
    status: NodeStatus = NodeStatus.STARTING
    returncode: int | None = None  # exit code of the latest process once it ended
    restarts: int = 0
    # True while the supervisor itself ends `process` (kill, restart, stop): not a crash
    exit_requested: bool = False
    # set by the watcher once `process` ended; replaced on every spawn
    exited: trio.Event = attrs.Factory(trio.Event)
    # set once `process` serves after a restart; replaced on every spawn
    serving: trio.Event = attrs.Factory(trio.Event)
    # a kill/restart of this node is under way; a second one is refused
    busy: bool = False
    # byte offset in `log_path` where the latest process's run begins (its separator line)
    log_start: int = 0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def to_json(self) -> dict[str, Any]:
        n = self.node
        return {
            "name": n.name,
            "kind": n.kind,
            "role": n.role or "NAMESRV",
            "broker_name": n.broker_name,
            # a DLedger member's brokerId follows its Raft role: `rmq cluster` shows it
            "broker_id": n.broker_id if n.kind == "broker" and not n.is_dledger else None,
            "cluster": n.cluster,
            "addr": n.addr,
            "port": n.port,
            "ha_port": n.ha_port,
            "vip_port": n.vip_port,
            "dledger_self_id": n.dledger_self_id,
            "dledger_port": n.dledger_port,
            # the Prometheus endpoint (docs/metrics.md)
            "metrics_port": n.metrics_port,
            "metrics": n.metrics_url,
            # RocketMQ 5's gRPC endpoint (broker/grpc), host:port
            "grpc": n.grpc_addr,
            "pid": self.pid,
            "status": self.status.value,
            "returncode": self.returncode,
            "restarts": self.restarts,
            "log": str(self.log_path),
            "log_tail": (
                log_tail(self.log_path, 5, start=self.log_start)
                if self.status is NodeStatus.EXITED
                else None
            ),
        }


@attrs.define(eq=False)
class Supervisor:
    plan: ClusterPlan
    data_dir: Path
    report: Callable[[UpEvent], None]
    probe: Probe
    command_for: CommandFor
    ready_timeout: float = 30.0
    stop_timeout: float = 10.0
    poll_interval: float = 0.05
    # called after every change a state file should record (spawns, statuses)
    on_change: Callable[[], None] = lambda: None
    state: ClusterState = ClusterState.STARTING
    # set by `down` (control channel): `run` returns and its caller stops everything
    stop_requested: trio.Event = attrs.Factory(trio.Event)
    nodes: dict[str, NodeState] = attrs.Factory(dict)
    # the nursery watchers run in; set by `run` before the first spawn
    _nursery: trio.Nursery | None = None

    def __attrs_post_init__(self) -> None:
        log_dir = self.data_dir / "logs"
        for node in self.plan.nodes:
            self.nodes[node.name] = NodeState(node, log_dir / f"{node.name}.log")

    # --- the lifecycle ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Supervisor]) -> None:
        """Spawn every node, wait until all serve, report `ready`, run until `stop_requested`
        or cancelled; then stop every node (shielded, bounded)."""
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        deadline = trio.current_time() + self.ready_timeout
        try:
            with unwrapping_groups():
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    # All at once: a broker retries its registration quickly until the
                    # nameserver listens, so nothing waits for another interpreter to start.
                    for ns in self.nodes.values():
                        await self._spawn(ns, NodeStatus.STARTING)
                    if not await self._wait_serving(self.plan.nodes, deadline):
                        raise NodeFailed(
                            f"cluster not ready after {self.ready_timeout:g} s; "
                            f"logs are in {self.data_dir / 'logs'}"
                        )
                    self.state = ClusterState.READY
                    for ns in self.nodes.values():
                        if ns.running:
                            ns.status = NodeStatus.ALIVE
                    self.on_change()
                    self.report(UpEvent("ready"))
                    task_status.started(self)
                    await self.stop_requested.wait()
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                self.state = ClusterState.STOPPING
                if any(ns.process is not None for ns in self.nodes.values()):
                    self.report(UpEvent("stopping"))
                await self.stop_all()

    async def _spawn(self, ns: NodeState, status: NodeStatus) -> None:
        assert self._nursery is not None
        write_node_config(ns.node, self.data_dir)
        log_fd = os.open(ns.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            log_start = os.fstat(log_fd).st_size
            # the separator line is the child's own first write (up.with_separator): it
            # names the pid and precedes the node's output; the tail of this run reads from
            # `log_start`
            process = await trio.lowlevel.open_process(
                with_separator(
                    self.command_for(ns.node, self.plan, self.data_dir),
                    ns.node.name,
                    ns.restarts,
                ),
                stdin=subprocess.PIPE,
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            os.close(log_fd)  # the child holds its own copy
        ns.log_start = log_start
        ns.process = process
        ns.status = status
        ns.returncode = None
        ns.exit_requested = False
        ns.exited = trio.Event()
        ns.serving = trio.Event()
        self._nursery.start_soon(self._watch, ns, process)
        self.report(UpEvent("spawned", ns.node, process.pid, log_path=ns.log_path))
        self.on_change()

    async def _watch(self, ns: NodeState, process: trio.Process) -> None:
        code = await process.wait()
        if ns.process is not process:
            return  # already replaced (cannot happen while the old one runs, but be sure)
        ns.returncode = code
        ns.exited.set()
        if ns.exit_requested and ns.status in (NodeStatus.STOPPING, NodeStatus.RESTARTING):
            return  # stop_all / restart report it themselves
        if self.state is ClusterState.STARTING:
            tail = log_tail(ns.log_path, start=ns.log_start)
            raise NodeFailed(
                f"{ns.node.name} exited with code {code}; log {ns.log_path}"
                + (f":\n{tail}" if tail else "")
            )
        # A running cluster outlives one node: report it and keep the others up.
        requested = ns.exit_requested
        ns.status = NodeStatus.EXITED
        self.on_change()
        detail = None if requested else log_tail(ns.log_path, 5, start=ns.log_start)
        self.report(UpEvent("exited", ns.node, process.pid, code, ns.log_path, detail=detail))

    async def _wait_serving(self, nodes: tuple[NodeSpec, ...], deadline: float) -> bool:
        with trio.move_on_at(deadline):
            while True:
                if await _probe_quietly(self.probe, self.plan, nodes):
                    return True
                await trio.sleep(self.poll_interval)
        return False

    async def _until_serving(self, ns: NodeState, process: trio.Process) -> None:
        """After a restart: `alive` once the probe sees the node serve (or its process ended)."""
        while ns.process is process and process.returncode is None:
            if await _probe_quietly(self.probe, self._running_plan(ns), (ns.node,)):
                if ns.process is process and process.returncode is None:
                    ns.status = NodeStatus.ALIVE
                    ns.serving.set()
                    self.on_change()
                    self.report(UpEvent("restarted", ns.node, process.pid, log_path=ns.log_path))
                return
            await trio.sleep(self.poll_interval)

    def _running_plan(self, ns: NodeState) -> ClusterPlan:
        """The plan without the brokers that are not running: a restarted master waits for
        the HA connections of its running slaves (they reconnect within a second), never for
        one that is dead and cannot come."""
        brokers = tuple(b for b in self.plan.brokers if b is ns.node or self.nodes[b.name].running)
        return attrs.evolve(self.plan, brokers=brokers)

    # --- operations of the control channel -----------------------------------------------

    def node(self, name: str) -> NodeState:
        try:
            return self.nodes[name]
        except KeyError:
            raise ControlError(
                f"no node named {name!r} in this cluster (nodes: {', '.join(self.nodes)})"
            ) from None

    def _operable(self, name: str) -> NodeState:
        ns = self.node(name)
        if self.state is not ClusterState.READY:
            raise ControlError(f"the cluster is {self.state.value}; try again once it is ready")
        if ns.busy:
            raise ControlError(f"{name} is already being killed or restarted")
        return ns

    async def kill(self, name: str) -> NodeState:
        """SIGKILL `name`; returns once the supervisor has seen it exit."""
        ns = self._operable(name)
        if not ns.running or ns.process is None:
            raise ControlError(
                f"{name} is not running ({ns.status.value}, exit code {ns.returncode}); "
                f"`rmq restart {name}` starts it again"
            )
        ns.busy = True
        try:
            ns.exit_requested = True
            ns.process.kill()
            with trio.fail_after(self.stop_timeout):
                await ns.exited.wait()
        finally:
            ns.busy = False
        return ns

    async def restart(self, name: str, timeout: float | None = None) -> NodeState:
        """Stop `name` if it runs, spawn it again (same ports and data) and wait until it
        serves; `ControlError` if it exits again or does not serve within `timeout`."""
        ns = self._operable(name)
        ns.busy = True
        try:
            ns.status = NodeStatus.RESTARTING
            self.report(UpEvent("restarting", ns.node, ns.pid))
            await self._end(ns)
            ns.restarts += 1
            await self._spawn(ns, NodeStatus.RESTARTING)
            process = ns.process
            assert process is not None and self._nursery is not None
            self._nursery.start_soon(self._until_serving, ns, process)
            with trio.move_on_after(self.ready_timeout if timeout is None else timeout):
                async with trio.open_nursery() as race:

                    async def first(event: trio.Event) -> None:
                        await event.wait()
                        race.cancel_scope.cancel()

                    race.start_soon(first, ns.serving)
                    race.start_soon(first, ns.exited)
            if ns.serving.is_set():
                return ns
            if ns.exited.is_set():
                tail = log_tail(ns.log_path, 5, start=ns.log_start)
                raise ControlError(
                    f"{name} exited again with code {ns.returncode}; log {ns.log_path}"
                    + (f":\n{tail}" if tail else "")
                )
            raise ControlError(
                f"{name} was restarted (pid {process.pid}) but does not serve yet; "
                f"see `rmq status` and its log {ns.log_path}"
            )
        finally:
            ns.busy = False

    async def _end(self, ns: NodeState) -> None:
        """SIGTERM, SIGKILL after the bound, reap, close its stdin pipe."""
        process = ns.process
        if process is None:
            return
        ns.exit_requested = True
        if process.returncode is None:
            try:
                process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            with trio.move_on_after(self.stop_timeout):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
        ns.returncode = process.returncode
        if process.stdin is not None:
            await process.stdin.aclose()

    async def stop_all(self) -> None:
        """Slaves (and `rmq up --metrics`'s Prometheus) first, then masters, then the
        nameserver; each group bounded by the timeout."""

        def rank(ns: NodeState) -> int:
            if ns.node.kind == "namesrv":
                return 2
            if ns.node.kind == "prometheus":  # first: its history ends before any node does
                return 0
            return 0 if ns.node.broker_id else 1

        for r in (0, 1, 2):
            group = [ns for ns in self.nodes.values() if rank(ns) == r and ns.process]
            for ns in group:
                ns.exit_requested = True
                ns.status = NodeStatus.STOPPING
                if ns.running and ns.process is not None:
                    try:
                        ns.process.send_signal(signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            with trio.move_on_after(self.stop_timeout):
                for ns in group:
                    assert ns.process is not None
                    await ns.process.wait()
            for ns in group:
                await self._end(ns)
                ns.status = NodeStatus.STOPPED
                self.report(UpEvent("stopped", ns.node, ns.pid, ns.returncode))
        self.on_change()

    def health(self) -> tuple[ClusterState, list[str]]:
        """The state `rmq status` shows, and each node that keeps a ready cluster from
        being `ready` ("broker-a exited (-9)", "broker-a-s1 restarting")."""
        if self.state is not ClusterState.READY:
            return self.state, []
        problems = []
        for ns in self.nodes.values():
            if ns.status is NodeStatus.EXITED:
                problems.append(f"{ns.node.name} exited ({ns.returncode})")
            elif ns.status is not NodeStatus.ALIVE:
                problems.append(f"{ns.node.name} {ns.status.value}")
        return (ClusterState.DEGRADED if problems else ClusterState.READY), problems

    def snapshot(self) -> dict[str, Any]:
        """What `rmq status` shows and the state file records."""
        state, problems = self.health()
        return {
            "supervisor_pid": os.getpid(),
            "state": state.value,
            "problems": problems,
            "cluster": self.plan.namesrv.cluster,
            "namesrv": self.plan.namesrv_addr,
            "data_dir": str(self.data_dir),
            # `rmq up --metrics`: its Prometheus's web UI and API
            "prometheus": None
            if self.plan.prometheus is None
            else f"http://{self.plan.prometheus.addr}",
            # `rmq up --tls`: the CA its clients trust (cli/local/certificates.py)
            "tls_ca": None
            if self.plan.tls_config is None
            else str(self.plan.tls_config.parent / "ca.pem"),
            "nodes": [ns.to_json() for ns in self.nodes.values()],
        }


async def run_up(
    plan: ClusterPlan,
    data_dir: Path,
    *,
    report: Callable[[UpEvent], None] = lambda e: None,
    probe: Probe | None = None,
    command_for: CommandFor = node_command,
    ready_timeout: float = 30.0,
    stop_timeout: float = 10.0,
    poll_interval: float = 0.05,
    control: bool = True,
    task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Spawn every node, report `ready` once all serve, run until cancelled or `rmq down`,
    then stop all. `task_status.started` hands over the `Supervisor`.

    With `control` the supervisor also serves `rmq status/kill/restart/down` on a Unix socket
    and records itself in the data dir's state file (cli/local/state.py) while it runs.
    """
    supervisor = Supervisor(
        plan,
        data_dir,
        report,
        probe or probe_cluster,
        command_for,
        ready_timeout=ready_timeout,
        stop_timeout=stop_timeout,
        poll_interval=poll_interval,
    )
    if not control:
        await supervisor.run(task_status=task_status)
        return
    async with control_channel(supervisor):
        await supervisor.run(task_status=task_status)


async def _probe_quietly(probe: Probe, plan: ClusterPlan, nodes: tuple[NodeSpec, ...]) -> bool:
    try:
        return await probe(plan, nodes)
    except (OSError, ValueError, trio.BrokenResourceError):
        return False  # not listening yet, or an answer that is not (yet) what we wait for
    except RmqError:
        return False  # a node that answers garbage is "not ready yet", not a crash
