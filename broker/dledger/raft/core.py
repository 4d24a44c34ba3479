"""The sans-I/O Raft core of a DLedger member: one object, driven by calls, answering actions.

Theory of operation
-------------------
:class:`RaftCore` owns no socket, no timer and no clock.  The driver
(broker/dledger/driver/node.py, or the simulator) calls it when something happens -- a request or an
answer arrived, a request failed, a client proposes, time passed -- with the current time, and gets
back a list of actions (member_state.py) to execute strictly in order: sends, persistence of term
and vote, commit advances, finished appends, role changes, finished transfers, log resets.  The
only thing the core changes directly is the injected :class:`~broker.dledger.raft.log.RaftLog`.
``next_deadline()`` says when ``tick`` must run next; nothing happens between calls.

The work is split as in DLedger:

* election.py (DLedgerLeaderElector): roles, votes, heartbeats, the transferee's side of a
  leadership transfer;
* entry_pusher.py (DLedgerEntryPusher): the leader's per-follower dispatchers, pending appends
  and quorum commit;
* entry_handler.py (EntryHandler): the follower's side of pushes;
* this module: routing, and the leader's side of a leadership transfer (DLedgerServer).

Leadership transfer (leader side): ``transfer_leadership`` (or a LEADERSHIP_TRANSFER request
naming this node as ``transfer_id``, or the periodic preferred-leader check) refuses when the
transferee is ``maxLeadershipTransferWaitIndex`` or more behind; otherwise appends are refused
with LEADER_TRANSFERRING until the transfer ends.  Once the transferee's watermark reaches the
leader's end, the leader sends it a LEADERSHIP_TRANSFER ("take leadership"), and the transferee
starts an election at term+1 at once.  The transfer ends with a :class:`TransferDone`: SUCCESS
when this node follows the transferee; otherwise the failure code, or TAKE_LEADERSHIP_FAILED
after ``leadershipTransferWaitTimeout`` for the catch-up, and the same again for the election.

Invariants: those of the parts (see their docstrings); here, that every entry point ends with
the pushers pumped and the transfer checked, so ``next_deadline`` is exact after every call.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

from broker.dledger.raft.election import LeaderElector
from broker.dledger.raft.entry_handler import EntryHandler
from broker.dledger.raft.entry_pusher import EntryPusher
from broker.dledger.raft.log import RaftLog
from broker.dledger.raft.member_state import (
    Action,
    AppendDone,
    Committed,
    CoreConfig,
    HardState,
    LogReset,
    MemberState,
    PersistState,
    RoleChanged,
    Send,
    TransferDone,
)
from broker.dledger.raft.messages import (
    DLedgerResponseCode,
    Entry,
    HeartBeatRequest,
    HeartBeatResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    PushEntryRequest,
    PushEntryResponse,
    Request,
    Response,
    Role,
    VoteRequest,
    VoteResponse,
)

__all__ = [
    "Action",
    "AppendDone",
    "Committed",
    "CoreConfig",
    "HardState",
    "LogReset",
    "PersistState",
    "RaftCore",
    "RoleChanged",
    "Send",
    "TransferDone",
]

Code = DLedgerResponseCode


@attrs.define(eq=False)
class _Transfer:
    transferee: str
    # the term this node led when the transfer started
    term: int
    deadline: float
    # the take-leadership request went out
    requested: bool = False


class RaftCore:
    """One DLedger member's protocol state machine (see the module docstring)."""

    def __init__(
        self,
        config: CoreConfig,
        log: RaftLog,
        state: HardState,
        *,
        rng: random.Random,
        now: float,
        committed_index: int = -1,
    ) -> None:
        term, voted_for = state.term, state.voted_for
        if log.end_term > term:
            # the log got an entry of a term whose PersistState did not run before a crash:
            # this node never voted in that term (votes are persisted before they are sent)
            term, voted_for = log.end_term, None
        self._state = MemberState(
            config=config,
            log=log,
            rng=rng,
            term=term,
            voted_for=voted_for,
            # a log's first entry, when it is not entry 0, is committed (log.py): a restarted
            # leader's TRUNCATE at it then carries a commit index that lets a follower reset
            committed_index=max(
                min(committed_index, log.end_index), log.begin_index if log.begin_index > 0 else -1
            ),
        )
        self._elector = LeaderElector(self._state, last_leader_heartbeat=now)
        if config.fast_first_vote and voted_for is None:
            # a member that has not voted in its term (a group starting fresh) asks for votes
            # after a vote pause, not a leak period (election.py)
            self._elector.first_vote_time = now + self._elector.vote_delay()
        if voted_for == config.self_id:
            # it may have led this term, with log entries a power cut took (election.py)
            self._elector.may_have_led = term
        self._pusher = EntryPusher(self._state)
        self._handler = EntryHandler(self._state)
        self._state.listeners.append(self._pusher.on_role_change)
        # the transfer this node started, until its TransferDone
        self._transfer: _Transfer | None = None
        # leader: when to look at the preferred leader next
        self._next_preferred_check = now

    # --- state ------------------------------------------------------------------------------

    @property
    def config(self) -> CoreConfig:
        return self._state.config

    @property
    def log(self) -> RaftLog:
        return self._state.log

    @property
    def role(self) -> Role:
        return self._state.role

    @property
    def term(self) -> int:
        return self._state.term

    @property
    def leader_id(self) -> str | None:
        return self._state.leader_id

    @property
    def voted_for(self) -> str | None:
        return self._state.voted_for

    @property
    def committed_index(self) -> int:
        return self._state.committed_index

    @property
    def leader_commit_index(self) -> int:
        """Follower: the commit index the current leader's last push carried; -1 before any."""
        return self._handler.leader_commit

    def lease_end(self) -> float:
        """Leader: when it steps down unless a majority answers a heartbeat round sent before
        then (election.py, "The leader's lease"); inf in every other role."""
        return self._elector.lease_end()

    def peer_watermarks(self) -> dict[str, int]:
        """Leader: the match index of every member (its own end index for itself); else {}."""
        return self._pusher.watermarks() if self._pusher.leading_term is not None else {}

    def next_deadline(self) -> float:
        at = min(self._elector.next_deadline(), self._pusher.next_deadline())
        if self._transfer is not None:
            at = min(at, self._transfer.deadline)
        if self._checks_preferred():
            at = min(at, self._next_preferred_check)
        return at

    # --- entry points -----------------------------------------------------------------------

    def tick(self, now: float) -> list[Action]:
        self._elector.tick(now)
        return self._finish(now)

    def handle_request(self, request: Request, now: float) -> tuple[list[Action], Response]:
        """Answer a peer's request; run the actions before sending the answer back."""
        self._elector.check_lease(now)
        response = self._answer(request, now)
        return self._finish(now), response

    def handle_response(self, request: Request, response: Response, now: float) -> list[Action]:
        self._elector.check_lease(now)
        if isinstance(request, VoteRequest) and isinstance(response, VoteResponse):
            self._elector.on_vote_response(request, response, now)
        elif isinstance(request, HeartBeatRequest) and isinstance(response, HeartBeatResponse):
            self._elector.on_beat_response(request, response, now)
        elif isinstance(request, PushEntryRequest) and isinstance(response, PushEntryResponse):
            if response.code is Code.EXPIRED_TERM and response.term > self._state.term:
                self._elector.step_up(response.term, now)
            else:
                self._pusher.on_response(request, response, now)
        elif isinstance(request, LeadershipTransferRequest):
            self._transfer_answered(request, response.code)
        return self._finish(now)

    def handle_failure(self, request: Request, now: float) -> list[Action]:
        """``request`` got no answer (lost, timed out, refused)."""
        self._elector.check_lease(now)
        if isinstance(request, VoteRequest):
            self._elector.on_vote_failure(request, now)
        elif isinstance(request, HeartBeatRequest):
            self._elector.on_beat_failure(request, now)
        elif isinstance(request, PushEntryRequest):
            self._pusher.on_failure(request, now)
        else:
            self._transfer_answered(request, Code.TAKE_LEADERSHIP_FAILED)
        return self._finish(now)

    def propose(
        self, bodies: Sequence[bytes], now: float, *, push: bool = True
    ) -> tuple[DLedgerResponseCode, list[Entry], list[Action]]:
        """Leader: append ``bodies`` as consecutive entries; each call's range finishes with
        one AppendDone.  Refusals (no entry stored): NOT_LEADER, LEADER_TRANSFERRING,
        LEADER_PENDING_FULL, DISK_FULL, REQUEST_WITH_EMPTY_BODYS.

        ``push=False``: the new entries are not pushed yet; the caller calls :meth:`tick` soon
        (a driver taking many proposals in one turn pushes them together, one push per follower
        instead of one per proposal)."""
        entries: list[Entry] = []
        self._elector.check_lease(now)
        if self._state.role is Role.LEADER and self._transfer is not None:
            code = Code.LEADER_TRANSFERRING
        else:
            code, entries = self._pusher.propose(bodies, now)
        return code, entries, self._finish(now, pump=push)

    def set_disk_full(self, full: bool) -> None:
        self._pusher.disk_full = full

    def transfer_leadership(
        self, transferee: str, now: float
    ) -> tuple[DLedgerResponseCode, list[Action]]:
        """Leader: start moving leadership to ``transferee``; SUCCESS means started, and a
        TransferDone action reports the end."""
        self._elector.check_lease(now)
        code = self._start_transfer(transferee, now)
        return code, self._finish(now)

    # --- internals --------------------------------------------------------------------------

    def _finish(self, now: float, *, pump: bool = True) -> list[Action]:
        if pump:
            self._pusher.pump(now)
        self._check_transfer(now)
        if self._checks_preferred() and now >= self._next_preferred_check:
            self._check_preferred(now)
            self._pusher.pump(now)
        return self._state.take_actions()

    def _answer(self, request: Request, now: float) -> Response:
        st = self._state
        if request.group != st.config.group:
            return self._refuse(request, Code.UNKNOWN_GROUP)
        if request.remote_id != st.self_id:
            return self._refuse(request, Code.UNKNOWN_MEMBER)
        if isinstance(request, VoteRequest):
            return self._elector.handle_vote(request, now)
        if isinstance(request, HeartBeatRequest):
            return self._elector.handle_heartbeat(request, now)
        if isinstance(request, PushEntryRequest):
            code = self._elector.admit_leader_message(request, now)
            if code is Code.SUCCESS and st.role is Role.FOLLOWER:
                return self._handler.handle_push(request)
            return self._handler.reply(request, Code.NOT_FOLLOWER if code is Code.SUCCESS else code)
        if request.transfer_id == st.self_id:
            if request.term not in (-1, st.term):
                code = Code.INCONSISTENT_TERM
            else:
                code = self._start_transfer(request.transferee_id, now)
        elif request.transferee_id == st.self_id:
            code = self._elector.handle_take_leadership(request, now)
        else:
            code = Code.UNEXPECTED_ARGUMENT
        return self._refuse(request, code)

    def _refuse(self, request: Request, code: DLedgerResponseCode) -> Response:
        st = self._state
        if isinstance(request, PushEntryRequest):
            return self._handler.reply(request, code)
        kind: type[VoteResponse] | type[HeartBeatResponse] | type[LeadershipTransferResponse]
        if isinstance(request, VoteRequest):
            kind = VoteResponse
        elif isinstance(request, HeartBeatRequest):
            kind = HeartBeatResponse
        else:
            kind = LeadershipTransferResponse
        return kind(
            group=request.group,
            remote_id=request.remote_id,
            local_id=request.local_id,
            term=st.term,
            leader_id=st.leader_id,
            code=code,
        )

    # --- leadership transfer, leader side ----------------------------------------------------

    def _start_transfer(self, transferee: str, now: float) -> DLedgerResponseCode:
        st = self._state
        if st.role is not Role.LEADER or self._pusher.leading_term is None:
            return Code.NOT_LEADER
        if transferee not in st.config.peers:
            return Code.UNKNOWN_MEMBER
        if self._transfer is not None:
            return Code.LEADER_TRANSFERRING
        if transferee == st.self_id:
            st.out.append(TransferDone(transferee, Code.SUCCESS))
            return Code.SUCCESS
        behind = st.log.end_index - self._pusher.watermarks()[transferee]
        if behind >= st.config.max_leadership_transfer_wait_index:
            return Code.FALL_BEHIND_TOO_MUCH
        self._transfer = _Transfer(transferee, st.term, now + self._transfer_wait())
        return Code.SUCCESS

    def _transfer_wait(self) -> float:
        return self._state.config.leadership_transfer_wait_timeout_ms / 1000.0

    def _end_transfer(self, code: DLedgerResponseCode) -> None:
        if self._transfer is not None:
            self._state.out.append(TransferDone(self._transfer.transferee, code))
            self._transfer = None

    def _transfer_answered(self, request: Request, code: DLedgerResponseCode) -> None:
        t = self._transfer
        if (
            t is None
            or not isinstance(request, LeadershipTransferRequest)
            or request.transferee_id != t.transferee
            or request.term != t.term
        ):
            return
        if code is not Code.SUCCESS:
            self._end_transfer(code)

    def _check_transfer(self, now: float) -> None:
        t = self._transfer
        if t is None:
            return
        st = self._state
        if st.role is Role.LEADER:
            if st.term != t.term or now >= t.deadline:
                self._end_transfer(Code.TAKE_LEADERSHIP_FAILED)
            elif not t.requested and self._pusher.watermarks()[t.transferee] >= st.log.end_index:
                t.requested = True
                t.deadline = now + self._transfer_wait()
                request = LeadershipTransferRequest(
                    group=st.config.group,
                    remote_id=t.transferee,
                    local_id=st.self_id,
                    leader_id=st.self_id,
                    term=st.term,
                    transfer_id=st.self_id,
                    transferee_id=t.transferee,
                    take_leadership_ledger_index=st.log.end_index,
                )
                st.out.append(Send(t.transferee, request))
        elif st.role is Role.FOLLOWER:
            ok = st.leader_id == t.transferee
            self._end_transfer(Code.SUCCESS if ok else Code.TAKE_LEADERSHIP_FAILED)
        elif now >= t.deadline:
            self._end_transfer(Code.TAKE_LEADERSHIP_FAILED)

    def _checks_preferred(self) -> bool:
        preferred = self._state.config.preferred_leader_id
        return (
            preferred is not None
            and preferred != self._state.self_id
            and self._state.role is Role.LEADER
            and self._transfer is None
        )

    def _check_preferred(self, now: float) -> None:
        """DLedgerServer.checkPreferredLeader: hand leadership to the preferred member when
        it is alive and not too far behind (every half heartbeat interval)."""
        st = self._state
        self._next_preferred_check = now + st.config.heart_beat_time_interval_ms / 2000.0
        preferred = st.config.preferred_leader_id
        if preferred is None or preferred not in st.config.peers:
            return
        if not self._elector.peer_live.get(preferred, False):
            return
        self._start_transfer(preferred, now)
