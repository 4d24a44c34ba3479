"""Elections and heartbeats: DLedger's DLedgerLeaderElector, sans I/O.

Theory of operation
-------------------
Each role has one timer, checked by :meth:`LeaderElector.tick`:

* FOLLOWER: no heartbeat from the leader for ``max(2, maxHeartBeatLeak) * heartBeatTimeInterval``
  -> CANDIDATE at the same term, voting at once.  With ``fast_first_vote`` (the driver's
  default), a member started with no vote in its stored term (a group starting fresh:
  ``first_vote_time``) that has heard of no leader, granted no vote and met no newer term waits
  only a vote pause (``minVoteInterval + rand(max - min)``) instead: DLedger's members start as
  CANDIDATE and ask at once; the pause spreads out members started together, so one usually
  asks first and wins (`rmq up --dledger 3` is ready about one leak period sooner).  Safety does
  not lean on the wait (a vote per term, persisted first).  A member that voted in its term
  (restarted out of a running group, the old leader included) waits the leak period as before:
  tried with every restart fast, a leader killed and restarted within a second asked at term+1
  (``may_have_led``) before its followers had missed it, and once in three runs of
  tests/integration/test_dledger_ride_through.py a send waited past its 3 s timeout.
* CANDIDATE: at ``next_vote_time`` a vote round starts (at term+1 after VOTE_NEXT, else at the
  current term): the candidate votes for itself through the same rules as for anyone, then asks
  every peer.  One exception to the current term: a member restarted with its vote for itself
  in its term (``may_have_led``) goes to term+1.  It may have led that term, and a power cut
  may have taken entries it appended as leader that a follower still holds; leading the same
  term again it would write other entries under those (index, term) pairs, and log matching
  (a follower keeps an entry whose term agrees) would no longer hold.  DLedger's
  DLedgerLeaderElector votes in the stored term after a restart, which is safe only while a
  restart keeps the log's tail (a process crash: the files are mapped).  The round ends early when rounds.py says it can, at the latest after
  ``heartBeatTimeInterval + rand(maxVoteInterval)`` (DLedger's fixed 2000 + rand(1000) ms at
  the default interval); its decision sets the next vote time (rounds.VoteDecision).
* LEADER: every ``heartBeatTimeInterval`` a heartbeat round, ending early as rounds.py says, at
  the latest after one interval.  A larger term seen -> CANDIDATE at that term; success +
  not-ready make a quorum -> resend at once; an inconsistent leader -> CANDIDATE at the same
  term.  And the lease (below) -> CANDIDATE at the same term the moment it runs out.

The leader's lease
------------------
A leader holds a lease of ``maxHeartBeatLeak * heartBeatTimeInterval`` (6 s by default) from
``lease_start``: the time the last heartbeat round that a quorum (itself included) answered
SUCCESS was *sent* (its election, for a new leader).  When the lease runs out it becomes a
CANDIDATE at once: the deadline is part of :meth:`LeaderElector.next_deadline` and every call
checks it (:meth:`LeaderElector.check_lease`), so a leader is never LEADER past its lease end
(the simulator checks this after every step).  DLedger measures from when the quorum *answered*
and checks only when a heartbeat round ends, so its leader steps down between 6 and 8 s after
its last quorum; the new leader on the other side of a partition may be elected before that.

Why the send time: each follower that answered that round received it at or after
``lease_start`` and only becomes a candidate ``max(2, maxHeartBeatLeak) * interval`` after the
last heartbeat it received, i.e. no earlier than the lease end (clocks advancing at the same
rate).  So when a leader is cut off from its followers, it has stepped down before any of them
can start an election.  It is not a read lease in Raft's sense (section 6.4): there is no vote
stickiness, so a member whose log is as good can still win a newer term while this leader's
lease runs (a newer term reaching the old leader makes it a candidate at once).  What the lease
gives is "a leader that lost its quorum stops acting as one within the lease" (broker/dledger/
broker/roles.py then stops serving as master), not "reads on the leader are never stale".

Any vote, heartbeat or push with a larger term moves this node to CANDIDATE at that term (term
persisted, no vote) and is answered TERM_NOT_READY / REJECT_TERM_NOT_READY, as DLedger does;
the sender retries at once and then finds this node at its term.

Invariants
* a vote is granted only in :meth:`record_vote`, which queues its PersistState before the
  answer (or the candidate's own requests) leave: at most one candidate per term;
* a candidate becomes leader only in the term its round ran in, on a quorum of ACCEPTs;
* votes never go to a candidate whose log is behind (rounds.judge_vote checks the ledger first).
"""

from __future__ import annotations

import logging
import math

import attrs

from broker.dledger.raft.member_state import MemberState, Send
from broker.dledger.raft.messages import (
    DLedgerResponseCode,
    HeartBeatRequest,
    HeartBeatResponse,
    LeadershipTransferRequest,
    PushEntryRequest,
    Role,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from broker.dledger.raft.rounds import (
    BeatDecision,
    BeatRound,
    VoteDecision,
    Voter,
    VoteRound,
    judge_vote,
)

__all__ = ["LeaderElector"]

_log = logging.getLogger(__name__)

Code = DLedgerResponseCode


@attrs.define(eq=False)
class LeaderElector:
    state: MemberState
    # follower: when the current leader was last heard (heartbeat or becoming its follower)
    last_leader_heartbeat: float
    # candidate: when the next vote round may start (ignored while a round runs)
    next_vote_time: float = -math.inf
    # candidate: the next round goes to term+1 (DLedger's WAIT_TO_VOTE_NEXT)
    vote_next_term: bool = False
    # candidate: the round in progress, if any (None in every other role)
    vote_round: VoteRound | None = None
    # leader: start of the last heartbeat round; -inf asks for one at once
    last_send_heartbeat: float = -math.inf
    # leader: the start of its lease: when the last heartbeat round a quorum answered SUCCESS
    # was sent, or its election (see "The leader's lease")
    lease_start: float = -math.inf
    # leader: the heartbeat round in progress, if any (None in every other role)
    beat_round: BeatRound | None = None
    # peer -> whether its last heartbeat got an answer (DLedger's peersLiveTable)
    peer_live: dict[str, bool] = attrs.field(factory=dict)
    # the term this node is taking leadership for after a transfer request, -1 otherwise
    term_to_take_leadership: int = -1
    # the term this node voted for itself in before its restart (-1: none): no vote round runs
    # in it again (see the module doc)
    may_have_led: int = -1
    # a member just started: when it becomes a candidate unless it hears of a leader, grants a
    # vote or meets a newer term first (then inf: the usual timers); see the module doc
    first_vote_time: float = math.inf

    # --- timing ----------------------------------------------------------------------------

    def _interval(self) -> float:
        return self.state.config.heart_beat_time_interval_ms / 1000.0

    def _leak(self) -> float:
        return self._interval() * self.state.config.max_heart_beat_leak

    def lease_end(self) -> float:
        """Leader: when it steps down unless a heartbeat round sent before then reaches a
        quorum; inf in every other role."""
        if self.state.role is not Role.LEADER:
            return math.inf
        return self.lease_start + self._leak()

    def _taking_leadership(self) -> bool:
        cfg = self.state.config
        return (
            cfg.preferred_leader_id == cfg.self_id
            and self.term_to_take_leadership == self.state.term
        )

    def vote_delay(self) -> float:
        cfg = self.state.config
        if self._taking_leadership():
            low = cfg.min_take_leadership_vote_interval_ms
            high = cfg.max_take_leadership_vote_interval_ms
        else:
            low, high = cfg.min_vote_interval_ms, cfg.max_vote_interval_ms
        return (low + self.state.rng.randrange(max(1, high - low))) / 1000.0

    def next_deadline(self) -> float:
        role = self.state.role
        if role is Role.FOLLOWER:
            return min(
                self.first_vote_time,
                self.last_leader_heartbeat
                + self._interval() * max(2, self.state.config.max_heart_beat_leak),
            )
        if role is Role.CANDIDATE:
            return self.vote_round.deadline if self.vote_round else self.next_vote_time
        if self.beat_round is not None:
            return min(self.beat_round.deadline, self.lease_end())
        return min(self.last_send_heartbeat + self._interval(), self.lease_end())

    # --- transitions -----------------------------------------------------------------------

    def become_follower(self, leader_id: str, now: float) -> None:
        self.vote_round = self.beat_round = None
        self.vote_next_term = False
        self.last_leader_heartbeat = now
        self.first_vote_time = math.inf
        self.term_to_take_leadership = -1
        self.state.change_role(Role.FOLLOWER, leader_id)

    def become_candidate(self, term: int, vote_at: float) -> None:
        """CANDIDATE at ``term`` (>= the current one); next round at ``vote_at``, same term."""
        self.state.move_to_term(term)
        self.vote_round = self.beat_round = None
        self.vote_next_term = False
        self.first_vote_time = math.inf
        self.next_vote_time = vote_at
        if self.state.term > self.term_to_take_leadership:
            self.term_to_take_leadership = -1
        self.state.change_role(Role.CANDIDATE, None)

    def step_up(self, term: int, now: float) -> None:
        """A larger term was seen: candidate there, voting after a random pause (the sender
        of the larger term gets to retry first)."""
        self.become_candidate(term, now + self.vote_delay())

    def _become_leader(self, now: float) -> None:
        self.vote_round = None
        self.last_send_heartbeat = -math.inf
        self.lease_start = now
        self.term_to_take_leadership = -1
        self.state.change_role(Role.LEADER, self.state.self_id)

    # --- timers ----------------------------------------------------------------------------

    def check_lease(self, now: float) -> None:
        """A leader whose lease ran out becomes a candidate at its term (every entry point of
        the core calls this, so no call sees a leader past its lease end)."""
        st = self.state
        if st.role is not Role.LEADER or now < self.lease_end():
            return
        _log.warning(
            "DLedger %s: leader of term %d lost its quorum: no heartbeat round was answered by "
            "a majority for %.3f s (lease: maxHeartBeatLeak %d x heartBeatTimeIntervalMs %d); "
            "stepping down to candidate",
            st.self_id,
            st.term,
            now - self.lease_start,
            st.config.max_heart_beat_leak,
            st.config.heart_beat_time_interval_ms,
        )
        self.become_candidate(st.term, now)

    def tick(self, now: float) -> None:
        st = self.state
        self.check_lease(now)
        if st.role is Role.FOLLOWER and now >= self.next_deadline():
            self.become_candidate(st.term, now)
        if st.role is Role.CANDIDATE:
            if self.vote_round is not None and now >= self.vote_round.deadline:
                self._end_vote(now)
            if st.role is Role.CANDIDATE and self.vote_round is None and now >= self.next_vote_time:
                self.start_vote(now)
        if st.role is Role.LEADER:
            if self.beat_round is not None and now >= self.beat_round.deadline:
                self._end_beats(now)
            if (
                st.role is Role.LEADER
                and self.beat_round is None
                and now >= self.last_send_heartbeat + self._interval()
            ):
                self._send_beats(now)

    # --- votes -----------------------------------------------------------------------------

    def start_vote(self, now: float) -> None:
        st = self.state
        cfg = st.config
        if self.vote_next_term or st.term == self.may_have_led:
            st.move_to_term(st.term + 1)
            self.vote_next_term = False
        term = st.term
        wait = self._interval() + st.rng.randrange(max(1, cfg.max_vote_interval_ms)) / 1000.0
        vote = self.vote_round = VoteRound(
            term=term, deadline=now + wait, awaiting=set(cfg.others), known_max_term=term
        )

        def request(to: str) -> VoteRequest:
            return VoteRequest(
                group=cfg.group,
                remote_id=to,
                local_id=st.self_id,
                leader_id=st.self_id,
                term=term,
                ledger_end_index=st.log.end_index,
                ledger_end_term=st.log.end_term,
            )

        result, answer_term = self._judge(request(st.self_id), now, self_vote=True)
        for peer in cfg.others:
            st.out.append(Send(peer, request(peer)))
        vote.count(result, answer_term)
        self._maybe_end_vote(now)

    def handle_vote(self, request: VoteRequest, now: float) -> VoteResponse:
        result, term = self._judge(request, now, self_vote=False)
        return VoteResponse(
            group=request.group,
            remote_id=request.remote_id,
            local_id=request.local_id,
            term=term,
            leader_id=self.state.leader_id,
            vote_result=result,
        )

    def _judge(
        self, request: VoteRequest, now: float, *, self_vote: bool
    ) -> tuple[VoteResult, int]:
        """Judge a vote request and apply the verdict; returns it and the term to answer."""
        st = self.state
        me = Voter(
            self_id=st.self_id,
            peers=st.config.peers,
            term=st.term,
            voted_for=st.voted_for,
            leader_id=st.leader_id,
            end_index=st.log.end_index,
            end_term=st.log.end_term,
            taking_leadership=self._taking_leadership(),
        )
        result = judge_vote(request, me, self_vote=self_vote)
        if result is VoteResult.REJECT_TERM_NOT_READY:
            self.step_up(request.term, now)
        elif result is VoteResult.ACCEPT and request.leader_id is not None:
            self.record_vote(request.leader_id)
        elif result is VoteResult.REJECT_TERM_SMALL_THAN_LEDGER:
            return result, me.end_term
        return result, st.term

    def record_vote(self, candidate: str) -> None:
        """The one place a vote is granted (persisted before the answer leaves)."""
        self.state.set_hard_state(self.state.term, candidate)
        if candidate != self.state.self_id:
            # that candidate is about to lead: give it the usual leak period
            self.first_vote_time = math.inf

    def on_vote_response(self, request: VoteRequest, response: VoteResponse, now: float) -> None:
        vote = self.vote_round
        if vote is None or request.term != vote.term or request.remote_id not in vote.awaiting:
            return
        vote.awaiting.discard(request.remote_id)
        vote.count(response.vote_result, response.term)
        self._maybe_end_vote(now)

    def on_vote_failure(self, request: VoteRequest, now: float) -> None:
        vote = self.vote_round
        if vote is None or request.term != vote.term or request.remote_id not in vote.awaiting:
            return
        vote.awaiting.discard(request.remote_id)
        vote.count(VoteResult.UNKNOWN, -1)
        self._maybe_end_vote(now)

    def _maybe_end_vote(self, now: float) -> None:
        vote, st = self.vote_round, self.state
        if vote is not None and vote.can_end(st.config.quorum, len(st.config.peers)):
            self._end_vote(now)

    def _end_vote(self, now: float) -> None:
        vote, self.vote_round = self.vote_round, None
        st = self.state
        if vote is None or st.role is not Role.CANDIDATE or st.term != vote.term:
            return
        decision = vote.decide(st.config.quorum)
        if decision is VoteDecision.LARGER_TERM:
            # DLedger moves to the larger term at its next round; we move now (persisted)
            self.become_candidate(vote.known_max_term, now + self.vote_delay())
        elif decision is VoteDecision.HAS_LEADER:
            self.next_vote_time = now + self.vote_delay() + self._leak()
        elif decision is VoteDecision.TOO_FEW_VALID:
            self.next_vote_time = now + self.vote_delay()
        elif decision is VoteDecision.BIGGER_LEDGER:
            extra = st.config.max_vote_interval_ms / 1000.0
            self.next_vote_time = now + self.vote_delay() + extra
        elif decision is VoteDecision.PASSED:
            self._become_leader(now)
        elif decision is VoteDecision.REVOTE_IMMEDIATELY:
            self.next_vote_time = now
            self.start_vote(now)
        else:
            self.vote_next_term = True
            self.next_vote_time = now + self.vote_delay()

    # --- heartbeats ------------------------------------------------------------------------

    def _send_beats(self, now: float) -> None:
        st = self.state
        cfg = st.config
        self.last_send_heartbeat = now
        self.beat_round = BeatRound(
            term=st.term, deadline=now + self._interval(), started=now, awaiting=set(cfg.others)
        )
        for peer in cfg.others:
            beat = HeartBeatRequest(
                group=cfg.group,
                remote_id=peer,
                local_id=st.self_id,
                leader_id=st.self_id,
                term=st.term,
            )
            st.out.append(Send(peer, beat))
        self._maybe_end_beats(now)

    def handle_heartbeat(self, request: HeartBeatRequest, now: float) -> HeartBeatResponse:
        code = self.admit_leader_message(request, now)
        if code is Code.SUCCESS:
            self.last_leader_heartbeat = now
        return HeartBeatResponse(
            group=request.group,
            remote_id=request.remote_id,
            local_id=request.local_id,
            term=self.state.term,
            leader_id=self.state.leader_id,
            code=code,
        )

    def admit_leader_message(
        self, request: HeartBeatRequest | PushEntryRequest, now: float
    ) -> DLedgerResponseCode:
        """The term/leader gate of heartbeats and pushes (DLedger's
        ``DLedgerLeaderElector.handleHeartBeat``)."""
        st = self.state
        leader = request.leader_id
        if leader is None or leader not in st.config.peers:
            return Code.UNKNOWN_MEMBER
        if leader == st.self_id:
            return Code.UNEXPECTED_MEMBER
        if request.term < st.term:
            return Code.EXPIRED_TERM
        if request.term > st.term:
            self.step_up(request.term, now)
            return Code.TERM_NOT_READY
        if st.leader_id is None:
            self.become_follower(leader, now)
            return Code.SUCCESS
        if st.leader_id != leader:
            return Code.INCONSISTENT_LEADER
        return Code.SUCCESS

    def on_beat_response(
        self, request: HeartBeatRequest, response: HeartBeatResponse, now: float
    ) -> None:
        self.peer_live[request.remote_id] = True
        beat = self.beat_round
        if beat is None or request.term != beat.term or request.remote_id not in beat.awaiting:
            return
        beat.awaiting.discard(request.remote_id)
        beat.count(response.code, response.term)
        self._maybe_end_beats(now)

    def on_beat_failure(self, request: HeartBeatRequest, now: float) -> None:
        self.peer_live[request.remote_id] = False
        beat = self.beat_round
        if beat is None or request.term != beat.term or request.remote_id not in beat.awaiting:
            return
        beat.awaiting.discard(request.remote_id)
        beat.count(Code.NETWORK_ERROR, -1)
        self._maybe_end_beats(now)

    def _maybe_end_beats(self, now: float) -> None:
        beat, st = self.beat_round, self.state
        if beat is not None and beat.can_end(st.config.quorum, len(st.config.peers)):
            self._end_beats(now)

    def _end_beats(self, now: float) -> None:
        beat, self.beat_round = self.beat_round, None
        st = self.state
        if beat is None or st.role is not Role.LEADER or st.term != beat.term:
            return
        decision = beat.decide(st.config.quorum)
        if decision is BeatDecision.LARGER_TERM:
            self.step_up(beat.max_term, now)
        elif decision is BeatDecision.QUORUM:
            self.lease_start = max(self.lease_start, beat.started)
        elif decision is BeatDecision.RESEND:
            self.last_send_heartbeat = -math.inf
        elif decision is BeatDecision.INCONSISTENT:
            self.become_candidate(st.term, now)
        else:
            self.check_lease(now)

    # --- leadership transfer, transferee side ----------------------------------------------

    def handle_take_leadership(
        self, request: LeadershipTransferRequest, now: float
    ) -> DLedgerResponseCode:
        """The leader asks this caught-up follower to take over: vote at once at term+1."""
        st = self.state
        if request.transfer_id != st.leader_id:
            return Code.INCONSISTENT_LEADER
        if request.term != st.term:
            return Code.INCONSISTENT_TERM
        if st.log.end_index < request.take_leadership_ledger_index:
            return Code.TAKE_LEADERSHIP_FAILED
        self.become_candidate(st.term + 1, now)
        self.term_to_take_leadership = st.term
        self.start_vote(now)
        return Code.SUCCESS
