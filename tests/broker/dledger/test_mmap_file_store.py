"""What only the file log has: DLedger's exact bytes, file names, reopening, flush, recovery of
a torn tail (including one left by SIGKILL), and the same behaviour as the in-memory log under
random appends, truncations and reopens."""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.dledger.driver import mmap_file_store
from broker.dledger.driver.mmap_file_store import RESET_MARKER, FileLog, open_file_log
from broker.dledger.raft.log import MemoryLog
from broker.dledger.raft.messages import Entry
from common.message import MessageExtBrokerInner
from common.message_encoder import encode_record

DATA = 1024
INDEX = 32 * 8
HEADER = ">iiqqqiiii"  # magic size index term pos channel chainCrc bodyCrc bodyLength
UNIT = ">iqiqq"  # magic pos size index term


def open_log(d: Path) -> FileLog:
    return open_file_log(str(d), data_file_size=DATA, index_file_size=INDEX)


def body(n: int, size: int) -> bytes:
    return bytes([n % 251]) * size


def names(d: Path) -> list[str]:
    return sorted(os.listdir(d))


def test_exact_bytes_of_entry_blank_and_index_unit(tmp_path: Path) -> None:
    d = tmp_path / "dl"
    flog = open_log(d)
    first = flog.append(7, b"A" * 900)  # 948 bytes: the next 100-byte body cannot fit
    second = flog.append(7, b"B" * 100)
    flog.close()
    assert (first.size, second.pos) == (948, DATA)
    assert names(d / "data") == [f"{0:020d}", f"{DATA:020d}"]
    assert names(d / "index") == [f"{0:020d}"]
    data0 = (d / "data" / f"{0:020d}").read_bytes()
    assert len(data0) == DATA
    assert data0[:48] == struct.pack(HEADER, 1, 948, 0, 7, 0, 0, 0, 0, 900)
    assert data0[48:948] == b"A" * 900
    assert data0[948:956] == struct.pack(">ii", -1, DATA - 948)
    assert data0[956:] == bytes(DATA - 956)
    data1 = (d / "data" / f"{DATA:020d}").read_bytes()
    assert data1[:48] == struct.pack(HEADER, 1, 148, 1, 7, DATA, 0, 0, 0, 100)
    assert data1[48:148] == b"B" * 100 and data1[148:] == bytes(DATA - 148)
    index = (d / "index" / f"{0:020d}").read_bytes()
    assert len(index) == INDEX
    assert index[:64] == struct.pack(UNIT, 1, 0, 948, 0, 7) + struct.pack(UNIT, 1, DATA, 148, 1, 7)
    assert index[64:] == bytes(INDEX - 64)


def test_index_files_roll_every_eight_units(tmp_path: Path) -> None:
    d = tmp_path / "dl"
    flog = open_log(d)
    written = [flog.append(3, body(i, 10)) for i in range(17)]
    flog.close()
    assert names(d / "index") == [f"{n:020d}" for n in (0, INDEX, 2 * INDEX)]
    third = (d / "index" / f"{2 * INDEX:020d}").read_bytes()
    e = written[16]
    assert third[:32] == struct.pack(UNIT, 1, e.pos, e.size, 16, 3)


def test_reopen_keeps_every_entry(tmp_path: Path) -> None:
    d = tmp_path / "dl"
    flog = open_log(d)
    written = [flog.append(1 + i // 5, body(i, 50 + 13 * i)) for i in range(20)]
    flog.close()
    again = open_log(d)
    assert [again.get(i) for i in range(20)] == written
    assert (again.begin_index, again.end_index, again.end_term) == (0, 19, 4)
    assert again.write_pos == written[-1].pos + written[-1].size
    assert again.append(9, b"z").index == 20
    again.close()


def test_truncate_cuts_files_as_recovery_would(tmp_path: Path) -> None:
    d = tmp_path / "dl"
    flog = open_log(d)
    written = [flog.append(1, body(i, 400)) for i in range(12)]
    assert len(names(d / "data")) == 6 and len(names(d / "index")) == 2
    flog.truncate(4)  # entry 4 had opened a file: that file goes, the blank before it too
    assert names(d / "data") == [f"{0:020d}", f"{DATA:020d}"]
    assert names(d / "index") == [f"{0:020d}"]
    data1 = (d / "data" / f"{DATA:020d}").read_bytes()
    assert data1[896:] == bytes(DATA - 896)  # entry 3 ends at 896 in the second file
    assert (d / "index" / f"{0:020d}").read_bytes()[4 * 32 :] == bytes(INDEX - 4 * 32)
    flog.close()
    again = open_log(d)
    assert again.end_index == 3 and again.write_pos == written[3].pos + written[3].size
    assert [again.get(i) for i in range(4)] == written[:4]
    again.close()


def test_flush_syncs_only_what_changed(tmp_path: Path) -> None:
    flog = open_log(tmp_path / "dl")
    flog.flush()  # nothing written: nothing to do
    flog.append(1, body(1, 100))
    assert [mf.flushed for mf in flog.data.files] == [0]
    flog.flush()
    assert [(mf.flushed, mf.wrote) for mf in flog.data.files] == [(148, 148)]
    assert [(mf.flushed, mf.wrote) for mf in flog.index.files] == [(32, 32)]
    assert not flog.data.flush_jobs() and not flog.index.flush_jobs()
    flog.close()
    flog.flush()  # closed: nothing to do, no error
    flog.close()


def test_flush_in_a_thread_while_appending_and_truncating(tmp_path: Path) -> None:
    d = tmp_path / "dl"
    flog = open_log(d)
    mlog = MemoryLog(file_size=DATA)
    stop = threading.Event()
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                flog.flush()
        except BaseException as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=flusher)
    t.start()
    rng = random.Random(5)
    try:
        for n in range(1500):
            if n % 50 == 49:
                cut = rng.randrange(0, mlog.end_index + 2)
                flog.truncate(cut)
                mlog.truncate(cut)
            else:
                size = rng.randrange(0, 500)
                assert flog.append(1, body(n, size)) == mlog.append(1, body(n, size))
    finally:
        stop.set()
        t.join()
    assert not errors
    flog.flush()
    for queue in (flog.data, flog.index):
        assert all(mf.flushed == mf.wrote for mf in queue.files)
    flog.close()
    again = open_log(d)
    assert again.write_pos == mlog.write_pos
    assert [again.get(i) for i in range(mlog.end_index + 1)] == [
        mlog.get(i) for i in range(mlog.end_index + 1)
    ]
    again.close()


def test_a_truncate_does_not_wait_for_a_flush_stuck_in_its_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower meeting a new leader truncates on the loop's thread: a flush whose fdatasync
    hangs on a slow disk must not hold it up, and must not then claim the cut bytes flushed."""
    d = tmp_path / "dl"
    flog = open_log(d)
    for n in range(12):
        flog.append(1, body(n, 200))  # several data files
    in_sync, go_on = threading.Event(), threading.Event()
    real = os.fdatasync

    def stuck(fd: int) -> None:
        in_sync.set()
        go_on.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", stuck)
    t = threading.Thread(target=flog.flush)
    t.start()
    # a truncate that waited for the sync would return only once this timer let it go on
    timer = threading.Timer(5.0, go_on.set)
    timer.start()
    try:
        assert in_sync.wait(10)
        flog.truncate(5)
        assert not go_on.is_set(), "the truncate waited for the flush's fdatasync"
    finally:
        go_on.set()
        timer.cancel()
        t.join()
    monkeypatch.setattr(os, "fdatasync", real)
    # the flush that the cut overlapped recorded nothing: entry 4 is not yet known on disk
    assert not flog.on_disk(4)
    flog.flush()
    assert flog.on_disk(4) and flog.end_index == 4
    for queue in (flog.data, flog.index):
        assert all(mf.flushed == mf.wrote for mf in queue.files)
    flog.close()
    again = open_log(d)
    got = again.get(4)
    assert again.end_index == 4 and got is not None and got.body == body(4, 200)
    again.close()


@pytest.mark.parametrize("damage", ["half_unit", "no_unit", "header", "body_length", "data_file"])
def test_recovery_cuts_a_torn_last_entry(tmp_path: Path, damage: str) -> None:
    d = tmp_path / "dl"
    flog = open_log(d)
    written = [flog.append(1, body(i, 120)) for i in range(7)]  # entry 6 opens the second file
    last = written[-1]
    assert last.pos == DATA
    flog.close()
    index_file = d / "index" / f"{0:020d}"
    data_file = d / "data" / f"{DATA:020d}"
    at = last.pos % DATA
    if damage == "half_unit":  # a unit cut after its size: index and term missing
        raw = bytearray(index_file.read_bytes())
        raw[6 * 32 + 16 : 7 * 32] = bytes(16)
        index_file.write_bytes(bytes(raw))
    elif damage == "no_unit":  # the entry's bytes were written, its unit never was
        raw = bytearray(index_file.read_bytes())
        raw[6 * 32 : 7 * 32] = bytes(32)
        index_file.write_bytes(bytes(raw))
    elif damage == "header":  # the unit is there, the entry's header half written
        raw = bytearray(data_file.read_bytes())
        raw[at + 20 : at + 48] = bytes(28)
        data_file.write_bytes(bytes(raw))
    elif damage == "body_length":  # the header's body length disagrees with the unit's size
        raw = bytearray(data_file.read_bytes())
        struct.pack_into(">i", raw, at + 44, 60)
        data_file.write_bytes(bytes(raw))
    else:  # the new data file was never created
        data_file.unlink()
    again = open_log(d)
    assert again.end_index == 5 and again.end_term == 1
    assert [again.get(i) for i in range(6)] == written[:6]
    assert again.get(6) is None
    # cut as a truncate would: the blank before entry 6 and its file are gone, no unit left
    assert again.write_pos == written[5].pos + written[5].size
    assert names(d / "data") == [f"{0:020d}"]
    assert index_file.read_bytes()[6 * 32 :] == bytes(INDEX - 6 * 32)
    data0 = (d / "data" / f"{0:020d}").read_bytes()
    assert data0[again.write_pos :] == bytes(DATA - again.write_pos)
    assert again.append(2, b"new").index == 6
    again.close()


def test_recovery_of_a_log_whose_only_entry_is_torn(tmp_path: Path) -> None:
    d = tmp_path / "dl"
    flog = open_log(d)
    flog.append(1, body(1, 30))
    flog.close()
    data_file = d / "data" / f"{0:020d}"
    raw = bytearray(data_file.read_bytes())
    raw[0:4] = bytes(4)
    data_file.write_bytes(bytes(raw))
    again = open_log(d)
    assert (again.end_index, again.write_pos) == (-1, 0)
    assert data_file.read_bytes() == bytes(DATA)
    assert again.append(2, b"x").pos == 0
    again.close()


WRITER = textwrap.dedent(
    """
    import sys
    from broker.dledger.driver.mmap_file_store import open_file_log
    flog = open_file_log(sys.argv[1], data_file_size=4096, index_file_size=32 * 64)
    i = flog.end_index + 1
    while True:
        flog.append(1, bytes([i % 251]) * (i % 300))
        if i % 50 == 0:
            print(i, flush=True)  # entries up to i were appended (in the page cache)
        i += 1
    """
)


def test_recovery_after_sigkill_mid_write(tmp_path: Path) -> None:
    """Every append that returned before the kill is there, whole, after it."""
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
        assert proc.stdout is not None
        acked = -1
        try:
            for _ in range(20 + 10 * k):  # a different moment each round, files rolled over
                acked = int(proc.stdout.readline())
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
        flog = open_file_log(str(d), data_file_size=4096, index_file_size=32 * 64)
        assert flog.end_index >= acked
        for i in range(flog.end_index + 1):
            e = flog.get(i)
            assert e is not None and e.body == bytes([i % 251]) * (i % 300)
        ends.append(flog.end_index)
        flog.close()
    assert ends == sorted(ends)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 600)),
        st.tuples(st.just("truncate"), st.integers(0, 40)),
        st.tuples(st.just("reopen"), st.just(0)),
        st.tuples(st.just("reset"), st.integers(0, 40)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_file_log_behaves_as_the_memory_log(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]]
) -> None:
    d = tmp_path_factory.mktemp("dl")
    flog = open_log(d)
    mlog = MemoryLog(file_size=DATA)
    term = 1
    try:
        for op, n in ops:
            if op == "append":
                term += n % 2
                assert flog.append(term, body(n, n)) == mlog.append(term, body(n, n))
            elif op == "truncate":
                if 0 < mlog.begin_index and n <= mlog.begin_index:
                    continue  # the core never cuts a log's head (entry_handler.py)
                flog.truncate(n)
                mlog.truncate(n)
            elif op == "reset":
                term += 1
                first = Entry(mlog.end_index + 1 + n, term, DATA * (n % 9), body(n, n * 3))
                flog.reset(first)
                mlog.reset(first)
            else:
                flog.close()
                flog = open_log(d)
            assert (flog.begin_index, flog.end_index, flog.end_term, flog.write_pos) == (
                mlog.begin_index,
                mlog.end_index,
                mlog.end_term,
                mlog.write_pos,
            )
        assert [flog.get(i) for i in range(mlog.end_index + 1)] == [
            mlog.get(i) for i in range(mlog.end_index + 1)
        ]
        assert [flog.term_at(i) for i in range(-1, mlog.end_index + 2)] == [
            mlog.term_at(i) for i in range(-1, mlog.end_index + 2)
        ]
    finally:
        flog.close()


def test_recent_entries_cache_agrees_with_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries still in the in-memory cache and entries only in the files read back the same,
    across a truncate (the cut entries leave the cache) and a reopen (an empty cache)."""
    from broker.dledger.driver import mmap_file_store

    monkeypatch.setattr(mmap_file_store, "RECENT_ENTRIES", 8)
    flog = open_log(tmp_path)
    written = [flog.append(1, body(i, 100 + 37 * i % 300)) for i in range(40)]
    assert [flog.get(i) for i in range(40)] == written
    assert len(flog._recent) == 8
    flog.truncate(36)
    assert flog.get(36) is None and flog.get(39) is None
    written[36:] = [flog.append(2, body(100 + i, 50)) for i in range(6)]
    assert [flog.get(i) for i in range(42)] == written
    flog.close()
    again = open_log(tmp_path)
    assert [again.get(i) for i in range(42)] == written
    again.close()


# --- reset (a follower the leader's retention left behind) ---------------------------------


def reset_entry(index: int = 100, file_no: int = 7) -> Entry:
    return Entry(index, 5, DATA * file_no, b"R" * 300)


def test_reset_leaves_only_the_new_files_and_reopens_the_same(tmp_path: Path) -> None:
    d = tmp_path / "dl"
    flog = open_log(d)
    for i in range(40):
        flog.append(1 + i // 20, body(i, 200))
    first = reset_entry()
    flog.reset(first)
    nxt = flog.append(6, body(1, 100))
    flog.flush()
    assert names(d / "data") == [f"{7 * DATA:020d}"]
    assert names(d / "index") == [f"{100 * 32 - 100 * 32 % INDEX:020d}"]
    flog.close()
    flog = open_log(d)
    try:
        assert (flog.begin_index, flog.end_index, flog.end_term) == (100, 101, 6)
        assert flog.get(100) == first and flog.get(101) == nxt and flog.get(99) is None
        assert flog.write_pos == nxt.pos + nxt.size
        assert flog.append(6, body(2, 10)).index == 102
    finally:
        flog.close()


def test_a_reset_is_durable_when_it_returns(tmp_path: Path) -> None:
    flog = open_log(tmp_path / "dl")
    try:
        flog.append(1, body(0, 10))
        flog.reset(reset_entry())
        assert flog.on_disk(100)
        assert not (tmp_path / "dl" / "index" / RESET_MARKER).exists()
    finally:
        flog.close()


class Crash(BaseException):
    """The process dies here (nothing after it runs)."""


@pytest.mark.parametrize("at_sync", range(1, 7))
def test_a_crash_inside_a_reset_reopens_empty_or_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_sync: int
) -> None:
    """The reset syncs a directory six times: after the marker, after unlinking the data and
    the index files, after creating the new ones, after removing the marker.  A crash before
    the marker is gone reopens an empty log; after, the reset log."""
    d = tmp_path / "dl"
    flog = open_log(d)
    for i in range(40):
        flog.append(1, body(i, 200))
    flog.flush()
    real = mmap_file_store.sync_dir
    calls = []

    def sync_dir(path: str) -> None:
        calls.append(path)
        if len(calls) == at_sync:
            raise Crash
        real(path)

    monkeypatch.setattr(mmap_file_store, "sync_dir", sync_dir)
    with pytest.raises(Crash):
        flog.reset(reset_entry())
    monkeypatch.setattr(mmap_file_store, "sync_dir", real)
    reopened = open_log(d)
    try:
        if at_sync < 6:
            assert (reopened.begin_index, reopened.end_index) == (-1, -1)
            assert names(d / "data") == [] and names(d / "index") == []
        else:
            assert (reopened.begin_index, reopened.end_index) == (100, 100)
            assert reopened.get(100) == reset_entry()
        assert reopened.append(6, body(0, 10)).index == reopened.end_index
    finally:
        reopened.close()
        flog.close()


def test_truncate_and_drop_head_after_a_reset(tmp_path: Path) -> None:
    d = tmp_path / "dl"
    flog = open_log(d)
    try:
        flog.reset(reset_entry(file_no=2))
        for i in range(20):
            flog.append(6, body(i, 300))
        flog.truncate(110)
        assert flog.end_index == 109
        with pytest.raises(ValueError):
            flog.truncate(100)  # its head: the core never asks (entry_handler.py)
        flog.flush()
        dropped = flog.drop_head(105, lambda mf: True)
        assert dropped and 100 < flog.begin_index <= 105
        for mf in dropped:  # the caller unlinks them (log_retention.py)
            os.unlink(mf.path)
        begin = flog.begin_index
        flog.close()
        flog = open_log(d)
        assert (flog.begin_index, flog.end_index) == (begin, 109)
    finally:
        flog.close()


def record(i: int) -> bytes:
    msg = MessageExtBrokerInner(
        topic="Torn",
        queue_id=0,
        body=b"torn-body-%d-" % i + b"x" * 150,
        born_host=("10.0.0.1", 1),
        store_host=("127.0.0.1", 10911),
    )
    return encode_record(msg, i, 0, 1_700_000_000_000 + i)


@pytest.mark.parametrize("fill", ["zero", "garbage"])
@pytest.mark.parametrize("torn", [1, 9, 60])
def test_recovery_cuts_an_entry_whose_record_is_torn_under_a_whole_header(
    tmp_path: Path, fill: str, torn: int
) -> None:
    # a power cut kept the last entry's header and index unit but not the end of its body:
    # DLedger's header has no body CRC, the record's own checks find it (its body CRC, or the
    # zeros a torn write leaves)
    d = tmp_path / "dl"
    flog = open_file_log(
        str(d), data_file_size=4096, index_file_size=INDEX, patch_physical_offset=True
    )
    written = [flog.append(1, record(i)) for i in range(5)]
    flog.close()
    last = written[-1]
    end = last.pos + last.size
    raw = bytearray((d / "data" / f"{0:020d}").read_bytes())
    raw[end - torn : end] = bytes(torn) if fill == "zero" else random.Random(torn).randbytes(torn)
    if raw[end - torn : end] == bytearray(last.body[-torn:]):
        raw[end - 1] ^= 0xFF  # the garbage happened to be the bytes themselves
    (d / "data" / f"{0:020d}").write_bytes(bytes(raw))
    again = open_file_log(
        str(d), data_file_size=4096, index_file_size=INDEX, patch_physical_offset=True
    )
    assert again.end_index == 3
    assert [again.get(i) for i in range(4)] == written[:4]
    assert again.append(2, record(9)).index == 4
    again.close()


def test_recovery_keeps_a_log_of_intact_records(tmp_path: Path) -> None:
    d = tmp_path / "dl"
    flog = open_file_log(
        str(d), data_file_size=4096, index_file_size=INDEX, patch_physical_offset=True
    )
    written = [flog.append(1, record(i)) for i in range(30)]  # several data files
    flog.close()
    again = open_file_log(
        str(d), data_file_size=4096, index_file_size=INDEX, patch_physical_offset=True
    )
    assert again.end_index == 29 and [again.get(i) for i in range(30)] == written
    again.close()
