"""DLedgerRoleChangeHandler: the broker's role follows the member's Raft role (RocketMQ's class
of the same name, ``broker/.../dledger/DLedgerRoleChangeHandler.java`` in apache/rocketmq 4.9).

Theory of operation
-------------------
The node calls :meth:`DLedgerRoleChangeHandler.on_role_change` (a role listener) on every role
change; the events go through a channel to one task, :meth:`run`, which handles them one at a
time, in order (RocketMQ's single-thread executor), so two changes never interleave.

* FOLLOWER: ``change_to_slave``: brokerId ``k + 1`` for member ``n<k>``, role SLAVE (the store
  refuses puts), the delay-level schedule service and the transaction check stopped, the
  slave sync started (metadata and consumer offsets from the master, offsets committed here
  handed to it), the master address forgotten and a registration sent at once (the
  nameserver's "same address, new brokerId" rule replaces this address's old entry).
* CANDIDATE: ``change_to_slave`` only when this broker was the master: a leader that lost its
  quorum must stop acting as one; a member that never led stays as it is.  The core makes a
  leader a candidate when its lease runs out (broker/dledger/raft/election.py, "The leader's
  lease": ``maxHeartBeatLeak * heartBeatTimeIntervalMs`` without a heartbeat quorum); from that
  call on the store refuses puts (SERVICE_NOT_AVAILABLE, 14: ``DLedgerMessageStore.is_master``
  reads the node's role), and this handler re-registers the broker as a slave, so the
  nameserver's route stops naming it brokerId 0.  Both moves are logged at WARNING (a node's log
  shows WARNING and above): when it stops serving as master and when it serves as master again.
* LEADER: every ``poll_interval`` (100 ms) until the member is no longer the leader of that
  term (then nothing: the next event says what it is) or the log is fully caught up (ledger
  end == committed == applied, nothing left to dispatch: ``DLedgerMessageStore.caught_up``);
  then the leader-side queue table is rebuilt from the applied state
  (``become_master``), brokerId 0, role SYNC_MASTER, slave sync stopped, schedule service
  and transaction check started (the check rebuilds its state from the replicated half and
  op records: no decision of the old leader is lost), registration sent at once.  Until then
  the broker answers writes as a slave does.

At start the broker has brokerId -1 and registers nothing (the registrar skips a -1 broker)
until the first role is known; a member that already is leader or follower when the handler
starts (a one-member group elects itself at once) is handled as if the event had come.

The role's services (the schedule service on the master, the slave sync on a slave) run in a
child scope of the handler's nursery, cancelled and awaited before the next role's start.

Consumer offsets and failover: a follower's slave sync runs every ``offset_sync_interval``
(5 s; ``slave_sync_interval`` stays the classic slave's 60 s) so a new leader starts from
offsets at most that old; consumers then commit their own (in-memory) progress to it.  A round
that fails (the master it knows is gone) asks for a registration at once, whose answer names
the new master.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Protocol

import attrs
import trio

from broker.controller import BrokerController
from broker.dledger.broker.applier import DLedgerNodeView
from broker.dledger.broker.message_store import DLedgerMessageStore
from broker.dledger.raft.messages import Role
from broker.registrar import Invoker
from broker.slave_sync import SyncReport, run_slave_sync
from common.mixall import MASTER_ID

log = logging.getLogger(__name__)

MASTER_ROLE = "SYNC_MASTER"
SLAVE_ROLE = "SLAVE"


class RoleEvent(Protocol):
    """A role change as the node reports it (``broker.dledger.raft.core.RoleChanged``)."""

    @property
    def role(self) -> Role: ...

    @property
    def term(self) -> int: ...

    @property
    def leader_id(self) -> str | None: ...


class RoleNode(DLedgerNodeView, Protocol):
    def add_role_listener(self, fn: Callable[[RoleEvent], None]) -> None: ...


@attrs.frozen
class _Seed:
    """The role the node already had when the handler started."""

    role: Role
    term: int
    leader_id: str | None


def slave_broker_id(self_id: str) -> int:
    """RocketMQ's rule: member ``n<k>`` is slave brokerId ``k + 1`` (never 0, the master's)."""
    return int(self_id[1:]) + 1


@attrs.define(eq=False)
class DLedgerRoleChangeHandler:
    controller: BrokerController
    store: DLedgerMessageStore
    node: RoleNode
    # for the slave sync's requests to the master
    client: Invoker
    poll_interval: float = 0.1
    offset_sync_interval: float = 5.0
    # role changes applied so far (tests, logs)
    changes: int = 0
    _send: trio.MemorySendChannel[RoleEvent] = attrs.field(init=False)
    _recv: trio.MemoryReceiveChannel[RoleEvent] = attrs.field(init=False)
    # this broker served as master before and stepped down since (its next change_to_master
    # is logged as a come-back)
    _stepped_down: bool = attrs.field(default=False, init=False)
    # the current role's services: their scope and the event set once they stopped; None when
    # none run
    _services: tuple[trio.CancelScope, trio.Event] | None = attrs.field(default=None, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._send, self._recv = trio.open_memory_channel[RoleEvent](math.inf)

    def on_role_change(self, event: RoleEvent) -> None:
        """The node's role listener: queue the event for :meth:`run`."""
        self._send.send_nowait(event)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        node = self.node
        # the role the node already has, then every change (no checkpoint in between: none is
        # missed).  One change can come twice: the node takes a role at once but tells its
        # listeners only after the term's vote is persisted, so a handler started in between
        # seeds the role and then hears of it (handle() takes the second as a no-op)
        if node.role is Role.LEADER or (node.role is Role.FOLLOWER and node.leader_id):
            self._send.send_nowait(_Seed(node.role, node.term, node.leader_id))
        node.add_role_listener(self.on_role_change)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            async for event in self._recv:
                await self.handle(event)

    async def handle(self, event: RoleEvent) -> None:
        log.info(
            "DLedger %s: %s in term %d (leader %s)",
            self.node.config.self_id,
            event.role.name,
            event.term,
            event.leader_id,
        )
        was_master = self.controller.broker_id == MASTER_ID
        if event.role is Role.FOLLOWER or (event.role is Role.CANDIDATE and was_master):
            await self.change_to_slave()
            if was_master:
                self._stepped_down = True
                c = self.controller
                log.warning(
                    "broker %s (DLedger %s) stopped serving as master: %s in term %d; writes "
                    "are refused with SERVICE_NOT_AVAILABLE, reads are served as slave %d "
                    "(committed entries only)",
                    c.config.broker_name,
                    self.node.config.self_id,
                    "it lost its quorum and is a candidate"
                    if event.role is Role.CANDIDATE
                    else f"it follows {event.leader_id}",
                    event.term,
                    c.broker_id,
                )
        elif self.store.is_master_of(event.term):
            # the role the node had when this handler started, and then the node's own event
            # for it (delivered once the term's vote was persisted): one change, seen twice
            log.info("DLedger %s: master already in term %d", self.node.config.self_id, event.term)
        elif await self._wait_caught_up(event.term):
            await self.change_to_master(event.term)

    async def _wait_caught_up(self, term: int) -> bool:
        node = self.node
        while True:
            if node.role is not Role.LEADER or node.term != term:
                log.info("DLedger %s: no longer leader of term %d", node.config.self_id, term)
                return False
            if self.store.caught_up():
                return True
            await trio.sleep(self.poll_interval)

    async def change_to_slave(self) -> None:
        c = self.controller
        broker_id = slave_broker_id(self.node.config.self_id)
        self.store.step_down()
        c.set_role(broker_id, SLAVE_ROLE)
        await self._stop_services()
        await self._start_services(slave=True)
        self._register(forget_master=True)
        self.changes += 1
        log.info("broker %s is slave %d now", c.config.broker_name, broker_id)

    async def change_to_master(self, term: int) -> None:
        c = self.controller
        await self._stop_services()
        # entries may have committed while the services stopped: caught up is judged again,
        # and from that judgement to the table rebuild and the role there is no await (the
        # first put sees all three)
        if not await self._wait_caught_up(term):
            return
        self.store.become_master(term)
        c.set_role(MASTER_ID, MASTER_ROLE)
        await self._start_services(slave=False)
        self._register(forget_master=False)
        self.changes += 1
        if self._stepped_down:
            self._stepped_down = False
            log.warning(
                "broker %s (DLedger %s) serves as master again (leader of term %d)",
                c.config.broker_name,
                self.node.config.self_id,
                term,
            )
        else:
            log.info("broker %s is master now (term %d)", c.config.broker_name, term)

    def _register(self, *, forget_master: bool) -> None:
        registrar = self.controller.registrar
        if registrar is None:
            return
        if forget_master:
            registrar.forget_master()
        registrar.request_register()

    # --- the role's services ------------------------------------------------------------------
    async def _stop_services(self) -> None:
        if self._services is None:
            return
        scope, done = self._services
        self._services = None
        scope.cancel()
        await done.wait()

    async def _start_services(self, *, slave: bool) -> None:
        assert self._nursery is not None, "run() starts the services"
        scope = trio.CancelScope()
        done = trio.Event()
        self._services = (scope, done)
        await self._nursery.start(self._run_services, scope, done, slave)

    async def _run_services(
        self,
        scope: trio.CancelScope,
        done: trio.Event,
        slave: bool,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        c = self.controller
        try:
            with scope:
                async with trio.open_nursery() as nursery:
                    if slave:
                        await nursery.start(
                            functools.partial(
                                run_slave_sync,
                                c,
                                self.client,
                                interval=self.offset_sync_interval,
                                on_round=self._on_sync_round,
                            )
                        )
                    else:
                        await nursery.start(c.schedule_service.run)
                        await nursery.start(c.timer_service.run)
                        await nursery.start(c.run_transaction_check)
                        if c.pop is not None:
                            # rebuilds the pop state from the replicated revive log first
                            await nursery.start(c.pop.run_revive)
                    task_status.started()
        finally:
            if slave:
                c.slave_sync = None
            done.set()

    def _on_sync_round(self, report: SyncReport | None) -> None:
        if report is None or report.errors:
            # no master known, or the one known did not answer: ask the nameservers again
            self._register(forget_master=False)


__all__ = ["DLedgerRoleChangeHandler", "RoleEvent", "RoleNode", "slave_broker_id"]
