"""One conformance suite for every RaftLog: the in-memory log and the file log in DLedger's
format (what only the file log has is in test_mmap_file_store.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.dledger.driver.mmap_file_store import open_file_log
from broker.dledger.raft.log import MemoryLog, RaftLog, place_entry
from broker.dledger.raft.messages import Entry

DATA = 1024  # small data files: entries cross file ends often
INDEX = 32 * 8  # eight units a file


@pytest.fixture(params=["memory", "file"])
def raft_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RaftLog]:
    if request.param == "memory":
        yield MemoryLog(file_size=DATA)
    else:
        flog = open_file_log(str(tmp_path / "dl"), data_file_size=DATA, index_file_size=INDEX)
        yield flog
        flog.close()


def body(n: int, size: int = 100) -> bytes:
    return bytes([n % 251]) * size


def test_empty(raft_log: RaftLog) -> None:
    assert (raft_log.begin_index, raft_log.end_index, raft_log.end_term) == (-1, -1, -1)
    assert raft_log.get(0) is None and raft_log.get(-1) is None
    assert raft_log.term_at(0) == -1 and raft_log.write_pos == 0
    raft_log.truncate(0)  # nothing to remove
    assert raft_log.end_index == -1 and raft_log.write_pos == 0


def test_append_get_and_placement(raft_log: RaftLog) -> None:
    pos = 0
    for i in range(30):
        e = raft_log.append(1 + i // 10, body(i, 60 + i * 7))
        expected = place_entry(pos, e.size, DATA)
        assert (e.index, e.term, e.pos, e.size) == (i, 1 + i // 10, expected, 48 + 60 + i * 7)
        pos = expected + e.size
        assert raft_log.write_pos == pos and raft_log.end_index == i
    assert raft_log.end_index == 29 and raft_log.end_term == 3 and raft_log.begin_index == 0
    for i in range(30):
        got = raft_log.get(i)
        assert got is not None and got.body == body(i, 60 + i * 7) and got.term == 1 + i // 10
        assert raft_log.term_at(i) == got.term
    assert raft_log.get(30) is None and raft_log.get(-1) is None and raft_log.term_at(30) == -1
    # entries that did not fit a file's end opened the next file (over a blank)
    opened = [
        x.pos for i in range(1, 30) if (x := raft_log.get(i)) is not None and x.pos % DATA == 0
    ]
    assert len(opened) >= 5


def test_a_full_size_entry_fills_a_file_with_room_for_a_blank(raft_log: RaftLog) -> None:
    biggest = DATA - 8 - 48  # place_entry keeps a blank's 8 bytes free at a file end
    first = raft_log.append(1, body(1, 10))
    big = raft_log.append(1, body(2, biggest))
    assert (first.pos, big.pos) == (0, DATA)
    assert raft_log.append(1, body(3, 1)).pos == 2 * DATA
    with pytest.raises(ValueError):
        raft_log.append(1, body(4, biggest + 1))
    assert raft_log.end_index == 2


def test_append_entry_checks_index_and_pos(raft_log: RaftLog) -> None:
    leader = MemoryLog(file_size=DATA)
    entries = [leader.append(2, body(i, 300)) for i in range(6)]
    assert entries[2].pos == DATA  # the third one opens the second file
    assert not raft_log.append_entry(entries[1])  # not the first
    assert raft_log.append_entry(entries[0])
    assert not raft_log.append_entry(entries[2])  # a gap
    assert not raft_log.append_entry(entries[0])  # already there
    wrong_pos = Entry(index=1, term=2, pos=entries[1].pos + 8, body=entries[1].body)
    assert not raft_log.append_entry(wrong_pos)
    assert raft_log.end_index == 0 and raft_log.write_pos == entries[1].pos
    assert raft_log.append_entry(entries[1])
    # the next one must open the next file: its place in this one is refused
    stay = Entry(index=2, term=2, pos=raft_log.write_pos, body=entries[2].body)
    assert not raft_log.append_entry(stay)
    for e in entries[2:]:
        assert raft_log.append_entry(e)
    assert [raft_log.get(i) for i in range(6)] == entries
    assert raft_log.end_term == 2 and raft_log.write_pos == leader.write_pos


def test_truncate_and_append_again(raft_log: RaftLog) -> None:
    entries = [raft_log.append(1 + i // 4, body(i, 200)) for i in range(10)]
    assert entries[6].pos % DATA != 0
    raft_log.truncate(6)
    assert raft_log.end_index == 5 and raft_log.end_term == 2
    assert raft_log.write_pos == entries[6].pos == entries[5].pos + entries[5].size
    assert raft_log.get(6) is None and raft_log.term_at(6) == -1
    assert [raft_log.get(i) for i in range(6)] == entries[:6]
    raft_log.truncate(20)  # past the end: nothing
    assert raft_log.end_index == 5
    again = raft_log.append(7, body(99, 200))
    assert (again.index, again.pos, again.term) == (6, entries[6].pos, 7)
    assert raft_log.end_term == 7 and raft_log.get(6) == again
    raft_log.truncate(0)
    assert (raft_log.begin_index, raft_log.end_index, raft_log.end_term) == (-1, -1, -1)
    assert raft_log.write_pos == 0 and raft_log.get(0) is None
    assert raft_log.append(8, b"x") == Entry(index=0, term=8, pos=0, body=b"x")


def test_truncate_at_an_entry_that_opened_a_file(raft_log: RaftLog) -> None:
    """The write position goes back to the previous entry's end, not to the removed entry's pos
    (a file start): the blank before it is undone, so a leader's entry that fits the old file
    there is accepted (else the follower would refuse it after every TRUNCATE)."""
    first = raft_log.append(1, body(1, 900))  # 948 bytes
    opened = raft_log.append(1, body(2, 200))  # does not fit: opens the second file
    assert opened.pos == DATA
    raft_log.truncate(1)
    assert raft_log.write_pos == first.size and raft_log.end_index == 0
    leader = MemoryLog(file_size=DATA)
    leader.append(1, body(1, 900))
    small = leader.append(2, body(3, 10))
    assert small.pos == first.size
    assert raft_log.append_entry(small) and raft_log.get(1) == small
    raft_log.truncate(1)
    assert raft_log.append_entry(opened)  # the old entry, had the leader kept it
    assert raft_log.get(1) == opened and raft_log.write_pos == DATA + opened.size


def test_reset_begins_the_log_again_at_a_file_start(raft_log: RaftLog) -> None:
    for i in range(12):
        raft_log.append(1, body(i))
    before = (raft_log.begin_index, raft_log.end_index, raft_log.write_pos)
    with pytest.raises(ValueError):
        raft_log.reset(Entry(40, 3, 5 * DATA + 48, body(40)))  # not a data file's start
    assert (raft_log.begin_index, raft_log.end_index, raft_log.write_pos) == before
    first = Entry(40, 3, 5 * DATA, body(40))
    raft_log.reset(first)
    assert (raft_log.begin_index, raft_log.end_index, raft_log.end_term) == (40, 40, 3)
    assert raft_log.write_pos == 5 * DATA + first.size
    assert raft_log.get(40) == first and raft_log.get(39) is None and raft_log.get(0) is None
    assert raft_log.term_at(40) == 3 and raft_log.term_at(11) == -1
    nxt = raft_log.append(4, body(41))
    assert (nxt.index, nxt.pos) == (41, 5 * DATA + first.size)
    follower_entry = Entry(42, 4, place_entry(raft_log.write_pos, 148, DATA), body(42))
    assert raft_log.append_entry(follower_entry)
    raft_log.truncate(42)
    assert raft_log.end_index == 41 and raft_log.write_pos == nxt.pos + nxt.size
