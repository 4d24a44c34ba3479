"""A follower the leader's retention left behind is reset to the leader's first entry
(raft/entry_handler.py, "Reset"): the core's side, over MemoryLog."""

from __future__ import annotations

import pytest

from broker.dledger.raft.core import Committed, LogReset, RaftCore
from broker.dledger.raft.log import MemoryLog
from broker.dledger.raft.member_state import HardState
from broker.dledger.raft.messages import (
    DLedgerResponseCode,
    Entry,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    Role,
)
from tests.broker.dledger.core_harness import Cluster, core

pytestmark = pytest.mark.timeout(30)

Code = DLedgerResponseCode
FILE = 128  # two entries of a few bytes per data file


def small_log() -> MemoryLog:
    return MemoryLog(file_size=FILE)


def cluster() -> Cluster:
    return Cluster({f"n{i}": core(f"n{i}", 3, log=small_log()) for i in range(3)})


def fill(c: Cluster, leader: str, count: int, tag: bytes = b"m") -> None:
    for i in range(count):
        c.propose(leader, tag + b"%d" % i)
    c.advance(0.2)


def test_a_follower_down_during_a_forced_clean_is_reset_and_catches_up() -> None:
    c = cluster()
    leader = c.elect()
    fill(c, leader, 4)
    down = next(m for m in c.cores if m != leader)
    other = next(m for m in c.cores if m not in (leader, down))
    c.cut |= {frozenset((down, leader)), frozenset((down, other))}
    fill(c, leader, 12)
    lead_log = c.cores[leader].log
    assert isinstance(lead_log, MemoryLog)
    held_end = c.cores[down].log.end_index
    # the forced clean: the leader drops its head past everything the down member holds
    assert lead_log.drop_head(c.cores[leader].committed_index) > 0
    begin = lead_log.begin_index
    assert begin > held_end + 1
    c.cut.clear()
    c.advance(1.0)
    assert c.cores[leader].role is Role.LEADER
    follower = c.cores[down]
    assert follower.log.begin_index == begin
    assert follower.log.end_index == lead_log.end_index
    for i in range(begin, lead_log.end_index + 1):
        assert follower.log.get(i) == lead_log.get(i)
    assert follower.committed_index == c.cores[leader].committed_index
    resets = c.of_kind(down, LogReset)
    assert resets == [LogReset(begin, lead_log.get(begin).pos)]  # type: ignore[union-attr]
    # the reset comes before the commit it enables
    actions = c.actions[down]
    first_commit_after = next(
        a for a in actions[actions.index(resets[0]) :] if isinstance(a, Committed)
    )
    assert first_commit_after.index >= begin
    assert not any(
        isinstance(a, Committed) and a.index >= begin for a in actions[: actions.index(resets[0])]
    )
    # new entries reach it as usual
    c.propose(leader, b"after")
    c.advance(0.2)
    assert follower.log.get(lead_log.end_index) == lead_log.get(lead_log.end_index)


def follower(log: MemoryLog, *, term: int = 3, committed: int = -1) -> RaftCore:
    return core("n1", 3, log=log, state=HardState(term=term), committed=committed)


def truncate(entry: Entry, *, commit: int, term: int = 3) -> PushEntryRequest:
    return PushEntryRequest(
        group="g",
        remote_id="n1",
        local_id="n0",
        leader_id="n0",
        term=term,
        type=PushType.TRUNCATE,
        commit_index=commit,
        entries=(entry,),
    )


def leader_log(count: int) -> MemoryLog:
    log = small_log()
    for i in range(count):
        log.append(2, b"e%d" % i)
    return log


def first_of_a_file_after(log: MemoryLog, index: int) -> Entry:
    for i in range(index, log.end_index + 1):
        entry = log.get(i)
        assert entry is not None
        if entry.pos % FILE == 0:
            return entry
    raise AssertionError("no file start")


def test_the_reset_needs_the_entry_committed_on_the_leader() -> None:
    lead = leader_log(12)
    head = first_of_a_file_after(lead, 6)
    f = follower(small_log())
    actions, response = f.handle_request(truncate(head, commit=head.index - 1), 1.0)
    assert response.code is Code.INCONSISTENT_STATE
    assert f.log.end_index == -1 and not any(isinstance(a, LogReset) for a in actions)
    actions, response = f.handle_request(truncate(head, commit=head.index), 1.0)
    assert isinstance(response, PushEntryResponse) and response.code is Code.SUCCESS
    assert (response.begin_index, response.end_index) == (head.index, head.index)
    assert actions[-2:] == [LogReset(head.index, head.pos), Committed(head.index)]
    assert f.committed_index == head.index


def test_the_reset_is_refused_off_a_data_file_start() -> None:
    lead = leader_log(12)
    head = first_of_a_file_after(lead, 6)
    inside = lead.get(head.index + 1)
    assert inside is not None and inside.pos % FILE
    log = small_log()
    log.append(1, b"old")
    f = follower(log)
    _, response = f.handle_request(truncate(inside, commit=lead.end_index), 1.0)
    assert response.code is Code.INCONSISTENT_STATE
    assert log.end_index == 0 and log.get(0) is not None  # nothing changed


def test_divergent_entries_at_and_above_the_leaders_first_are_dropped() -> None:
    """Its entry at B differs from the leader's, which is committed: none of its entries from
    B on is committed, and nothing before B is known to agree."""
    lead = leader_log(12)
    head = first_of_a_file_after(lead, 4)
    log = small_log()
    for i in range(head.index + 3):
        log.append(1, b"other%d" % i)
    f = follower(log)
    actions, response = f.handle_request(truncate(head, commit=lead.end_index), 1.0)
    assert response.code is Code.SUCCESS
    assert (log.begin_index, log.end_index) == (head.index, head.index)
    assert log.get(head.index) == head
    assert LogReset(head.index, head.pos) in actions


def test_a_follower_holding_the_entry_keeps_its_log() -> None:
    lead = leader_log(12)
    head = first_of_a_file_after(lead, 4)
    log = small_log()
    for i in range(head.index + 2):
        entry = lead.get(i)
        assert entry is not None
        log.append_entry(entry)
    f = follower(log)
    actions, response = f.handle_request(truncate(head, commit=lead.end_index), 1.0)
    assert response.code is Code.SUCCESS
    assert (log.begin_index, log.end_index) == (0, head.index)
    assert not any(isinstance(a, LogReset) for a in actions)


def test_the_reset_never_drops_an_entry_it_holds_committed() -> None:
    lead = leader_log(12)
    head = first_of_a_file_after(lead, 4)
    log = small_log()
    for i in range(head.index + 2):
        log.append(1, b"other%d" % i)
    f = follower(log, committed=head.index + 1)  # (a stale belief; the rule still holds)
    _, response = f.handle_request(truncate(head, commit=lead.end_index), 1.0)
    assert response.code is Code.INCONSISTENT_STATE
    assert log.end_index == head.index + 1 and log.get(0) == Entry(0, 1, 0, b"other0")


def test_term_vote_and_role_are_untouched() -> None:
    lead = leader_log(12)
    head = first_of_a_file_after(lead, 6)
    f = core("n1", 3, log=small_log(), state=HardState(term=3, voted_for="n0"))
    actions, response = f.handle_request(truncate(head, commit=head.index), 1.0)
    assert response.code is Code.SUCCESS
    assert (f.term, f.voted_for, f.role, f.leader_id) == (3, "n0", Role.FOLLOWER, "n0")
    assert not any(type(a).__name__ == "PersistState" for a in actions)


def test_a_core_on_a_log_that_lost_its_head_starts_committed_at_its_first_entry() -> None:
    log = leader_log(12)
    assert log.drop_head(8) > 0
    begin = log.begin_index
    assert begin > 0
    c = core("n0", 3, log=log, committed=-1)
    assert c.committed_index == begin
    assert core("n0", 3, log=leader_log(3), committed=-1).committed_index == -1


def test_memory_log_reset_and_drop_head() -> None:
    log = leader_log(10)
    with pytest.raises(ValueError):
        log.reset(Entry(20, 3, FILE * 5 + 1, b"x"))
    assert log.end_index == 9
    log.reset(Entry(20, 3, FILE * 5, b"x"))
    assert (log.begin_index, log.end_index, log.end_term) == (20, 20, 3)
    assert log.write_pos == FILE * 5 + 49
    assert log.append(3, b"y").index == 21
    assert log.drop_head(21) == 0  # entry 21 does not start a file
