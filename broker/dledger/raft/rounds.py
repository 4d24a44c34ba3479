"""The decisions of an election, as pure functions and counters (``DLedgerLeaderElector.java`` in
openmessaging/dledger 0.3.1.2).

Theory of operation
-------------------
:func:`judge_vote` is DLedger's ``handleVote`` order as a pure function of the request and
this member's state; the elector applies its effect (REJECT_TERM_NOT_READY: move to the
request's term; ACCEPT: record and persist the vote).  :class:`VoteRound` and
:class:`BeatRound` count the answers of one vote or heartbeat round and say when the round can
end early and what it decided; the elector acts on the decision.  Nothing here changes state
outside its own counters, so every rule can be tested case by case.

Invariants
* :func:`judge_vote` answers ACCEPT only when this member has not voted for anyone else in the
  request's term, the request's term is this member's term, and the candidate's log is at least
  as up to date as this member's (end term, then end index);
* a round's counters only grow; ``answered`` counts each member at most once (the elector
  drops answers from members it is not awaiting).
"""

from __future__ import annotations

import enum

import attrs

from broker.dledger.raft.messages import DLedgerResponseCode, VoteRequest, VoteResult

__all__ = ["BeatDecision", "BeatRound", "VoteDecision", "VoteRound", "Voter", "judge_vote"]


@attrs.frozen(kw_only=True)
class Voter:
    """What :func:`judge_vote` needs to know about the member answering."""

    self_id: str
    peers: tuple[str, ...]
    term: int
    voted_for: str | None
    leader_id: str | None
    end_index: int
    end_term: int
    # DLedger's isTakingLeadership(): the preferred leader taking over after a transfer
    taking_leadership: bool = False


def judge_vote(request: VoteRequest, me: Voter, *, self_vote: bool) -> VoteResult:
    """DLedger's vote handling order (``DLedgerLeaderElector.handleVote``)."""
    candidate = request.leader_id
    if candidate is None or candidate not in me.peers:
        return VoteResult.REJECT_UNKNOWN_LEADER
    if not self_vote and candidate == me.self_id:
        return VoteResult.REJECT_UNEXPECTED_LEADER
    if request.ledger_end_term < me.end_term:
        return VoteResult.REJECT_EXPIRED_LEDGER_TERM
    if request.ledger_end_term == me.end_term and request.ledger_end_index < me.end_index:
        return VoteResult.REJECT_SMALL_LEDGER_END_INDEX
    if request.term < me.term:
        return VoteResult.REJECT_EXPIRED_VOTE_TERM
    if request.term > me.term:
        return VoteResult.REJECT_TERM_NOT_READY
    if me.voted_for is not None and me.voted_for != candidate:
        if me.leader_id is not None:
            return VoteResult.REJECT_ALREADY_HAS_LEADER
        return VoteResult.REJECT_ALREADY_VOTED
    if request.term < me.end_term:
        return VoteResult.REJECT_TERM_SMALL_THAN_LEDGER
    if (
        not self_vote
        and me.taking_leadership
        and request.ledger_end_term == me.end_term
        and me.end_index >= request.ledger_end_index
    ):
        return VoteResult.REJECT_TAKING_LEADERSHIP
    return VoteResult.ACCEPT


class VoteDecision(enum.Enum):
    """How a vote round ended, in the order DLedger checks (maintainAsCandidate)."""

    LARGER_TERM = "LARGER_TERM"  # someone is at a larger term: move there, vote later
    HAS_LEADER = "HAS_LEADER"  # a member follows a leader: wait an extra leak period
    TOO_FEW_VALID = "TOO_FEW_VALID"  # fewer than a quorum answered: wait, same term
    BIGGER_LEDGER = "BIGGER_LEDGER"  # members with better logs: wait longer, same term
    PASSED = "PASSED"  # a quorum accepted: leader
    REVOTE_IMMEDIATELY = "REVOTE_IMMEDIATELY"  # accepted + not ready make a quorum
    VOTE_NEXT = "VOTE_NEXT"  # otherwise: next term after a pause


@attrs.define(eq=False)
class VoteRound:
    term: int
    deadline: float
    # members asked and not answered yet
    awaiting: set[str]
    # the largest term an answer reported (starts at ``term``)
    known_max_term: int
    answered: int = 0
    valid: int = 0
    accepted: int = 0
    not_ready: int = 0
    bigger_ledger: int = 0
    already_has_leader: bool = False

    def count(self, result: VoteResult, term: int) -> None:
        self.answered += 1
        if result is not VoteResult.UNKNOWN:
            self.valid += 1
        if result is VoteResult.ACCEPT:
            self.accepted += 1
        elif result is VoteResult.REJECT_ALREADY_HAS_LEADER:
            self.already_has_leader = True
        elif result in (
            VoteResult.REJECT_TERM_SMALL_THAN_LEDGER,
            VoteResult.REJECT_EXPIRED_VOTE_TERM,
        ):
            self.known_max_term = max(self.known_max_term, term)
        elif result in (
            VoteResult.REJECT_EXPIRED_LEDGER_TERM,
            VoteResult.REJECT_SMALL_LEDGER_END_INDEX,
        ):
            self.bigger_ledger += 1
        elif result is VoteResult.REJECT_TERM_NOT_READY:
            self.not_ready += 1

    def can_end(self, quorum: int, members: int) -> bool:
        return (
            self.already_has_leader
            or self.accepted >= quorum
            or self.accepted + self.not_ready >= quorum
            or self.answered >= members
        )

    def decide(self, quorum: int) -> VoteDecision:
        if self.known_max_term > self.term:
            return VoteDecision.LARGER_TERM
        if self.already_has_leader:
            return VoteDecision.HAS_LEADER
        if self.valid < quorum:
            return VoteDecision.TOO_FEW_VALID
        if self.valid - self.bigger_ledger < quorum:
            return VoteDecision.BIGGER_LEDGER
        if self.accepted >= quorum:
            return VoteDecision.PASSED
        if self.accepted + self.not_ready >= quorum:
            return VoteDecision.REVOTE_IMMEDIATELY
        return VoteDecision.VOTE_NEXT


class BeatDecision(enum.Enum):
    """How a heartbeat round ended (DLedger's sendHeartbeats)."""

    LARGER_TERM = "LARGER_TERM"  # a follower is at a larger term: candidate there
    QUORUM = "QUORUM"  # a quorum (self included) answered SUCCESS
    RESEND = "RESEND"  # SUCCESS + TERM_NOT_READY make a quorum: send again at once
    INCONSISTENT = "INCONSISTENT"  # a member follows another leader in this term
    NO_QUORUM = "NO_QUORUM"  # none of the above: step down once the leak period passed


@attrs.define(eq=False)
class BeatRound:
    term: int
    deadline: float
    # when its heartbeats left: a quorum of SUCCESS proves every answering follower heard this
    # leader at or after this time (the start of the leader's lease, election.py)
    started: float
    # members asked and not answered yet
    awaiting: set[str]
    answered: int = 1
    succ: int = 1
    not_ready: int = 0
    max_term: int = -1
    inconsistent: bool = False

    def count(self, code: DLedgerResponseCode, term: int) -> None:
        self.answered += 1
        if code is DLedgerResponseCode.SUCCESS:
            self.succ += 1
        elif code is DLedgerResponseCode.EXPIRED_TERM:
            self.max_term = max(self.max_term, term)
        elif code is DLedgerResponseCode.INCONSISTENT_LEADER:
            self.inconsistent = True
        elif code is DLedgerResponseCode.TERM_NOT_READY:
            self.not_ready += 1

    def can_end(self, quorum: int, members: int) -> bool:
        return (
            self.succ >= quorum or self.succ + self.not_ready >= quorum or self.answered >= members
        )

    def decide(self, quorum: int) -> BeatDecision:
        if self.max_term > self.term:
            return BeatDecision.LARGER_TERM
        if self.succ >= quorum:
            return BeatDecision.QUORUM
        if self.succ + self.not_ready >= quorum:
            return BeatDecision.RESEND
        if self.inconsistent:
            return BeatDecision.INCONSISTENT
        return BeatDecision.NO_QUORUM
