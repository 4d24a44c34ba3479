"""The leader's lease (broker/dledger/raft/election.py, "The leader's lease"), deterministic.

A leader steps down to candidate exactly ``maxHeartBeatLeak * heartBeatTimeInterval`` after the
*send* time of the last heartbeat round a quorum answered SUCCESS; every entry point checks it,
so no call finds a leader past that time.  The harness timings: interval 200 ms, leak 3, so the
lease is 600 ms.  Time here is the cores' own (no clock, no sleeps): events run at the exact
deadlines the cores name.
"""

from __future__ import annotations

import logging

import pytest

from broker.dledger.raft.core import RaftCore, Send
from broker.dledger.raft.messages import (
    DLedgerResponseCode,
    HeartBeatRequest,
    HeartBeatResponse,
    Role,
)
from tests.broker.dledger.core_harness import Cluster

Code = DLedgerResponseCode
LEASE = 0.6  # 3 x 200 ms


def run_until(cluster: Cluster, until: float) -> dict[str, list[tuple[float, Role]]]:
    """Run every core's timers at their exact deadlines up to ``until``; returns each member's
    role changes as (time, new role)."""
    roles = {m: c.role for m, c in cluster.cores.items()}
    changes: dict[str, list[tuple[float, Role]]] = {m: [] for m in cluster.cores}
    while True:
        at = min(c.next_deadline() for c in cluster.cores.values())
        if at > until:
            cluster.now = until
            return changes
        cluster.now = max(cluster.now, at)
        for member, c in cluster.cores.items():
            if c.next_deadline() <= cluster.now:
                cluster.absorb(member, c.tick(cluster.now))
        cluster.deliver()
        for member, c in cluster.cores.items():
            if c.role is not roles[member]:
                roles[member] = c.role
                changes[member].append((cluster.now, c.role))


def elected(n: int = 3) -> tuple[Cluster, str, RaftCore]:
    cluster = Cluster.of(n)
    leader = cluster.elect()
    run_until(cluster, cluster.now + 1.0)  # a few heartbeat rounds, all answered
    return cluster, leader, cluster.cores[leader]


def test_the_lease_moves_with_every_answered_heartbeat_round() -> None:
    cluster, _, lc = elected()
    ends = []
    for _ in range(10):
        run_until(cluster, cluster.now + 0.1)
        ends.append(lc.lease_end())
        # a round goes out every interval: the lease never has less than leak - 1 intervals left
        assert LEASE - 0.2 <= lc.lease_end() - cluster.now <= LEASE
    assert ends == sorted(ends) and ends[-1] > ends[0]
    assert lc.role is Role.LEADER


def test_a_cut_off_leader_steps_down_exactly_at_its_lease_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster, leader, lc = elected()
    cut_at = cluster.now
    lease_end = lc.lease_end()
    # the lease started at the last answered round, at or before the cut
    assert cut_at - 0.2 <= lease_end - LEASE <= cut_at
    cluster.cut = {frozenset((leader, o)) for o in cluster.cores if o != leader}
    with caplog.at_level(logging.WARNING, logger="broker.dledger.raft.election"):
        changes = run_until(cluster, cut_at + 2.0)
    stepped_down = changes[leader][0]
    assert stepped_down == (lease_end, Role.CANDIDATE)
    assert lc.term == cluster.cores[leader].term  # at the same term (its vote rounds go on)
    # the followers become candidates only at or after that moment: each heard the round
    # that started the lease, and waits max(2, leak) intervals after the last one it heard
    for member, seen in changes.items():
        if member != leader:
            assert seen and seen[0][1] is Role.CANDIDATE and seen[0][0] >= lease_end, seen
    assert not any(c.role is Role.LEADER for m, c in cluster.cores.items() if m == leader)
    (line,) = [r.getMessage() for r in caplog.records if "lost its quorum" in r.getMessage()]
    assert f"DLedger {leader}: leader of term" in line
    assert "maxHeartBeatLeak 3 x heartBeatTimeIntervalMs 200" in line
    assert "for 0.600 s" in line


def test_the_lease_starts_when_the_round_was_sent_not_when_it_was_answered() -> None:
    _, leader, lc = elected()
    beats: list[Send] = []
    while not beats:  # the leader's timers until its next heartbeat round (answers dropped)
        sent_at = lc.next_deadline()
        sends = [a for a in lc.tick(sent_at) if isinstance(a, Send)]
        beats = [s for s in sends if isinstance(s.request, HeartBeatRequest)]
    request = beats[0].request
    assert isinstance(request, HeartBeatRequest)
    answer = HeartBeatResponse(
        group="g",
        remote_id=request.remote_id,
        local_id=leader,
        term=lc.term,
        leader_id=leader,
        code=Code.SUCCESS,
    )
    lc.handle_response(request, answer, sent_at + 0.15)  # self + one follower: a quorum of 3
    assert lc.lease_end() == pytest.approx(sent_at + LEASE)


def test_every_entry_point_checks_the_lease_not_only_the_timer() -> None:
    cluster, leader, lc = elected()
    cluster.cut = {frozenset((leader, o)) for o in cluster.cores if o != leader}
    # no tick at the deadline (a late timer on a busy host): the next call still finds the
    # lease over, and a write is refused as from a non-leader
    late = lc.lease_end() + 0.05
    code, entries, _ = lc.propose([b"late"], late)
    assert (code, entries, lc.role) == (Code.NOT_LEADER, [], Role.CANDIDATE)


def test_five_members_keep_the_lease_with_two_followers_and_lose_it_with_one() -> None:
    cluster, leader, lc = elected(5)
    followers = [m for m in cluster.cores if m != leader]
    # cut from two followers: itself and the other two are a quorum of 5
    cluster.cut = {frozenset((leader, o)) for o in followers[:2]}
    run_until(cluster, cluster.now + 3 * LEASE)
    assert lc.role is Role.LEADER
    cluster.cut |= {frozenset((leader, followers[2]))}
    lease_end = lc.lease_end()
    changes = run_until(cluster, cluster.now + 2.0)
    assert changes[leader][0] == (lease_end, Role.CANDIDATE)
