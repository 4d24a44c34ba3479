"""The Trio driver of one DLedger member: runs the sans-I/O core, its timers, replicators, server.

Theory of operation
-------------------
``run_dledger_node`` opens the member's log (the file log under ``<store>/dledger-<id>`` unless
one is injected), loads ``currterm`` and ``checkpoint`` (node_storage.py), builds the
:class:`RaftCore`, binds the member's DLedger address and reports the :class:`DLedgerNode`.
Its nursery then holds:

* the **ticker**: sleeps in a cancel scope whose deadline is ``core.next_deadline()`` on Trio's
  clock; whatever gives the core new work moves that deadline (earlier or later) at once;
* one :class:`~broker.dledger.driver.peer_replicator.PeerReplicator` per peer: the core's
  requests to that peer, written in order and pipelined; answers and failures go back to the
  core;
* the **persister**, which writes each PersistState (in a worker thread for files);
* **flush** (the file log, every flushFileInterval), **checkpoint** (every checkPointInterval)
  and the **disk check** (DISK_FULL at or above ``disk_full_ratio``).

Every core call returns actions, and they run strictly in the order the core produced them,
across calls: they go through one FIFO.  Most run at once (Send -> the peer's replicator,
Committed -> wake ``wait_committed``, AppendDone -> finish proposals, RoleChanged -> the
listeners, TransferDone -> ``transfer_leadership``'s caller), but a PersistState stops the FIFO
until the state is durable; whatever comes after it waits, sends and answers included.  So a
vote is answered only once it is on disk: the request handler puts a marker behind the
request's actions and answers when the FIFO passes it (at once, or through an awaitable the
server awaits).  Listeners are called synchronously and must not block; one may call
``propose`` (its actions join the end of the FIFO, after the ones still queued).

A ``LogReset`` (the leader reset this follower's log to begin at its first entry:
raft/entry_handler.py, "Reset"; the log is already reset and durable when the action runs) calls
the ``on_log_reset(begin_index, begin_pos)`` hook given to ``run_dledger_node``, synchronously,
before the Committed that follows it: the broker drops what it built from the old entries
(consume queues, index) before it applies the new ones.  From then until the log's end reaches
the commit index the leader last sent, ``status().rebuilding`` is true (``rmq top`` shows it).

An admin's LEADERSHIP_TRANSFER to the leader (transferId = the leader) is answered, as DLedger
does, once the transfer has finished; METADATA is answered here (peers and leader).

On cancel: pending proposals end WAIT_QUORUM_ACK_TIMEOUT (their fate is unknown), and a
shielded, bounded final flush and checkpoint run before the log is closed.

Invariants: ``committed_index`` never decreases and only moves through Committed actions; an
action or answer that follows a PersistState never runs before that state was saved; the
requests to one peer are written in the order the core produced them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio

from broker.dledger.driver.mmap_file_store import FileLog
from broker.dledger.driver.node_config import DLedgerConfig
from broker.dledger.driver.node_storage import FileStorage, NodeStorage, open_log
from broker.dledger.driver.peer_replicator import PeerReplicator
from broker.dledger.driver.proposal import PendingProposals, Proposal
from broker.dledger.driver.transport import DLedgerClient, DLedgerNetwork, Reply
from broker.dledger.driver.wire import AnyRequest, AnyResponse
from broker.dledger.raft.core import (
    Action,
    AppendDone,
    Committed,
    LogReset,
    PersistState,
    RaftCore,
    RoleChanged,
    Send,
    TransferDone,
)
from broker.dledger.raft.log import RaftLog
from broker.dledger.raft.messages import (
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    MetadataRequest,
    MetadataResponse,
    Request,
    Response,
    Role,
)
from broker.store.page_warmer import run_page_warmer
from common.remoting.codes import DLedgerResponseCode
from common.remoting.deferred_answer import flush_in_batch

__all__ = ["DLedgerConfig", "DLedgerNode", "NodeStatus", "Proposal", "run_dledger_node"]

log = logging.getLogger(__name__)

# A core deadline already past after a tick is retried this much later (never a busy loop).
MIN_TICK = 0.001
SHUTDOWN_TIMEOUT = 5.0


@attrs.frozen
class NodeStatus:
    self_id: str
    role: Role
    term: int
    leader_id: str | None
    ledger_end_index: int
    ledger_end_term: int
    committed_index: int
    # leader: each member's match index (self: its end index); empty elsewhere
    watermarks: dict[str, int]
    peers: dict[str, str]
    # the log was reset by the leader (a member retention left behind) and has not caught up
    # with the leader's commit index yet
    rebuilding: bool = False


@attrs.define(eq=False)
class _Answer:
    """A request's place in the action FIFO: the answer may go once the FIFO passed it."""

    # True once the FIFO ran past this marker (then the answer may leave)
    passed: bool = False
    # created by the one waiter when the answer had to wait; set when passed
    event: trio.Event | None = None


@attrs.define(eq=False)
class _TransferWait:
    transferee: str
    # set by the TransferDone for ``transferee``; ``code`` is its outcome from then on
    done: trio.Event = attrs.field(factory=trio.Event)
    code: DLedgerResponseCode = DLedgerResponseCode.TAKE_LEADERSHIP_FAILED


@attrs.define(eq=False)
class DLedgerNode:
    config: DLedgerConfig
    log: RaftLog
    # called only from this node's tasks, never from inside one of its own calls
    _core: RaftCore
    # where PersistState and checkpoints go
    _storage: NodeStorage
    # the outgoing connections, shared by the replicators
    _client: DLedgerClient
    # the address serve() bound (differs from the config's when it asked for port 0)
    bound_addr: str = ""
    # peer id -> its replicator; self excluded
    _peers: dict[str, PeerReplicator] = attrs.field(factory=dict)
    # actions (and answer markers) not run yet, in core order
    _fifo: deque[Action | _Answer] = attrs.field(factory=deque)
    # True while some frame runs the FIFO (a nested _run only appends)
    _draining: bool = False
    # a run_sync_soon of _push_proposed is queued (see propose)
    _push_soon: bool = False
    # the state being written; the FIFO stands still while it is not None
    _persisting: PersistState | None = None
    # set when _persisting got a state to write; the persister replaces it after waking
    _persist_wanted: trio.Event = attrs.field(factory=trio.Event)
    # the highest index a Committed action announced; never decreases
    _committed: int = -1
    # (index, seq, event) of wait_committed callers, a heap
    _commit_waiters: list[tuple[int, int, trio.Event]] = attrs.field(factory=list)
    # tie-breaker for equal indexes in the heap
    _seq: itertools.count[int] = attrs.field(factory=itertools.count)
    # appended proposals whose outcome is not known yet
    _proposals: PendingProposals = attrs.field(factory=PendingProposals)
    # called in registration order for every RoleChanged, synchronously
    _listeners: list[Callable[[RoleChanged], None]] = attrs.field(factory=list)
    # transfer_leadership callers waiting for their TransferDone
    _transfers: list[_TransferWait] = attrs.field(factory=list)
    # the ticker's sleep, while it sleeps
    _tick_scope: trio.CancelScope | None = None
    # the broker's hook for a LogReset: (begin_index, begin_pos)
    _on_log_reset: Callable[[int, int], None] | None = None
    # the begin index of the last LogReset while the log has not caught up since; else None
    _reset_at: int | None = None

    # --- the public face -----------------------------------------------------------------------

    @property
    def role(self) -> Role:
        return self._core.role

    @property
    def term(self) -> int:
        return self._core.term

    @property
    def leader_id(self) -> str | None:
        return self._core.leader_id

    @property
    def committed_index(self) -> int:
        return self._committed

    def propose(self, bodies: Sequence[bytes]) -> Proposal:
        """Append ``bodies`` as consecutive entries (leader only); log order = call order.

        The entries are pushed to the followers at the end of the channel's chunk of requests
        (its flush batch), else once this scheduler turn is over (``run_sync_soon``), together
        with every other proposal: 32 single sends read at once become one push per follower,
        not 32."""
        code, entries, actions = self._core.propose(bodies, trio.current_time(), push=False)
        proposal = Proposal(code, list(entries))
        self._proposals.add(proposal)
        self._run(actions)
        if entries and not self._push_soon:
            self._push_soon = True
            if not flush_in_batch(self._push_proposed):
                trio.lowlevel.current_trio_token().run_sync_soon(self._push_proposed)
        return proposal

    def _push_proposed(self) -> None:
        self._push_soon = False
        self._run(self._core.tick(trio.current_time()))

    async def wait_committed(self, index: int) -> None:
        if self._committed >= index:
            await trio.lowlevel.checkpoint()
            return
        event = trio.Event()
        heapq.heappush(self._commit_waiters, (index, next(self._seq), event))
        await event.wait()

    def add_role_listener(self, fn: Callable[[RoleChanged], None]) -> None:
        self._listeners.append(fn)

    async def transfer_leadership(self, transferee: str) -> DLedgerResponseCode:
        """Move leadership to ``transferee`` (leader only): SUCCESS once this node follows it,
        else why not (the core's TransferDone; TAKE_LEADERSHIP_FAILED if none comes within the
        transfer wait plus an election and two RPC timeouts)."""
        wait = _TransferWait(transferee)
        self._transfers.append(wait)
        try:
            code, actions = self._core.transfer_leadership(transferee, trio.current_time())
            self._run(actions)
            if code is not DLedgerResponseCode.SUCCESS:
                return code
            cfg = self.config
            limit = cfg.leadership_transfer_wait_timeout_ms + cfg.max_vote_interval_ms
            with trio.move_on_after(limit / 1000 + 2 * cfg.rpc_timeout_ms / 1000):
                await wait.done.wait()
            return wait.code
        finally:
            self._transfers.remove(wait)

    @property
    def rebuilding(self) -> bool:
        """The leader reset this member's log (it had fallen behind the leader's first entry)
        and the log's end has not reached the commit index the leader last sent."""
        return self._reset_at is not None and not self._caught_up()

    def _caught_up(self) -> bool:
        assert self._reset_at is not None
        return self.log.end_index >= max(self._reset_at, self._core.leader_commit_index)

    def peer_watermarks(self) -> dict[str, int]:
        """Leader: every member's match index (its own end for itself); else empty."""
        return self._core.peer_watermarks()

    def status(self) -> NodeStatus:
        core = self._core
        return NodeStatus(
            self_id=self.config.self_id,
            role=core.role,
            term=core.term,
            leader_id=core.leader_id,
            ledger_end_index=self.log.end_index,
            ledger_end_term=self.log.end_term,
            committed_index=self._committed,
            watermarks=core.peer_watermarks() if core.role is Role.LEADER else {},
            peers=self.config.peer_addresses(),
            rebuilding=self.rebuilding,
        )

    # --- running actions in order --------------------------------------------------------------

    def _run(self, actions: Sequence[Action]) -> None:
        if actions:
            self._fifo.extend(actions)
        self._drain()

    def _drain(self) -> None:
        if self._draining or self._persisting is not None:
            return
        self._draining = True
        try:
            fifo = self._fifo
            while fifo:
                item = fifo.popleft()
                if isinstance(item, PersistState):
                    self._persisting = item
                    self._persist_wanted.set()
                    return
                self._execute(item)
        finally:
            self._draining = False
            if self._tick_scope is not None:
                self._tick_scope.deadline = self._core.next_deadline()

    def _execute(self, item: Action | _Answer) -> None:
        if isinstance(item, Send):
            self._send(item)
        elif isinstance(item, _Answer):
            item.passed = True
            if item.event is not None:
                item.event.set()
        elif isinstance(item, Committed):
            self._advance_commit(item.index)
        elif isinstance(item, AppendDone):
            self._proposals.settle(item.first, item.last, item.code)
        elif isinstance(item, RoleChanged):
            self._role_change(item)
        elif isinstance(item, LogReset):
            self._log_reset(item)
        elif isinstance(item, TransferDone):
            for wait in self._transfers:
                if wait.transferee == item.transferee and not wait.done.is_set():
                    wait.code = item.code
                    wait.done.set()

    def _send(self, send: Send) -> None:
        peer = self._peers.get(send.to)
        if peer is None:
            log.warning("%s: the core sent to unknown member %s", self.config.self_id, send.to)
            return
        peer.send(send.request)

    def _on_answer(self, request: Request, response: Response) -> None:
        self._run(self._core.handle_response(request, response, trio.current_time()))

    def _on_failure(self, request: Request) -> None:
        self._run(self._core.handle_failure(request, trio.current_time()))

    def _advance_commit(self, index: int) -> None:
        if index <= self._committed:
            return
        self._committed = index
        if self._reset_at is not None and self._caught_up():
            log.warning(
                "%s: rebuilt from entry %d: caught up with the leader at %d",
                self.config.self_id,
                self._reset_at,
                self.log.end_index,
            )
            self._reset_at = None
        waiters = self._commit_waiters
        while waiters and waiters[0][0] <= index:
            heapq.heappop(waiters)[2].set()

    def _log_reset(self, reset: LogReset) -> None:
        log.warning(
            "%s: the leader reset this member's log (it ended before the leader's first entry): "
            "it begins at entry %d, pos %d; rebuilding from there",
            self.config.self_id,
            reset.begin_index,
            reset.begin_pos,
        )
        self._reset_at = reset.begin_index
        if self._on_log_reset is not None:
            try:
                self._on_log_reset(reset.begin_index, reset.begin_pos)
            except Exception:
                log.exception("log reset hook %r failed", self._on_log_reset)

    def _role_change(self, change: RoleChanged) -> None:
        log.info(
            "%s: %s in term %d (leader %s)",
            self.config.self_id,
            change.role.name,
            change.term,
            change.leader_id,
        )
        for fn in list(self._listeners):
            try:
                fn(change)
            except Exception:
                log.exception("role listener %r failed", fn)

    async def _persister(self) -> None:
        while True:
            await self._persist_wanted.wait()
            self._persist_wanted = trio.Event()
            action = self._persisting
            if action is None:
                continue
            await self._storage.save_hard_state(action.state)
            self._persisting = None
            self._drain()

    # --- the server side -----------------------------------------------------------------------

    def _on_request(self, request: AnyRequest) -> Reply:
        if isinstance(request, MetadataRequest):
            return self._metadata(request)
        if (
            isinstance(request, LeadershipTransferRequest)
            and request.transfer_id == self.config.self_id
            and request.transferee_id != self.config.self_id
            and request.term in (-1, self._core.term)
            and self._core.role is Role.LEADER
        ):
            return self._admin_transfer(request)
        actions, response = self._core.handle_request(request, trio.current_time())
        answer = _Answer()
        self._fifo.extend(actions)
        self._fifo.append(answer)
        self._drain()
        if answer.passed:
            return response
        return self._answer_later(answer, response)

    async def _answer_later(self, answer: _Answer, response: AnyResponse) -> AnyResponse:
        if not answer.passed:
            answer.event = trio.Event()
            await answer.event.wait()
        return response

    async def _admin_transfer(self, request: LeadershipTransferRequest) -> AnyResponse:
        """An admin's "move leadership" (rmq dledger leadership-transfer): answered, like
        DLedger does, once the transfer finished or failed."""
        code = await self.transfer_leadership(request.transferee_id)
        return LeadershipTransferResponse(
            group=self.config.group,
            remote_id=request.local_id,
            local_id=self.config.self_id,
            term=self._core.term,
            leader_id=self._core.leader_id,
            code=code,
        )

    def _metadata(self, request: MetadataRequest) -> MetadataResponse:
        return MetadataResponse(
            group=self.config.group,
            remote_id=request.local_id,
            local_id=self.config.self_id,
            term=self._core.term,
            leader_id=self._core.leader_id,
            code=(
                DLedgerResponseCode.SUCCESS
                if request.group in ("", self.config.group)
                else DLedgerResponseCode.UNKNOWN_GROUP
            ),
            peers=self.config.peer_addresses(),
        )

    # --- tasks ---------------------------------------------------------------------------------

    async def _ticker(self) -> None:
        core = self._core
        while True:
            with trio.CancelScope(deadline=core.next_deadline()) as scope:
                self._tick_scope = scope
                await trio.sleep_forever()
            self._tick_scope = None
            now = trio.current_time()
            self._run(core.tick(now))
            if core.next_deadline() <= now:
                await trio.sleep(MIN_TICK)

    async def _every(self, interval_ms: int, job: Callable[[], Awaitable[None]]) -> None:
        while True:
            await trio.sleep(interval_ms / 1000)
            try:
                await job()
            except OSError as exc:
                # a flush or checkpoint the disk refused (full): the next round tries again;
                # the disk check answers appends with DISK_FULL meanwhile
                log.error("%s failed, retrying: %s", getattr(job, "__name__", job), exc)

    async def _flush(self) -> None:
        await self._storage.flush_log(self.log)

    async def _checkpoint(self) -> None:
        await self._storage.save_checkpoint(self.log.end_index, self._committed)

    async def _check_disk(self) -> None:
        ratio = await self._storage.disk_used_ratio()
        self._core.set_disk_full(ratio >= self.config.disk_full_ratio)


async def run_dledger_node(
    config: DLedgerConfig,
    network: DLedgerNetwork,
    *,
    log: RaftLog | None = None,
    storage: NodeStorage | None = None,
    rng: random.Random | None = None,
    on_log_reset: Callable[[int, int], None] | None = None,
    task_status: trio.TaskStatus[DLedgerNode] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one member until cancelled; reports the :class:`DLedgerNode` once it serves.

    ``log``: the Raft log to use (default: the file log under ``config.store_dir``, opened and
    closed here).  ``storage``: where currterm/checkpoint live and how the log is flushed
    (default: files in ``config.store_dir``).  ``rng``: the core's election jitter.
    ``on_log_reset(begin_index, begin_pos)``: called when the leader reset this member's log
    (module doc); synchronous, must not block.  Without it the member refuses resets (and
    stays behind the leader's first entry, as before): only a caller that can drop what it
    built from the old entries may let the leader reset its log."""
    store = storage if storage is not None else FileStorage(config.store_dir)
    owned = log is None
    raft_log = log if log is not None else await open_log(config)
    node: DLedgerNode | None = None
    try:
        hard_state, _checkpoint_committed = await store.load()
        # Raft's commit index is volatile: it is learned again from a leader.  The checkpoint's
        # could name entries a whole-group power cut took from the other members' logs; a member
        # trusting it would refuse the new leader's truncation of them forever
        # (raft/entry_handler.py never cuts what it holds committed).  What was applied before is
        # the applier's.
        committed = -1
        core = RaftCore(
            # resets only where something can drop what it built from the old entries (a
            # broker without the hook keeps a classic copy a reset would leave with a gap)
            attrs.evolve(config.core_config(), log_reset=on_log_reset is not None),
            raft_log,
            hard_state,
            rng=rng if rng is not None else random.Random(),
            now=trio.current_time(),
            committed_index=committed,
        )
        async with network.open_client(config.self_id) as client:
            node = DLedgerNode(
                config,
                raft_log,
                core,
                store,
                client,
                # the core's: at least a log's first entry when that is not entry 0 (core.py)
                committed=core.committed_index,
                on_log_reset=on_log_reset,
            )
            peers = config.peer_addresses()
            for peer, addr in peers.items():
                if peer != config.self_id:
                    node._peers[peer] = PeerReplicator(
                        peer,
                        addr,
                        client,
                        node._on_answer,
                        node._on_failure,
                        limit=config.max_in_flight_pushes + 64,
                        timeout=config.rpc_timeout_ms / 1000,
                    )
            async with trio.open_nursery() as nursery:
                node.bound_addr = await nursery.start(
                    network.serve, config.self_id, peers[config.self_id], node._on_request
                )
                nursery.start_soon(node._persister)
                for replicator in node._peers.values():
                    nursery.start_soon(replicator.run)
                nursery.start_soon(node._every, config.flush_file_interval_ms, node._flush)
                nursery.start_soon(node._every, config.check_point_interval_ms, node._checkpoint)
                nursery.start_soon(node._every, config.disk_check_interval_ms, node._check_disk)
                nursery.start_soon(node._ticker)
                if isinstance(raft_log, FileLog):
                    await nursery.start(run_page_warmer, raft_log.data.last)
                task_status.started(node)
    finally:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(SHUTDOWN_TIMEOUT):
                if node is not None:
                    node._proposals.close(DLedgerResponseCode.WAIT_QUORUM_ACK_TIMEOUT)
                    await store.flush_log(raft_log)
                    try:
                        await store.save_checkpoint(raft_log.end_index, node._committed)
                    except OSError as exc:
                        # a full disk: the last checkpoint written stays (atomic replace)
                        logging.getLogger(__name__).error("final checkpoint not written: %s", exc)
                if owned:
                    await store.close_log(raft_log)
