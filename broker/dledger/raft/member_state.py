"""What the elector and the pusher share: the config, the actions, and the member's Raft state.

Theory of operation
-------------------
The core is sans-I/O: every entry point of :class:`broker.dledger.raft.core.RaftCore` mutates
:class:`MemberState` (and the injected log) and appends *actions* to ``MemberState.out``; the
core hands that list to the driver, which executes it strictly in order.  So the order in which
code appends actions is the order in which effects happen:

* a :class:`PersistState` is appended the moment the term or the vote changes, before any
  request or answer that depends on it (the driver answers a request only after all actions);
* a :class:`RoleChanged` is appended when role, term or leader changes, before the new role's
  first sends.

Role changes go through :meth:`MemberState.change_role`, which also calls the listeners the
core registered (the pusher starts or stops leading there), so every component sees a role
change at the moment it happens, inside the same call.

Invariants
* ``term`` never decreases; within one term ``voted_for`` goes at most from None to one id;
* ``committed_index`` never decreases and never exceeds the log's end index; when the log begins
  above 0 it is at least ``begin_index`` (a log's first entry is committed: log.py);
* ``role == LEADER`` iff ``leader_id == self_id``.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import attrs

from broker.dledger.raft.log import RaftLog
from broker.dledger.raft.messages import DLedgerResponseCode, Request, Role

__all__ = [
    "Action",
    "AppendDone",
    "Committed",
    "CoreConfig",
    "HardState",
    "LogReset",
    "MemberState",
    "PersistState",
    "RoleChanged",
    "Send",
    "TransferDone",
]


@attrs.frozen
class CoreConfig:
    """DLedgerConfig's protocol knobs (``DLedgerConfig.java`` in openmessaging/dledger 0.3.1.2);
    times in milliseconds."""

    group: str
    self_id: str
    # every member id, self included, sorted
    peers: tuple[str, ...]
    heart_beat_time_interval_ms: int = 2000
    max_heart_beat_leak: int = 3
    min_vote_interval_ms: int = 300
    max_vote_interval_ms: int = 1000
    max_pending_requests_num: int = 10000
    max_wait_ack_time_ms: int = 2500
    max_push_time_out_ms: int = 1000
    max_in_flight_pushes: int = 1000
    enable_batch_push: bool = False
    max_batch_push_entries: int = 64
    # not DLedger's key: a batch push also stops before its entries pass this many bytes (one
    # entry always goes).  Base64 makes a push ~4/3 of it, well inside the 16 MiB frame a
    # remoting peer reads (DLedger's Netty decoder, common/remoting/codec.py); DLedger cuts its
    # batches at maxBatchPushSize (4 KiB), which would cost a push every 3-4 KiB here
    max_batch_push_bytes: int = 4 << 20
    preferred_leader_id: str | None = None
    min_take_leadership_vote_interval_ms: int = 30
    max_take_leadership_vote_interval_ms: int = 100
    leadership_transfer_wait_timeout_ms: int = 1000
    max_leadership_transfer_wait_index: int = 1000
    # not DLedger's key: a member started with no vote in its term asks for votes after a vote
    # pause instead of a leak period (election.py, first_vote_time; DLedger's members start as
    # candidates and ask at once).  Off here, so the simulator's seeds keep their schedules; the driver turns it on
    fast_first_vote: bool = False
    # not DLedger's: an idle follower hears a new commit index this long after the last push
    # (entry_pusher.py; DLedger waits for its 1 s COMMIT push)
    commit_push_delay_ms: int = 20
    # the body of the entry a new leader appends (Raft section 8's no-op, which lets older
    # entries commit under the section 5.4.2 rule): empty unless the driver gives one; the
    # broker's is a record a Java member reads and dispatches nothing for (driver/entry_coder.py)
    noop_body: bytes = b""
    # not DLedger's: a follower left behind the leader's first entry lets the leader reset its
    # log there (entry_handler.py, "Reset"); off for a member whose state machine cannot drop
    # what it built from the old entries (the driver turns it off without an on_log_reset
    # hook: a broker keeping a classic CommitLog copy would be left with a gap)
    log_reset: bool = True

    @property
    def quorum(self) -> int:
        return len(self.peers) // 2 + 1

    @property
    def others(self) -> tuple[str, ...]:
        return tuple(p for p in self.peers if p != self.self_id)


@attrs.frozen
class HardState:
    """The term and vote a member must not forget: what DLedger's ``currterm`` file holds
    (``currTerm``, ``voteLeader``; the driver's state_files.py writes it)."""

    term: int = 0
    voted_for: str | None = None


# --- actions, executed by the driver strictly in list order ---------------------------------


@attrs.frozen
class Send:
    """Send ``request`` to member ``to``; its answer comes back through ``handle_response``
    (or ``handle_failure`` when it is lost, times out or is refused)."""

    to: str
    request: Request


@attrs.frozen
class PersistState:
    """Make ``state`` durable (fsync, then atomic replace) before running any later action."""

    state: HardState


@attrs.frozen
class Committed:
    """The committed index rose to ``index``: entries ``<= index`` may be applied."""

    index: int


@attrs.frozen
class AppendDone:
    """The leader's pending appends ``[first, last]`` finished: SUCCESS (committed),
    WAIT_QUORUM_ACK_TIMEOUT or TERM_CHANGED (outcome unknown: they may still commit later)."""

    first: int
    last: int
    code: DLedgerResponseCode


@attrs.frozen
class RoleChanged:
    role: Role
    term: int
    leader_id: str | None


@attrs.frozen
class TransferDone:
    """A leadership transfer started by ``transfer_leadership`` (or the preferred-leader check)
    ended: SUCCESS once this node follows ``transferee``, else the reason it did not."""

    transferee: str
    code: DLedgerResponseCode


@attrs.frozen
class LogReset:
    """The follower's log was reset by the leader (entry_handler.py, "Reset"): every entry it
    held is gone and the log now begins at ``begin_index``, whose header is at ``begin_pos``.
    It is durable when the core returns.  The driver tells the broker, whose state built from
    the old entries (consume queues, index) must go: nothing below ``begin_index`` is served
    by this member any more.  Comes before the Committed action that the same push causes."""

    begin_index: int
    begin_pos: int


Action = Send | PersistState | Committed | AppendDone | RoleChanged | TransferDone | LogReset

RoleListener = Callable[[], None]


def _no_actions() -> list[Action]:
    return []


def _no_listeners() -> list[RoleListener]:
    return []


@attrs.define(eq=False)
class MemberState:
    """DLedger's MemberState plus the action buffer of the call in progress."""

    config: CoreConfig
    log: RaftLog
    rng: random.Random
    term: int
    voted_for: str | None
    # never decreases, never above log.end_index
    committed_index: int
    role: Role = Role.FOLLOWER
    # == config.self_id exactly when role is LEADER
    leader_id: str | None = None
    # actions of the call in progress, in execution order
    out: list[Action] = attrs.field(factory=_no_actions)
    # called after every role/term/leader change (the pusher starts/stops leading)
    listeners: list[RoleListener] = attrs.field(factory=_no_listeners)
    # (role, term, leader) of the last RoleChanged emitted, to emit each change once
    _announced: tuple[Role, int, str | None] = (Role.FOLLOWER, -1, None)

    def __attrs_post_init__(self) -> None:
        self._announced = (self.role, self.term, self.leader_id)

    @property
    def self_id(self) -> str:
        return self.config.self_id

    def is_quorum(self, count: int) -> bool:
        return count >= self.config.quorum

    def take_actions(self) -> list[Action]:
        out, self.out = self.out, []
        return out

    def set_hard_state(self, term: int, voted_for: str | None) -> None:
        """Change term and/or vote and queue their persistence (one PersistState replaces an
        immediately preceding one: nothing ran in between that could depend on it)."""
        if term < self.term:
            raise AssertionError(f"term may not go back from {self.term} to {term}")
        if term == self.term and voted_for == self.voted_for:
            return
        if term == self.term and self.voted_for is not None:
            raise AssertionError(f"{self.self_id} already voted {self.voted_for} in {term}")
        self.term, self.voted_for = term, voted_for
        action = PersistState(HardState(term=term, voted_for=voted_for))
        if self.out and isinstance(self.out[-1], PersistState):
            self.out[-1] = action
        else:
            self.out.append(action)

    def move_to_term(self, term: int) -> None:
        """Adopt a larger term (no vote in it yet)."""
        if term > self.term:
            self.set_hard_state(term, None)

    def change_role(self, role: Role, leader_id: str | None) -> None:
        self.role, self.leader_id = role, leader_id
        now = (role, self.term, leader_id)
        if now != self._announced:
            self._announced = now
            self.out.append(RoleChanged(role=role, term=self.term, leader_id=leader_id))
        for listener in self.listeners:
            listener()

    def commit(self, index: int) -> None:
        """Raise the committed index (never lowers it)."""
        if index > self.committed_index:
            self.committed_index = index
            self.out.append(Committed(index))
