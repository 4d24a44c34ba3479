"""Retention of the DLedger log's own files: ``FileLog.drop_head`` (what may go, what the log
looks like after, and after a reopen) and ``LogRetention`` (RocketMQ's DLedger rules on a fake
clock: deleteWhen, the disk ratios, fileReservedTime + 1 hours, the durable apply hint, the
followers' match indexes)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from broker.dledger.broker import log_retention
from broker.dledger.broker.apply_resume import Hint
from broker.dledger.broker.log_retention import LogRetention
from broker.dledger.driver.mmap_file_store import FileLog, open_file_log
from broker.dledger.raft.log import MemoryLog
from broker.dledger.raft.member_state import HardState
from broker.dledger.raft.messages import PushEntryRequest, PushType, Role
from broker.store.config import MessageStoreConfig
from tests.broker.dledger.core_harness import Cluster, core

DATA = 1024
INDEX = 32 * 8
BODY = 200  # 248 bytes an entry: 4 to a data file
HOUR_MS = 3600 * 1000


def open_log(d: Path) -> FileLog:
    return open_file_log(str(d), data_file_size=DATA, index_file_size=INDEX)


def filled(d: Path, n: int = 40) -> FileLog:
    flog = open_log(d)
    for i in range(n):
        flog.append(1 + i // 10, bytes([i]) * BODY)
    flog.flush()
    return flog


def always(_mf: object) -> bool:
    return True


def files(d: Path) -> tuple[int, int]:
    return len(os.listdir(d / "data")), len(os.listdir(d / "index"))


def test_drop_head_moves_the_begin_to_a_file_start_and_a_reopen_finds_it(tmp_path: Path) -> None:
    d = tmp_path / "dl"
    flog = filled(d)
    assert files(d) == (10, 5) and flog.begin_index == 0
    dropped = flog.drop_head(upto=21, expired=always)
    # files [0-3] .. [16-19] go: the next file's first entry (20) is at most 21
    assert len([f for f in dropped if "data" in f.path]) == 5
    assert flog.begin_index == 20 and flog.end_index == 39
    for mf in dropped:
        os.unlink(mf.path)
    assert files(d) == (5, 3)  # index files of entries 0-7 and 8-15 went with them
    assert flog.get(19) is None and flog.term_at(19) == -1
    twentieth = flog.get(20)
    assert twentieth is not None and twentieth.body == bytes([20]) * BODY
    kept = [flog.get(i) for i in range(20, 40)]
    flog.close()
    again = open_log(d)
    assert (again.begin_index, again.end_index, again.end_term) == (20, 39, 4)
    assert [again.get(i) for i in range(20, 40)] == kept
    assert again.get(19) is None
    # it goes on appending where it was
    assert again.append(5, b"x").index == 40


def test_drop_head_keeps_the_last_file_unflushed_bytes_and_unexpired_files(
    tmp_path: Path,
) -> None:
    flog = filled(tmp_path / "dl")
    assert flog.drop_head(upto=1000, expired=lambda mf: False) == []
    assert flog.drop_head(upto=3, expired=always) == []  # file 1 starts at entry 4
    # the first file may go only if it is expired: the oldest one that must stay ends the round
    first = flog.data.files[0]
    assert flog.drop_head(upto=1000, expired=lambda mf: mf is not first) == []
    dropped = flog.drop_head(upto=1000, expired=always)
    assert len([f for f in dropped if "data" in f.path]) == 9  # 10 per round at most; not the last
    assert flog.begin_index == 36
    # a new first entry that is not on disk yet keeps its predecessor
    flog2 = open_log(tmp_path / "dl2")
    for i in range(12):
        flog2.append(1, bytes([i]) * BODY)
    flog2.flush()
    for i in range(12, 16):
        flog2.append(1, bytes([i]) * BODY)  # file 3, not flushed
    dropped = flog2.drop_head(upto=1000, expired=always)
    assert len([f for f in dropped if "data" in f.path]) == 2  # data files 0 and 1 only
    assert flog2.begin_index == 8


def test_a_dropped_head_log_recovers_a_torn_tail_and_never_truncates_its_head(
    tmp_path: Path,
) -> None:
    d = tmp_path / "dl"
    flog = filled(d)
    for mf in flog.drop_head(upto=30, expired=always):
        os.unlink(mf.path)
    assert flog.begin_index == 28
    with pytest.raises(ValueError, match="begins at 28"):
        flog.truncate(28)
    flog.truncate(29)
    assert (flog.begin_index, flog.end_index) == (28, 28)
    flog.append(9, b"y" * BODY)
    flog.flush()
    last = flog.get(29)
    assert last is not None
    flog.close()
    # tear entry 29's body: recovery cuts it and keeps the head
    path = d / "data" / sorted(os.listdir(d / "data"))[-1]
    with open(path, "r+b") as f:
        f.seek(last.pos % DATA + 100)
        f.write(b"\0" * 8)
        f.seek(last.pos % DATA + 8)
        f.write(b"\xff" * 8)  # its index field: the header no longer matches the unit
    again = open_log(d)
    assert (again.begin_index, again.end_index) == (28, 28)


# --- the service's rules ---------------------------------------------------------------------


@attrs.define
class FakeNode:
    role: Role = Role.FOLLOWER
    committed_index: int = 1000
    marks: dict[str, int] = attrs.Factory(dict)

    def peer_watermarks(self) -> dict[str, int]:
        return self.marks


@attrs.define
class FakeApplier:
    applied_index: int = 39
    applied_offset: int = 5000
    durable: list[Hint] = attrs.Factory(list)
    cuts: int = 0

    def write_durable_hint(self, hint: Hint) -> None:
        self.durable.append(hint)


def applier_of(ret: LogRetention) -> FakeApplier:
    assert isinstance(ret.applier, FakeApplier)
    return ret.applier


def node_of(ret: LogRetention) -> FakeNode:
    assert isinstance(ret.node, FakeNode)
    return ret.node


def service(
    tmp_path: Path, ratio: float, monkeypatch: pytest.MonkeyPatch, **config: Any
) -> LogRetention:
    monkeypatch.setattr(log_retention, "disk_used_ratio", lambda path: ratio)
    flog = filled(tmp_path / "dl")
    now = time.time() * 1000
    # every file last written 3 h ago: expired for fileReservedTime=1 (kept 1 + 1 hours)
    for mf in flog.data.files:
        os.utime(mf.path, (now / 1000 - 3 * 3600,) * 2)
    hour = time.localtime(now / 1000).tm_hour
    cfg = MessageStoreConfig(
        str(tmp_path), file_reserved_time=1, delete_when=f"{(hour + 12) % 24:02d}", **config
    )
    return LogRetention(flog, FakeNode(), FakeApplier(), cfg, lambda: 10**9, lambda: int(now))


async def test_nothing_goes_before_the_durable_hint_and_then_only_up_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ret = service(tmp_path, 0.80, monkeypatch)  # over diskMaxUsedSpaceRatio (75): due
    applier_of(ret).applied_index = 13
    assert await ret.once() == 0  # first round: (13, 5000) is only a candidate
    assert applier_of(ret).durable == []
    applier_of(ret).applied_index = 30
    assert await ret.once() == 3  # the candidate is flushed: made durable; files of 0-11 go
    assert applier_of(ret).durable == [Hint(13, 5000, 2)]  # entry 13 is of term 2
    assert ret.flog.begin_index == 12


async def test_a_cut_of_the_classic_store_voids_what_retention_took_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ret = service(tmp_path, 0.80, monkeypatch)
    applier_of(ret).applied_index = 30
    node_of(ret).committed_index = 20  # what a leader confirmed: the bound of what goes
    await ret.once()
    await ret.once()
    assert ret.durable.entry == 30 and ret.flog.begin_index == 20
    # the applier cut the store back (apply_resume.py) and removed the durable hint
    applier_of(ret).cuts += 1
    applier_of(ret).applied_index = 25
    assert await ret.once() == 0 and ret.durable.entry == -1
    await ret.once()
    assert ret.durable.entry == 25 and applier_of(ret).durable[-1] == Hint(25, 5000, 3)


async def test_the_classic_flush_gates_the_durable_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ret = service(tmp_path, 0.80, monkeypatch)
    ret.classic_flushed = lambda: 4999
    await ret.once()
    await ret.once()
    assert applier_of(ret).durable == [] and ret.flog.begin_index == 0


async def test_it_is_due_at_delete_when_or_over_the_ratio_and_files_must_be_expired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ret = service(tmp_path, 0.50, monkeypatch)
    await ret.once()
    assert await ret.once() == 0  # neither the hour nor the ratio
    now = ret.clock()
    hours = [time.localtime((now + h * HOUR_MS) / 1000).tm_hour for h in (0, 1)]
    # 3 h old < 3 + 1 hours: nothing expired yet
    ret.config = attrs.evolve(
        ret.config, delete_when=";".join(f"{h:02d}" for h in hours), file_reserved_time=3
    )
    assert await ret.once() == 0
    ret.clock = lambda: now + HOUR_MS + 1000
    assert await ret.once() == 9


async def test_a_leader_keeps_what_a_follower_lacks_unless_the_clean_is_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ret = service(tmp_path, 0.80, monkeypatch, clean_file_forcibly_enable=True)
    node_of(ret).role = Role.LEADER
    node_of(ret).marks = {"n0": 39, "n1": 39, "n2": 9}
    await ret.once()
    assert await ret.once() == 2 and ret.flog.begin_index == 8
    monkeypatch.setattr(log_retention, "disk_used_ratio", lambda path: 0.86)
    assert await ret.once() == 7  # forced: n2 may be stranded (the leader logs it)
    node_of(ret).marks = {"n0": 39, "n1": 39, "n2": -1}
    assert ret.bound(forced=False) == -1


async def test_a_full_disk_deletes_no_unexpired_file_unless_the_clean_is_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for forced in (False, True):
        # the files are 3 h old, kept 72 + 1 hours: none has expired
        ret = service(tmp_path / str(forced), 0.99, monkeypatch, clean_file_forcibly_enable=forced)
        ret.config = attrs.evolve(ret.config, file_reserved_time=72)
        node_of(ret).role = Role.LEADER
        node_of(ret).marks = {"n0": 39, "n1": 39, "n2": 9}
        await ret.once()
        dropped = await ret.once()
        if forced:
            assert dropped > 0 and ret.flog.begin_index > 9  # n2 stranded, as RocketMQ does
            assert "of them unexpired" in caplog.text
        else:
            assert dropped == 0 and ret.flog.begin_index == 0
            assert "unexpired" not in caplog.text


# --- a follower behind the leader's first entry ------------------------------------------------


def stranded_group(lead_log: FileLog, n2_log: MemoryLog) -> tuple[Cluster, dict[str, Any]]:
    """n0 leads on a file log whose head files (entries 0-19) were dropped; n1 holds entries
    0-39 too; n2 is away during the election, then joins with ``n2_log``."""
    twin = MemoryLog(file_size=DATA)
    for i in range(40):
        entry = lead_log.get(i)
        assert entry is not None and twin.append_entry(entry)
    for mf in lead_log.drop_head(upto=21, expired=always):
        os.unlink(mf.path)
    cores = {
        "n0": core("n0", log=lead_log, state=HardState(term=4), committed=39),
        "n1": core("n1", log=twin, state=HardState(term=4), committed=39),
        "n2": core("n2", log=n2_log, state=HardState(term=4)),
    }
    cluster = Cluster(cores, cut={frozenset(("n1", "n0")), frozenset(("n1", "n2"))})
    assert cluster.elect() == "n0"
    cluster.cut.clear()
    cluster.advance(1.0)
    cluster.propose("n0", b"new")
    cluster.advance(1.0)
    assert cores["n1"].log.end_index == cores["n0"].log.end_index  # the quorum goes on
    return cluster, cores


def test_a_follower_behind_the_leaders_first_entry_is_reset_there(tmp_path: Path) -> None:
    """The leader's TRUNCATE at its begin index resets the follower's log there (DLedger's
    rebuild; raft/entry_handler.py, "Reset"); it then takes APPENDs like any follower, and the
    leader never pushes entries it no longer has."""
    lead_log = filled(tmp_path / "dl")
    cluster, cores = stranded_group(lead_log, MemoryLog(file_size=DATA))
    n2 = cores["n2"].log
    assert (n2.begin_index, n2.end_index) == (20, lead_log.end_index)
    assert [n2.get(i) for i in range(20, lead_log.end_index + 1)] == [
        lead_log.get(i) for i in range(20, lead_log.end_index + 1)
    ]
    assert cores["n2"].committed_index == cores["n0"].committed_index
    pushed = [r for s, t, r in cluster.sent if (s, t) == ("n0", "n2")]
    assert all(
        r.entries
        for r in pushed
        if isinstance(r, PushEntryRequest) and r.type is not PushType.COMMIT
    )
    truncates = [
        r for r in pushed if isinstance(r, PushEntryRequest) and r.type is PushType.TRUNCATE
    ]
    assert [r.entries[0].index for r in truncates] == [20]


def test_a_follower_that_cannot_begin_there_is_refused_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A follower whose data files cannot begin at the leader's first entry (another data file
    size) refuses the reset: the leader says so once and keeps retrying at the COMPARE pace."""
    lead_log = filled(tmp_path / "dl")
    first = lead_log.get(20)
    assert first is not None and first.pos % (DATA + 100)
    cluster, cores = stranded_group(lead_log, MemoryLog(file_size=DATA + 100))
    assert cores["n2"].log.end_index == -1
    pushed = [r for s, t, r in cluster.sent if (s, t) == ("n0", "n2")]
    truncates = [
        r for r in pushed if isinstance(r, PushEntryRequest) and r.type is PushType.TRUNCATE
    ]
    assert len(truncates) >= 3 and {r.entries[0].index for r in truncates} == {20}
    stranded = [r for r in caplog.records if "before this log's first entry 20" in r.message]
    assert len(stranded) == 1 and "member n2 ends at entry -1" in stranded[0].message
