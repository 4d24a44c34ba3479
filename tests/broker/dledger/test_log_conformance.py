"""One conformance suite for every RaftLog (the in-memory log and the file log in DLedger's
format), then what only the file log has: the exact bytes, reopening, and recovery of a torn
tail, including one left by SIGKILL."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.dledger.log import MemoryLog, RaftLog, place_entry
from broker.dledger.messages import Entry
from broker.dledger.mmap_file_store import FileLog, open_file_log
from broker.dledger.state import (
    Checkpoint,
    HardState,
    StateFileError,
    load_checkpoint,
    load_hard_state,
    save_checkpoint,
    save_hard_state,
)

DATA = 1024  # small data files: entries cross file ends often
INDEX = 32 * 8


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
    assert raft_log.get(0) is None and raft_log.term_at(0) == -1 and raft_log.write_pos == 0


def test_append_get_and_placement(raft_log: RaftLog) -> None:
    pos = 0
    for i in range(30):
        e = raft_log.append(1 + i // 10, body(i, 60 + i * 7))
        expected = place_entry(pos, e.size, DATA)
        assert (e.index, e.pos) == (i, expected)
        pos = expected + e.size
        assert raft_log.write_pos == pos
    assert raft_log.end_index == 29 and raft_log.end_term == 3 and raft_log.begin_index == 0
    for i in range(30):
        e = raft_log.get(i)
        assert e is not None and e.body == body(i, 60 + i * 7) and e.term == 1 + i // 10
        assert raft_log.term_at(i) == e.term
    assert raft_log.get(30) is None and raft_log.get(-1) is None
    # some entries moved to a new file, leaving a blank
    assert any(raft_log.get(i).pos % DATA == 0 for i in range(1, 30))


def test_append_entry_checks_index_and_pos(raft_log: RaftLog) -> None:
    leader = MemoryLog(file_size=DATA)
    entries = [leader.append(2, body(i, 300)) for i in range(6)]
    assert raft_log.append_entry(entries[0])
    assert not raft_log.append_entry(entries[2])  # a gap
    assert not raft_log.append_entry(entries[0])  # already there
    wrong_pos = Entry(index=1, term=2, pos=entries[1].pos + 8, body=entries[1].body)
    assert not raft_log.append_entry(wrong_pos)
    for e in entries[1:]:
        assert raft_log.append_entry(e)
    assert [raft_log.get(i) for i in range(6)] == entries


def test_truncate_and_append_again(raft_log: RaftLog) -> None:
    entries = [raft_log.append(1, body(i, 200)) for i in range(10)]
    raft_log.truncate(6)
    assert raft_log.end_index == 5 and raft_log.write_pos == entries[6].pos
    assert raft_log.get(6) is None and raft_log.term_at(6) == -1
    raft_log.truncate(20)  # past the end: nothing
    assert raft_log.end_index == 5
    again = raft_log.append(2, body(99, 200))
    assert (again.index, again.pos, again.term) == (6, entries[6].pos, 2)
    assert raft_log.end_term == 2
    raft_log.truncate(0)
    assert raft_log.end_index == -1 and raft_log.write_pos == 0
    assert raft_log.append(3, b"x").pos == 0


# --- the file log only --------------------------------------------------------------------


def test_exact_bytes_of_entry_blank_and_index_unit(tmp_path: Path) -> None:
    d = tmp_path / "dl"
    flog = open_file_log(str(d), data_file_size=DATA, index_file_size=INDEX)
    first = flog.append(7, b"A" * 900)  # 948 bytes: the next 100-byte body cannot fit
    second = flog.append(7, b"B" * 100)
    flog.close()
    data0 = (d / "data" / f"{0:020d}").read_bytes()
    assert data0[:48] == struct.pack(">iiqqqiiii", 1, 948, 0, 7, 0, 0, 0, 0, 900)
    assert data0[48:948] == b"A" * 900
    assert data0[948:956] == struct.pack(">ii", -1, DATA - 948)
    assert second.pos == DATA
    data1 = (d / "data" / f"{DATA:020d}").read_bytes()
    assert data1[:48] == struct.pack(">iiqqqiiii", 1, 148, 1, 7, DATA, 0, 0, 0, 100)
    index = (d / "index" / f"{0:020d}").read_bytes()
    assert index[:64] == struct.pack(">iqiqq", 1, 0, 948, 0, 7) + struct.pack(
        ">iqiqq", 1, DATA, 148, 1, 7
    )
    assert first.size == 948


def test_reopen_keeps_every_entry(tmp_path: Path) -> None:
    d = str(tmp_path / "dl")
    flog = open_file_log(d, data_file_size=DATA, index_file_size=INDEX)
    written = [flog.append(1 + i // 5, body(i, 50 + 13 * i)) for i in range(20)]
    flog.close()
    again = open_file_log(d, data_file_size=DATA, index_file_size=INDEX)
    assert [again.get(i) for i in range(20)] == written
    assert again.write_pos == written[-1].pos + written[-1].size
    assert again.append(9, b"z").index == 20
    again.close()


@pytest.mark.parametrize("damage", ["unit", "header", "no_unit"])
def test_recovery_cuts_a_torn_last_entry(tmp_path: Path, damage: str) -> None:
    d = tmp_path / "dl"
    flog = open_file_log(str(d), data_file_size=DATA, index_file_size=INDEX)
    written = [flog.append(1, body(i, 120)) for i in range(5)]
    last = written[-1]
    flog.close()
    index_file = d / "index" / f"{0:020d}"
    data_file = d / "data" / f"{last.pos - last.pos % DATA:020d}"
    if damage == "unit":  # half a unit: its term is missing
        raw = bytearray(index_file.read_bytes())
        raw[4 * 32 + 20 : 4 * 32 + 32] = bytes(12)
        index_file.write_bytes(bytes(raw))
    elif damage == "header":  # the unit is there but the entry's header is not
        raw = bytearray(data_file.read_bytes())
        at = last.pos % DATA
        raw[at : at + 48] = bytes(48)
        data_file.write_bytes(bytes(raw))
    else:  # the entry's bytes were written, its unit never was
        raw = bytearray(index_file.read_bytes())
        raw[4 * 32 : 5 * 32] = bytes(32)
        index_file.write_bytes(bytes(raw))
    again = open_file_log(str(d), data_file_size=DATA, index_file_size=INDEX)
    assert again.end_index == 3 and [again.get(i) for i in range(4)] == written[:4]
    assert again.write_pos == last.pos or again.write_pos == written[3].pos + written[3].size
    # the cut tail is zero: nothing of it can come back
    if damage != "unit":
        assert data_file.read_bytes()[last.pos % DATA :].count(0) == DATA - last.pos % DATA
    assert again.append(2, b"new").index == 4
    again.close()


WRITER = textwrap.dedent(
    """
    import sys
    from broker.dledger.mmap_file_store import open_file_log
    flog = open_file_log(sys.argv[1], data_file_size=4096, index_file_size=32 * 64)
    i = flog.end_index + 1
    print("ready", flush=True)
    while True:
        flog.append(1, bytes([i % 251]) * (50 + i % 300))
        i += 1
    """
)


def test_recovery_after_sigkill_mid_write(tmp_path: Path) -> None:
    d = tmp_path / "dl"
    root = Path(__file__).resolve().parents[3]
    ends = []
    for k in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(d)],
            stdout=subprocess.PIPE,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(0.1 + 0.1 * k)  # mid-stream: thousands of entries, many files
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        flog = open_file_log(str(d), data_file_size=4096, index_file_size=32 * 64)
        for i in range(flog.end_index + 1):
            e = flog.get(i)
            assert e is not None and e.body == bytes([i % 251]) * (50 + i % 300)
        ends.append(flog.end_index)
        flog.close()
    assert ends[0] > 100 and ends == sorted(ends)


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(0, 600)),
            st.tuples(st.just("truncate"), st.integers(0, 40)),
            st.tuples(st.just("reopen"), st.just(0)),
        ),
        max_size=40,
    )
)
def test_file_log_behaves_as_the_memory_log(tmp_path_factory, ops) -> None:
    d = str(tmp_path_factory.mktemp("dl"))
    flog: FileLog = open_file_log(d, data_file_size=DATA, index_file_size=INDEX)
    mlog = MemoryLog(file_size=DATA)
    term = 1
    try:
        for op, n in ops:
            if op == "append":
                term += n % 2
                assert flog.append(term, body(n, n)) == mlog.append(term, body(n, n))
            elif op == "truncate":
                flog.truncate(n)
                mlog.truncate(n)
            else:
                flog.close()
                flog = open_file_log(d, data_file_size=DATA, index_file_size=INDEX)
            assert (flog.end_index, flog.end_term, flog.write_pos) == (
                mlog.end_index,
                mlog.end_term,
                mlog.write_pos,
            )
        assert [flog.get(i) for i in range(mlog.end_index + 1)] == [
            mlog.get(i) for i in range(mlog.end_index + 1)
        ]
    finally:
        flog.close()


# --- currterm and checkpoint ----------------------------------------------------------------


def test_hard_state_and_checkpoint_files(tmp_path: Path) -> None:
    d = str(tmp_path)
    assert load_hard_state(d) == HardState() and load_checkpoint(d) is None
    save_hard_state(d, HardState(term=5, voted_for="n2"))
    assert (tmp_path / "currterm").read_text() == "currTerm=5\nvoteLeader=n2\n"
    assert load_hard_state(d) == HardState(5, "n2")
    save_hard_state(d, HardState(term=6))
    assert load_hard_state(d) == HardState(6, None)
    save_checkpoint(d, Checkpoint(end_index=10, committed_index=8))
    assert (tmp_path / "checkpoint").read_text() == "endIndex=10\ncommittedIndex=8\n"
    assert load_checkpoint(d) == Checkpoint(10, 8)
    assert not list(tmp_path.glob("*.tmp"))
    (tmp_path / "currterm").write_text("#DLedger\ncurrTerm=x\n")
    with pytest.raises(StateFileError):
        load_hard_state(d)
