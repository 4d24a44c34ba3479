"""RaftCore replication: the follower's push handling, the leader's dispatcher states, quorum
commit (current-term rule), and pending appends (full, timeout, term change)."""

from __future__ import annotations

import errno
from typing import Any

from broker.dledger.raft.core import Action, AppendDone, Committed, PersistState, RaftCore, Send
from broker.dledger.raft.log import MemoryLog
from broker.dledger.raft.member_state import HardState
from broker.dledger.raft.messages import (
    DLedgerResponseCode,
    Entry,
    HeartBeatRequest,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    Role,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from tests.broker.dledger.core_harness import Cluster, core, log_of

Code = DLedgerResponseCode


def push(kind: PushType, *entries: Entry, term: int = 2, commit: int = -1) -> PushEntryRequest:
    return PushEntryRequest(
        group="g", remote_id="n1", local_id="n0", leader_id="n0", term=term, type=kind,
        commit_index=commit, entries=entries,
    )  # fmt: skip


def follower(log: MemoryLog | None = None, committed: int = -1) -> RaftCore:
    c = core("n1", log=log, state=HardState(term=2), committed=committed)
    beat = HeartBeatRequest(group="g", remote_id="n1", local_id="n0", leader_id="n0", term=2)
    assert c.handle_request(beat, 0.0)[1].code is Code.SUCCESS
    return c


def answer(c: RaftCore, request: PushEntryRequest) -> PushEntryResponse:
    _, response = c.handle_request(request, 0.0)
    assert isinstance(response, PushEntryResponse)
    return response


# the leader's log: 0 and 1 from term 1, 2..4 from term 2
LEADER = log_of(1, 1, 2, 2, 2)


def e(index: int) -> Entry:
    entry = LEADER.get(index)
    assert entry is not None
    return entry


# --- follower side ---------------------------------------------------------------------------


def test_append_in_order_repeated_and_inconsistent() -> None:
    c = follower()
    r = answer(c, push(PushType.APPEND, e(0), commit=0))
    assert (r.code, r.index, r.end_index, c.committed_index) == (Code.SUCCESS, 0, 0, 0)
    assert answer(c, push(PushType.APPEND, e(0))).code is Code.REPEATED_PUSH
    gap = answer(c, push(PushType.APPEND, e(2)))
    assert (gap.code, gap.begin_index, gap.end_index) == (Code.INCONSISTENT_STATE, 0, 0)
    other = Entry(index=0, term=2, pos=0, body=b"other")
    assert answer(c, push(PushType.APPEND, other)).code is Code.INCONSISTENT_STATE
    # a batch overlapping what is there: the overlap must match, the rest is appended
    r = answer(c, push(PushType.APPEND, e(0), e(1), e(2), commit=4))
    assert (r.code, r.count, r.end_index) == (Code.SUCCESS, 3, 2)
    assert c.committed_index == 2  # min(leader's commit index, what is known to agree)
    assert c.log.get(2) == e(2)


def test_compare_and_truncate() -> None:
    stale = log_of(1, 1, 1, 1)  # entries 2 and 3 are from an old term-1 leader
    c = follower(stale)
    assert answer(c, push(PushType.COMPARE, e(2))).code is Code.INCONSISTENT_STATE
    r = answer(c, push(PushType.COMPARE, e(1)))
    assert (r.code, r.end_index) == (Code.SUCCESS, 3)
    r = answer(c, push(PushType.TRUNCATE, e(1), commit=1))
    assert (r.code, r.end_index, c.log.end_index, c.committed_index) == (Code.SUCCESS, 1, 1, 1)
    assert answer(c, push(PushType.APPEND, e(2))).code is Code.SUCCESS
    # TRUNCATE at an index whose entry differs: the entry is replaced
    c2 = follower(log_of(1, 1, 1))
    answer(c2, push(PushType.COMPARE, e(1)))
    assert answer(c2, push(PushType.TRUNCATE, e(2))).code is Code.SUCCESS
    assert [c2.log.get(i) for i in range(3)] == [e(0), e(1), e(2)]


def test_a_stale_truncate_keeps_acknowledged_entries() -> None:
    c = follower()
    answer(c, push(PushType.TRUNCATE, e(0)))
    for i in (1, 2, 3):
        assert answer(c, push(PushType.APPEND, e(i))).code is Code.SUCCESS
    # the same TRUNCATE delivered again late (a lossy network may): entries 1..3 were
    # acknowledged to this leader in this term and stay
    assert answer(c, push(PushType.TRUNCATE, e(0))).code is Code.SUCCESS
    assert c.log.end_index == 3


def test_committed_entries_are_never_truncated() -> None:
    c = follower(log_of(1, 1, 1), committed=2)
    # an entry that differs at a committed index: refused, nothing removed
    bad = Entry(index=1, term=2, pos=e(1).pos, body=b"bad")
    assert answer(c, push(PushType.TRUNCATE, bad)).code is Code.INCONSISTENT_STATE
    assert c.log.end_index == 2


def test_after_a_restart_appends_wait_for_a_compare() -> None:
    log = MemoryLog()
    c = follower(log)
    answer(c, push(PushType.TRUNCATE, e(0)))
    answer(c, push(PushType.APPEND, e(1)))
    restarted = follower(log)  # same log, new process: nothing known to agree yet
    assert answer(restarted, push(PushType.APPEND, e(2))).code is Code.INCONSISTENT_STATE
    commit = answer(restarted, push(PushType.COMMIT, commit=1))
    assert commit.code is Code.INCONSISTENT_STATE and restarted.committed_index == -1
    assert answer(restarted, push(PushType.COMPARE, e(1))).code is Code.SUCCESS
    assert answer(restarted, push(PushType.APPEND, e(2))).code is Code.SUCCESS
    assert answer(restarted, push(PushType.COMMIT, commit=2)).code is Code.SUCCESS
    assert restarted.committed_index == 2


def test_push_gate_codes() -> None:
    c = follower()
    assert answer(c, push(PushType.APPEND, e(0), term=1)).code is Code.EXPIRED_TERM
    r = answer(c, push(PushType.APPEND, e(0), term=3))
    assert r.code is Code.TERM_NOT_READY and (c.role, c.term) == (Role.CANDIDATE, 3)
    # a candidate at the pusher's term with no leader follows it
    assert answer(c, push(PushType.APPEND, e(0), term=3)).code is Code.SUCCESS
    assert (c.role, c.leader_id) == (Role.FOLLOWER, "n0")


# --- leader side -----------------------------------------------------------------------------


def leader(
    log: MemoryLog | None = None, term: int = 3, n: int = 3, **overrides: Any
) -> tuple[RaftCore, list[Action]]:
    """n0 as leader of ``term`` (by feeding it ACCEPTs); returns it and the actions of its
    first moments as leader (the dispatchers' first COMPAREs)."""
    c = core("n0", n, log=log, state=HardState(term=term), **overrides)
    actions = c.tick(1.0)
    votes = [
        a.request for a in actions if isinstance(a, Send) and isinstance(a.request, VoteRequest)
    ]
    for request in votes[: n // 2]:
        ok = VoteResponse(
            group="g",
            remote_id=request.remote_id,
            local_id="n0",
            term=term,
            vote_result=VoteResult.ACCEPT,
        )
        actions = c.handle_response(request, ok, 1.0)
    assert c.role is Role.LEADER and c.term == term
    return c, actions + c.tick(1.0)


def ack(
    c: RaftCore, request: PushEntryRequest, code: Code = Code.SUCCESS, end: int = -1
) -> list[object]:
    response = PushEntryResponse(
        group="g", remote_id=request.remote_id, local_id="n0", term=request.term, code=code,
        index=request.entries[0].index if request.entries else None, end_index=end,
        count=len(request.entries),
    )  # fmt: skip
    return list(c.handle_response(request, response, 1.0))


def pushes_to(actions: object, member: str) -> list[PushEntryRequest]:
    assert isinstance(actions, list)
    return [
        a.request
        for a in actions
        if isinstance(a, Send) and a.to == member and isinstance(a.request, PushEntryRequest)
    ]


def test_commit_only_through_an_entry_of_the_current_term() -> None:
    c, first = leader(log_of(1, 1), term=3)
    noop = c.log.get(2)
    assert c.log.end_index == 2 and noop is not None and noop.body == b""  # term 3's no-op
    (compare,) = pushes_to(first, "n1")
    assert (compare.type, compare.entries[0].index) == (PushType.COMPARE, 2)
    # n1 holds 0..1 only: the leader steps back to 1, which matches
    (compare,) = pushes_to(ack(c, compare, Code.INCONSISTENT_STATE, end=1), "n1")
    assert compare.entries[0].index == 1
    actions = ack(c, compare, end=1)
    assert c.peer_watermarks()["n1"] == 1  # a quorum (n0, n1) holds index 1...
    assert c.committed_index == -1  # ...but it is of term 1: not committed by counting
    (append,) = pushes_to(actions, "n1")
    assert (append.type, append.entries[0].index) == (PushType.APPEND, 2)
    actions = ack(c, append)
    assert c.committed_index == 2 and Committed(2) in actions


def test_dispatcher_fresh_follower_compare_truncate_append() -> None:
    cluster = Cluster.of(3)
    lead = cluster.elect()
    follower_id = next(m for m in cluster.cores if m != lead)
    # an empty follower: COMPARE (nothing there) -> TRUNCATE at the leader's begin -> APPEND
    assert cluster.pushes(lead, follower_id)[:2] == [PushType.COMPARE, PushType.TRUNCATE]
    cluster.propose(lead, b"a")
    assert cluster.pushes(lead, follower_id)[-1] is PushType.APPEND


def test_dispatcher_truncates_a_stale_suffix() -> None:
    cores = {
        "n0": core("n0", log=log_of(1, 1), state=HardState(term=1)),
        "n1": core("n1", log=log_of(1, 1, 1, 1), state=HardState(term=1)),
        "n2": core("n2", state=HardState(term=1)),
    }
    # n1's extra entries were never committed: n0 and n2 elect n0 while n1 is away
    cluster = Cluster(cores, cut={frozenset(("n1", "n0")), frozenset(("n1", "n2"))})
    assert cluster.elect() == "n0"
    mark = len(cluster.sent)
    cluster.cut.clear()
    cluster.advance(0.1)
    seen = [
        (r.type, r.entries[0].index if r.entries else None)
        for s, t, r in cluster.sent[mark:]
        if (s, t) == ("n0", "n1") and isinstance(r, PushEntryRequest)
    ]
    steps = [x for i, x in enumerate(seen) if i == 0 or seen[i - 1] != x]  # retries collapsed
    # compare at 2 (n1 holds a different entry there), at 1 (same): truncate at 1, append 2
    assert steps[:4] == [
        (PushType.COMPARE, 2),
        (PushType.COMPARE, 1),
        (PushType.TRUNCATE, 1),
        (PushType.APPEND, 2),
    ]
    assert [cores["n1"].log.get(i) for i in range(3)] == [cores["n0"].log.get(i) for i in range(3)]
    assert cores["n1"].log.end_index == 2


def test_in_flight_limit_and_repush() -> None:
    cluster = Cluster.of(3, max_in_flight_pushes=2)
    lead = cluster.elect()
    cluster.advance(0.05)
    behind = next(m for m in cluster.cores if m != lead)
    cluster.cut = {frozenset((lead, behind))}
    before = len(cluster.pushes(lead, behind))
    cluster.propose(lead, b"1", b"2", b"3", b"4", b"5")
    sent = cluster.pushes(lead, behind)[before:]
    assert sent == [PushType.APPEND, PushType.APPEND]  # two unanswered at most
    cluster.advance(0.1)  # maxPushTimeOutMs: watermark+1 is pushed again
    assert cluster.pushes(lead, behind)[before:].count(PushType.APPEND) == 3
    cluster.cut.clear()
    cluster.advance(0.3)
    assert cluster.cores[behind].log.end_index == cluster.cores[lead].log.end_index


def test_batch_push() -> None:
    cluster = Cluster.of(3, enable_batch_push=True, max_batch_push_entries=3)
    lead = cluster.elect()
    cluster.advance(0.05)
    other = next(m for m in cluster.cores if m != lead)
    mark = len(cluster.sent)
    cluster.propose(lead, *[b"%d" % i for i in range(7)])
    sizes = [
        len(r.entries)
        for s, t, r in cluster.sent[mark:]
        if (s, t) == (lead, other) and isinstance(r, PushEntryRequest) and r.type is PushType.APPEND
    ]
    assert sizes == [3, 3, 1]
    assert cluster.cores[other].committed_index <= cluster.cores[lead].committed_index


def test_a_batch_push_stops_before_its_byte_bound() -> None:
    """max_batch_push_bytes cuts a batch (headers + bodies; one entry always goes), so a push
    of large entries stays inside a remoting peer's 16 MiB frame whatever the entry count."""
    cluster = Cluster.of(
        3, enable_batch_push=True, max_batch_push_entries=64, max_batch_push_bytes=3 * 1048
    )
    lead = cluster.elect()
    cluster.advance(0.05)
    other = next(m for m in cluster.cores if m != lead)
    mark = len(cluster.sent)
    # 1000-byte bodies: 1048 bytes an entry, 3 fit; one of 5000 bytes goes alone
    cluster.propose(lead, *[b"x" * 1000] * 7, b"y" * 5000, b"z" * 1000)
    sizes = [
        len(r.entries)
        for s, t, r in cluster.sent[mark:]
        if (s, t) == (lead, other) and isinstance(r, PushEntryRequest) and r.type is PushType.APPEND
    ]
    assert sizes == [3, 3, 1, 1, 1]
    cluster.advance(0.2)
    assert cluster.cores[other].log.end_index == cluster.cores[lead].log.end_index


def test_idle_commit_push_carries_the_commit_index() -> None:
    cluster = Cluster.of(3)
    lead = cluster.elect()
    cluster.propose(lead, b"x")
    cluster.advance(0.15)  # a COMMIT push every half heartbeat interval when idle
    assert PushType.COMMIT in cluster.pushes(lead, next(m for m in cluster.cores if m != lead))
    assert {c.committed_index for c in cluster.cores.values()} == {1}


def pushes_since(cluster: Cluster, mark: int, src: str, to: str) -> list[PushType]:
    return [
        r.type
        for s, t, r in cluster.sent[mark:]
        if (s, t) == (src, to) and isinstance(r, PushEntryRequest)
    ]


def test_a_follower_is_one_push_behind_the_leaders_commit_not_a_commit_interval() -> None:
    """docs/guarantees.md, "Reads in DLedger mode": the push of an entry carries the commit
    index from before it; once the leader counts the entry committed, an idle follower hears
    so in a COMMIT push ``commit_push_delay_ms`` (20 ms) after that push, not at the next
    half-interval COMMIT push (100 ms here; DLedger's 1 s)."""
    cluster = Cluster.of(3)
    lead = cluster.elect()
    cluster.advance(0.3)
    lc = cluster.cores[lead]
    followers = [m for m in cluster.cores if m != lead]
    mark = len(cluster.sent)
    cluster.propose(lead, b"x")
    committed = lc.committed_index
    assert lc.log.end_index == committed  # the two acks came back at once
    # the APPEND carried the commit index from before the entry: one push behind
    assert all(cluster.cores[f].committed_index == committed - 1 for f in followers)
    cluster.advance(0.019, step=0.001)
    assert all(cluster.cores[f].committed_index == committed - 1 for f in followers)
    cluster.advance(0.002, step=0.001)
    assert all(cluster.cores[f].committed_index == committed for f in followers)
    for f in followers:
        assert pushes_since(cluster, mark, lead, f) == [PushType.APPEND, PushType.COMMIT]
    # and nothing more until the half-interval COMMIT push: the told index is current
    mark = len(cluster.sent)
    cluster.advance(0.05, step=0.001)
    assert not [r for _, _, r in cluster.sent[mark:] if isinstance(r, PushEntryRequest)]


def test_no_early_commit_push_while_a_follower_has_pushes_unanswered() -> None:
    cluster = Cluster.of(3)
    lead = cluster.elect()
    cluster.advance(0.3)
    slow, fast = (m for m in cluster.cores if m != lead)
    # the slow follower's answers are refused, so its APPEND stays unanswered; the fast one
    # makes the quorum, and gets its early COMMIT push
    cluster.cut = {frozenset((lead, slow))}
    mark = len(cluster.sent)
    cluster.propose(lead, b"x")
    cluster.advance(0.05, step=0.001)
    to = {f: pushes_since(cluster, mark, lead, f) for f in (slow, fast)}
    assert to[fast] == [PushType.APPEND, PushType.COMMIT]
    assert PushType.COMMIT not in to[slow]


# --- pending appends -------------------------------------------------------------------------


def test_pending_full_timeout_and_term_change() -> None:
    c, _ = leader(max_pending_requests_num=3)
    code, entries, _ = c.propose([b"a", b"b"], 1.0)
    assert code is Code.SUCCESS and [x.index for x in entries] == [1, 2]
    assert c.propose([b"c", b"d"], 1.0)[0] is Code.LEADER_PENDING_FULL
    assert c.propose([b"c"], 1.1)[0] is Code.SUCCESS
    c.set_disk_full(True)
    assert c.propose([b"e"], 1.1)[0] is Code.LEADER_PENDING_FULL  # checked first, as DLedger
    actions = c.tick(1.25)  # maxWaitAckTimeMs after the first propose
    assert [a for a in actions if isinstance(a, AppendDone)] == [
        AppendDone(1, 2, Code.WAIT_QUORUM_ACK_TIMEOUT)
    ]
    assert c.log.end_index == 3  # timed out is not removed: it may still commit
    assert c.propose([b"e"], 1.25)[0] is Code.DISK_FULL
    c.set_disk_full(False)
    assert c.propose([], 1.25)[0] is Code.REQUEST_WITH_EMPTY_BODYS
    assert c.propose([b"f", b"g"], 1.25)[0] is Code.SUCCESS
    higher = VoteRequest(
        group="g", remote_id="n0", local_id="n1", leader_id="n1", term=9,
        ledger_end_index=10, ledger_end_term=3,
    )  # fmt: skip
    actions, _ = c.handle_request(higher, 1.3)
    assert c.role is Role.CANDIDATE
    assert [a for a in actions if isinstance(a, AppendDone)] == [
        AppendDone(3, 3, Code.TERM_CHANGED),
        AppendDone(4, 5, Code.TERM_CHANGED),
    ]
    assert actions.index(PersistState(HardState(term=9))) < actions.index(
        AppendDone(3, 3, Code.TERM_CHANGED)
    )
    assert c.propose([b"h"], 1.3)[0] is Code.NOT_LEADER


def test_success_once_a_quorum_holds_it() -> None:
    cluster = Cluster.of(3)
    lead = cluster.elect()
    cluster.advance(0.05)
    actions = cluster.propose(lead, b"x", b"y")
    done = [a for a in cluster.actions[lead] if isinstance(a, AppendDone)]
    assert done == [AppendDone(1, 2, Code.SUCCESS)]
    assert not [a for a in actions if isinstance(a, AppendDone)]  # it came with the acks
    assert set(cluster.cores[lead].peer_watermarks()) == set(cluster.cores)


def test_restart_never_lowers_what_the_log_says() -> None:
    # the log holds a term-4 entry whose PersistState never ran before a crash
    c = core("n1", log=log_of(1, 4), state=HardState(term=2, voted_for="n0"), committed=9)
    assert (c.term, c.voted_for, c.committed_index) == (4, None, 1)


class _FullAfter(MemoryLog):
    """A log whose filesystem runs out of room after ``room`` more appends."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def append(self, term: int, body: bytes) -> Entry:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= 1
        return super().append(term, body)


def test_a_batch_the_disk_cannot_hold_is_not_stored_at_all() -> None:
    # a batch refused with DISK_FULL leaves nothing in the log: the broker, told so, hands
    # the batch's queue offsets out again, and an entry of it left behind would commit
    log = _FullAfter(room=100)
    c, _ = leader(log)
    end = c.log.end_index
    log.room = 2
    code, entries, actions = c.propose([b"a", b"b", b"c"], 1.0)
    assert (code, entries) == (Code.DISK_FULL, [])
    assert c.log.end_index == end
    pushed = [
        a.request
        for a in actions
        if isinstance(a, Send) and isinstance(a.request, PushEntryRequest)
    ]
    assert not [e for r in pushed for e in r.entries if e.index > end]
    log.room = 100
    c.set_disk_full(False)
    code, entries, _ = c.propose([b"d"], 1.1)
    assert code is Code.SUCCESS and [e.index for e in entries] == [end + 1]
