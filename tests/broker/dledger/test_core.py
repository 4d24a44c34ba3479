"""RaftCore, rule by rule: the vote handling order, heartbeat codes, elections and step-down,
term/vote persistence before answers, and leadership transfer (replication: test_core_replication.py)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.dledger.raft.core import PersistState, RaftCore, Send
from broker.dledger.raft.member_state import HardState
from broker.dledger.raft.messages import (
    DLedgerResponseCode,
    HeartBeatRequest,
    HeartBeatResponse,
    LeadershipTransferRequest,
    Role,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from broker.dledger.raft.rounds import VoteDecision, Voter, VoteRound, judge_vote
from tests.broker.dledger.core_harness import Cluster, TransferDone, core, log_of

Code = DLedgerResponseCode
R = VoteResult


def vote(
    term: int, end_index: int, end_term: int, candidate: str = "n0", to: str = "n1"
) -> VoteRequest:
    return VoteRequest(
        group="g",
        remote_id=to,
        local_id=candidate,
        leader_id=candidate,
        term=term,
        ledger_end_index=end_index,
        ledger_end_term=end_term,
    )


def beat(term: int, leader: str = "n0", to: str = "n1") -> HeartBeatRequest:
    return HeartBeatRequest(group="g", remote_id=to, local_id=leader, leader_id=leader, term=term)


# --- the vote handling order (DLedgerLeaderElector.handleVote), case by case ----------------

# the voter n1: term 5, log ends at index 2 in term 4
VOTER = {"state": HardState(term=5), "log_terms": (1, 4, 4)}


@pytest.mark.parametrize(
    ("request_", "voted_for", "leader", "expected"),
    [
        (vote(6, 2, 4, candidate="n9"), None, None, R.REJECT_UNKNOWN_LEADER),
        (vote(6, 2, 4, candidate="n1"), None, None, R.REJECT_UNEXPECTED_LEADER),
        # ledger checks come first: a larger term does not help a shorter/older log
        (vote(9, 9, 3), None, None, R.REJECT_EXPIRED_LEDGER_TERM),
        (vote(9, 1, 4), None, None, R.REJECT_SMALL_LEDGER_END_INDEX),
        (vote(4, 2, 4), None, None, R.REJECT_EXPIRED_VOTE_TERM),
        (vote(5, 2, 4), "n2", "n2", R.REJECT_ALREADY_HAS_LEADER),
        (vote(5, 2, 4), "n2", None, R.REJECT_ALREADY_VOTED),
        (vote(6, 2, 4), None, None, R.REJECT_TERM_NOT_READY),
        (vote(5, 2, 4), None, None, R.ACCEPT),
        (vote(5, 3, 4), "n0", None, R.ACCEPT),  # the same candidate again
        (vote(5, 0, 5), None, None, R.ACCEPT),  # a later end term wins over a longer log
    ],
)
def test_vote_order(
    request_: VoteRequest, voted_for: str | None, leader: str | None, expected: VoteResult
) -> None:
    c = core("n1", log=log_of(1, 4, 4), state=HardState(term=5, voted_for=voted_for))
    if leader is not None:
        c.handle_request(beat(5, leader=leader), 0.0)
    actions, response = c.handle_request(request_, 0.0)
    assert isinstance(response, VoteResponse)
    assert response.vote_result is expected
    persisted = [a.state for a in actions if isinstance(a, PersistState)]
    if expected is R.ACCEPT and voted_for is None:
        assert persisted == [HardState(term=5, voted_for="n0")]
        assert c.voted_for == "n0"
    elif expected is R.REJECT_TERM_NOT_READY:
        # moved to the candidate's term, without voting in it: the candidate asks again
        assert persisted == [HardState(term=6, voted_for=None)]
        assert (c.role, c.term, response.term) == (Role.CANDIDATE, 6, 6)
    else:
        assert persisted == []


def test_term_smaller_than_ledger_and_taking_leadership() -> None:
    me = Voter(
        self_id="n1", peers=("n0", "n1", "n2"), term=3, voted_for=None, leader_id=None,
        end_index=4, end_term=4,
    )  # fmt: skip
    assert judge_vote(vote(3, 4, 4), me, self_vote=False) is R.REJECT_TERM_SMALL_THAN_LEDGER
    taking = Voter(
        self_id="n1", peers=("n0", "n1", "n2"), term=5, voted_for=None, leader_id=None,
        end_index=4, end_term=4, taking_leadership=True,
    )  # fmt: skip
    assert judge_vote(vote(5, 4, 4), taking, self_vote=False) is R.REJECT_TAKING_LEADERSHIP
    assert judge_vote(vote(5, 5, 4), taking, self_vote=False) is R.ACCEPT  # its log is longer
    assert judge_vote(vote(5, 4, 4, candidate="n1"), taking, self_vote=True) is R.ACCEPT


def test_never_two_votes_in_one_term() -> None:
    c = core("n1")
    _, first = c.handle_request(vote(1, -1, -1, candidate="n0"), 0.0)
    assert isinstance(first, VoteResponse) and first.vote_result is R.REJECT_TERM_NOT_READY
    _, first = c.handle_request(vote(1, -1, -1, candidate="n0"), 0.0)
    _, second = c.handle_request(vote(1, -1, -1, candidate="n2", to="n1"), 0.0)
    assert isinstance(first, VoteResponse) and isinstance(second, VoteResponse)
    assert (first.vote_result, second.vote_result) == (R.ACCEPT, R.REJECT_ALREADY_VOTED)


def test_vote_round_decisions_in_dledger_order() -> None:
    def decided(**counts: int) -> VoteDecision:
        r = VoteRound(term=3, deadline=0.0, awaiting=set(), known_max_term=counts.pop("max", 3))
        for name, value in counts.items():
            setattr(r, name, value)
        return r.decide(quorum=2)

    assert decided(max=4, accepted=3, valid=3) is VoteDecision.LARGER_TERM
    assert decided(accepted=1, valid=2, already_has_leader=True) is VoteDecision.HAS_LEADER
    assert decided(accepted=1, valid=1) is VoteDecision.TOO_FEW_VALID
    assert decided(accepted=1, valid=3, bigger_ledger=2) is VoteDecision.BIGGER_LEDGER
    assert decided(accepted=2, valid=3) is VoteDecision.PASSED
    assert decided(accepted=1, not_ready=1, valid=2) is VoteDecision.REVOTE_IMMEDIATELY
    assert decided(accepted=1, valid=3) is VoteDecision.VOTE_NEXT


# --- heartbeats ------------------------------------------------------------------------------


def test_heartbeat_codes() -> None:
    c = core("n1", state=HardState(term=3))
    _, r = c.handle_request(beat(2), 0.0)
    assert (r.code, r.term) == (Code.EXPIRED_TERM, 3)
    actions, r = c.handle_request(beat(3), 0.0)  # no leader known: follow it
    assert r.code is Code.SUCCESS and (c.role, c.leader_id) == (Role.FOLLOWER, "n0")
    _, r = c.handle_request(beat(3), 0.0)
    assert r.code is Code.SUCCESS
    _, r = c.handle_request(beat(3, leader="n2"), 0.0)
    assert r.code is Code.INCONSISTENT_LEADER
    actions, r = c.handle_request(beat(4, leader="n2"), 0.0)
    assert r.code is Code.TERM_NOT_READY
    assert (c.role, c.term, c.leader_id) == (Role.CANDIDATE, 4, None)
    assert actions[0] == PersistState(HardState(term=4))
    _, r = c.handle_request(beat(4, leader="n2"), 0.0)  # the leader's immediate resend
    assert r.code is Code.SUCCESS and c.leader_id == "n2"
    _, r = c.handle_request(beat(4, leader="n9"), 0.0)
    assert r.code is Code.UNKNOWN_MEMBER


def role_of(c: RaftCore) -> Role:
    # read through a call: an earlier `assert c.role is ...` narrows c.role past the ticks
    return c.role


def test_follower_waits_the_leak_period_then_votes_with_the_vote_persisted_first() -> None:
    c = core("n1", state=HardState(term=3))
    c.handle_request(beat(3), 0.0)
    assert c.next_deadline() == pytest.approx(0.6)  # 3 x 200 ms
    assert c.tick(0.59) == []
    assert c.role is Role.FOLLOWER
    c.handle_request(beat(3), 0.5)  # a heartbeat restarts the wait
    assert c.tick(1.09) == []
    actions = c.tick(1.1)
    # a candidate at the same term first (its vote there may still count), vote persisted
    # before the requests leave
    assert role_of(c) is Role.CANDIDATE
    kinds = [type(a).__name__ for a in actions]
    assert kinds.index("PersistState") < kinds.index("Send")
    persist = next(a for a in actions if isinstance(a, PersistState))
    assert persist.state == HardState(term=3, voted_for="n1")
    assert {a.to for a in actions if isinstance(a, Send)} == {"n0", "n2"}


def test_a_member_restarted_with_its_vote_for_itself_campaigns_at_the_next_term() -> None:
    """It may have led its stored term: a vote round there could make it leader of that term a
    second time (DLedger would), so its first round goes to term+1.  A member whose stored
    vote went to another campaigns in its term first, as DLedger does."""
    c = core("n1", log=log_of(1, 1, 1), state=HardState(term=1, voted_for="n1"))
    actions = c.tick(c.next_deadline())
    assert c.role is Role.CANDIDATE and c.term == 2
    assert [a.state for a in actions if isinstance(a, PersistState)] == [
        HardState(term=2, voted_for="n1")
    ]
    assert {a.request.term for a in actions if isinstance(a, Send)} == {2}
    other = core("n1", log=log_of(1, 1, 1), state=HardState(term=1, voted_for="n0"))
    other.tick(other.next_deadline())
    assert other.role is Role.CANDIDATE and other.term == 1


def test_a_leader_whose_log_lost_its_tail_in_a_power_cut_never_leads_its_term_again() -> None:
    """A whole-group power cut: n1 led term 1, n2 kept two entries n1 had appended (3 and 4),
    n0 and n1 lost them.  n1 comes back first with n0 and leads; n2's log then takes the
    leader's entries, and the replacement of its entry 3 must show in the term there: n2's
    applier, which may have applied the old entry 3 before the cut, tells a replaced entry by
    its term (apply_resume.py).  Leading term 1 again, n1 would write its no-op as (3, term 1)."""
    kept = log_of(1, 1, 1)
    kept.append(1, b"old-3")
    kept.append(1, b"old-4")
    cluster = Cluster(
        {
            "n0": core("n0", log=log_of(1, 1, 1), state=HardState(term=1, voted_for="n1")),
            "n1": core("n1", log=log_of(1, 1, 1), state=HardState(term=1, voted_for="n1")),
            "n2": core("n2", log=kept, state=HardState(term=1, voted_for="n1")),
        }
    )
    cluster.cut = {frozenset(("n2", "n0")), frozenset(("n2", "n1"))}
    leader = cluster.elect()
    assert leader == "n1" and cluster.cores[leader].term > 1
    cluster.cut = set()
    cluster.advance(2.0)
    lead = cluster.cores[cluster.leader() or ""].log
    for name, c in cluster.cores.items():
        got = [(e.term, e.body) for e in map(c.log.get, range(c.log.end_index + 1)) if e]
        want = [(e.term, e.body) for e in map(lead.get, range(lead.end_index + 1)) if e]
        assert got == want, f"{name} holds another log than the leader"
    assert cluster.cores["n2"].log.term_at(3) != 1


def test_election_then_no_op_then_commit() -> None:
    cluster = Cluster.of(3)
    leader = cluster.elect()
    lc = cluster.cores[leader]
    noop = lc.log.get(0)
    assert lc.log.end_index == 0 and noop is not None and noop.body == b""  # the no-op
    cluster.advance(0.2)
    assert all(c.committed_index == 0 for c in cluster.cores.values())
    terms = {c.term for c in cluster.cores.values()}
    assert terms == {lc.term}
    # whoever answered ACCEPT persisted that vote
    for state in cluster.persisted.values():
        assert state.term == lc.term


def test_leader_steps_down_without_a_heartbeat_quorum() -> None:
    cluster = Cluster.of(3)
    leader = cluster.elect()
    cluster.advance(0.3)
    cut_at = cluster.now
    cluster.cut = {frozenset((leader, o)) for o in cluster.cores if o != leader}
    while cluster.cores[leader].role is Role.LEADER and cluster.now < cut_at + 2:
        cluster.advance(0.005)
    # it keeps leading until its last successful quorum is 3 x 200 ms old, checked when a
    # heartbeat round ends (rounds start every 200 ms)
    assert 0.6 - 0.2 <= cluster.now - cut_at <= 0.6 + 0.2 + 0.01
    assert cluster.cores[leader].role is Role.CANDIDATE


def test_heartbeat_answer_with_a_larger_term_makes_the_leader_a_candidate_there() -> None:
    cluster = Cluster.of(3)
    leader = cluster.elect()
    lc = cluster.cores[leader]
    request = beat(lc.term, leader=leader, to=next(m for m in cluster.cores if m != leader))
    answer = HeartBeatResponse(
        group="g", remote_id=request.remote_id, local_id=leader, term=lc.term + 5,
        code=Code.EXPIRED_TERM,
    )  # fmt: skip
    round_start = lc.tick(cluster.now + 0.2)  # a new heartbeat round
    assert any(isinstance(a, Send) for a in round_start)
    lc.handle_response(request, answer, cluster.now + 0.2)
    assert lc.role is Role.LEADER  # decided when the round ends (all answered, or after 200 ms)
    actions = lc.tick(cluster.now + 0.4)
    assert (lc.role, lc.term) == (Role.CANDIDATE, answer.term)
    assert PersistState(HardState(term=answer.term)) in actions


# --- leadership transfer ---------------------------------------------------------------------


def test_transfer_to_a_caught_up_follower() -> None:
    cluster = Cluster.of(3)
    leader = cluster.elect()
    target = next(m for m in cluster.cores if m != leader)
    cluster.advance(0.1)
    old_term = cluster.cores[leader].term
    code, actions = cluster.cores[leader].transfer_leadership(target, cluster.now)
    assert code is Code.SUCCESS
    cluster.absorb(leader, actions)
    refused, _, _ = cluster.cores[leader].propose([b"x"], cluster.now)
    assert refused is Code.LEADER_TRANSFERRING
    cluster.deliver()
    cluster.advance(0.1)
    assert cluster.leader() == target
    assert cluster.cores[target].term == old_term + 1
    done = [a for a in cluster.actions[leader] if isinstance(a, TransferDone)]
    assert done == [TransferDone(target, Code.SUCCESS)]
    take = [r for s, t, r in cluster.sent if isinstance(r, LeadershipTransferRequest)]
    assert len(take) == 1 and take[0].transferee_id == target


def test_transfer_refusals_and_timeout() -> None:
    cluster = Cluster.of(3, max_leadership_transfer_wait_index=3)
    leader = cluster.elect()
    lc = cluster.cores[leader]
    target = next(m for m in cluster.cores if m != leader)
    assert cluster.cores[target].transfer_leadership(leader, cluster.now)[0] is Code.NOT_LEADER
    assert lc.transfer_leadership("n9", cluster.now)[0] is Code.UNKNOWN_MEMBER
    cluster.cut = {frozenset((leader, target))}
    for i in range(4):
        cluster.propose(leader, b"%d" % i)
    assert lc.transfer_leadership(target, cluster.now)[0] is Code.FALL_BEHIND_TOO_MUCH
    cluster.cut.clear()
    cluster.advance(0.3)
    cluster.cut = {frozenset((leader, target))}
    cluster.propose(leader, b"more")
    code, actions = lc.transfer_leadership(target, cluster.now)
    cluster.absorb(leader, actions)
    assert code is Code.SUCCESS
    assert lc.transfer_leadership(target, cluster.now)[0] is Code.LEADER_TRANSFERRING
    assert lc.propose([b"y"], cluster.now)[0] is Code.LEADER_TRANSFERRING
    cluster.advance(0.15)  # never catches up: gives up after the 100 ms wait
    assert [a for a in cluster.actions[leader] if isinstance(a, TransferDone)] == [
        TransferDone(target, Code.TAKE_LEADERSHIP_FAILED)
    ]
    assert lc.role is Role.LEADER
    assert lc.propose([b"z"], cluster.now)[0] is Code.SUCCESS


def test_preferred_leader_takes_over_once_caught_up() -> None:
    cluster = Cluster.of(3, preferred_leader_id="n2")
    cluster.cut = {frozenset(("n2", "n0")), frozenset(("n2", "n1"))}
    leader = cluster.elect()
    assert leader != "n2"
    cluster.cut.clear()
    cluster.advance(1.0)
    assert cluster.leader() == "n2"


def test_take_leadership_checks() -> None:
    c = core("n1", state=HardState(term=3))
    c.handle_request(beat(3), 0.0)
    base: dict[str, Any] = {"group": "g", "remote_id": "n1", "local_id": "n0", "leader_id": "n0"}
    wrong_leader = LeadershipTransferRequest(**base, term=3, transfer_id="n2", transferee_id="n1")
    assert c.handle_request(wrong_leader, 0.0)[1].code is Code.INCONSISTENT_LEADER
    wrong_term = LeadershipTransferRequest(**base, term=2, transfer_id="n0", transferee_id="n1")
    assert c.handle_request(wrong_term, 0.0)[1].code is Code.INCONSISTENT_TERM
    behind = LeadershipTransferRequest(
        **base, term=3, transfer_id="n0", transferee_id="n1", take_leadership_ledger_index=5
    )
    assert c.handle_request(behind, 0.0)[1].code is Code.TAKE_LEADERSHIP_FAILED
    ok = LeadershipTransferRequest(**base, term=3, transfer_id="n0", transferee_id="n1")
    actions, response = c.handle_request(ok, 0.0)
    assert response.code is Code.SUCCESS
    assert (c.role, c.term, c.voted_for) == (Role.CANDIDATE, 4, "n1")
    assert isinstance(actions[0], PersistState) or isinstance(actions[1], PersistState)
    sends = [a for a in actions if isinstance(a, Send)]
    assert {s.to for s in sends} == {"n0", "n2"}
    first_send = next(i for i, a in enumerate(actions) if isinstance(a, Send))
    assert any(isinstance(a, PersistState) for a in actions[:first_send])


def test_a_fresh_member_asks_for_votes_after_a_vote_pause_not_a_leak_period() -> None:
    """fast_first_vote: a member with no vote in its term becomes a candidate within
    maxVoteIntervalMs; one that voted (restarted out of a running group) waits the leak period,
    as does every member without the flag (raft/election.py)."""
    leak = 3 * 0.2  # max(2, maxHeartBeatLeak) * heartBeatTimeIntervalMs (the harness's 200 ms)
    fresh = core(fast_first_vote=True, now=10.0)
    assert 10.03 <= fresh.next_deadline() <= 10.1  # minVoteIntervalMs..maxVoteIntervalMs
    assert fresh.tick(fresh.next_deadline()) and fresh.role is Role.CANDIDATE
    voted = core(fast_first_vote=True, state=HardState(term=3, voted_for="n1"), now=10.0)
    assert voted.next_deadline() == pytest.approx(10.0 + leak)
    assert core(now=10.0).next_deadline() == pytest.approx(10.0 + leak)
