"""`rmq store verify` on a store in RocketMQ's DLedger layout: one member alone, or two compared.

A store is in that layout when it holds a member directory ``dledger-<selfId>/`` (told from
the files by ``dledger_commitlog.find_dledger_store``): an Apache RocketMQ 4.9 DLedger store, a
classic store switched to DLedger (its CommitLog files below ``dividedCommitlogOffset``), ours.
Everything is read through ``broker/dledger/broker/dledger_commitlog.py`` (read-only maps), by
the rules RocketMQ's ``DLedgerCommitLog`` reads with.

Checks on one member (:func:`check_member`), each problem named by where it is:

* the data files walk as DLedger's recovery walks them: every entry's header valid at the
  position it was read (magic, size, pos), indexes consecutive, terms not decreasing, each
  index unit equal to its entry (``open_dledger_commitlog`` refuses the first that is not; a
  torn entry, even a last one a crash left half-written, is reported: it is what recovery
  would truncate);
* every entry's body is a CommitLog record (or a leader's no-op) whose PHYSICALOFFSET is the
  entry's pos + 48, whose TOTALSIZE is the body's length and whose BODYCRC matches its body;
* the classic CommitLog below ``dividedCommitlogOffset``: each record's PHYSICALOFFSET is its
  offset and its BODYCRC matches;
* every ConsumeQueue unit (``consumequeue/<topic>/<queueId>/``) below the committed position
  points at a record of its topic, queue and queue offset, of the unit's size.  Units past the
  committed position (the checkpoint's ``committedIndex`` is flushed after the reput ran; a
  restart truncates them) must still point at an entry's record and are counted, not failed;
  units below the log's first file (retention deleted it) are counted as expired.

Two members (the first as the reference, "master"): each is checked, then over the entry
indexes both hold, every entry must be the same (term, pos, size, body) and the classic
records the same; the second holding entries past the first's end is "ahead".  Exit codes as
the classic comparison: 0 consistent, 2 damage / a difference / the second ahead, 1 an error.
"""

from __future__ import annotations

import bisect
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import attrs

from broker.dledger.broker.dledger_commitlog import (
    DLedgerCommitLogReader,
    DLedgerStoreError,
    DLedgerStorePaths,
    open_dledger_commitlog,
)
from broker.dledger.driver import entry_coder as ec
from broker.dledger.driver.state_files import StateFileError
from common.message import MessageExt, RecordDecodeError, decode_record

__all__ = ["MemberCheck", "PairCheck", "check_member", "check_pair"]

# problems listed per member: the count is exact, the list bounded (a wrecked store would
# otherwise print one line per entry)
MAX_PROBLEMS = 20
_CQ_UNIT = struct.Struct(">qiq")  # ConsumeQueue.putMessagePositionInfo: offset, size, tagsCode
_BLANK_UNIT = (0, 0x7FFFFFFF)  # ConsumeQueue.fillPreBlank


@attrs.define
class MemberCheck:
    """What was checked in one member's store, and what was wrong."""

    path: str
    member: str
    divided_commitlog_offset: int = 0
    begin_index: int = -1
    end_index: int = -1
    committed_index: int = -1
    committed_pos: int = 0
    entries: int = 0
    records: int = 0
    noops: int = 0
    classic_records: int = 0
    queue_units: int = 0
    units_past_commit: int = 0
    units_expired: int = 0
    problems: list[str] = attrs.field(factory=list)
    problem_count: int = 0

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    def line(self) -> str:
        if not self.ok:
            more = self.problem_count - len(self.problems)
            tail = f" (first {len(self.problems)} listed, {more} more)" if more else ""
            return f"DAMAGED: {self.path}: {self.problem_count} problem(s){tail}"
        extra = ""
        if self.units_past_commit:
            extra += f", {self.units_past_commit} queue units past the committed position"
        if self.units_expired:
            extra += f", {self.units_expired} expired queue units"
        return (
            f"OK: {self.path} (DLedger member {self.member}): {self.entries} entries "
            f"({self.records} records, {self.noops} no-ops, committed up to index "
            f"{self.committed_index}), {self.classic_records} classic records below "
            f"dividedCommitlogOffset {self.divided_commitlog_offset}, {self.queue_units} "
            f"queue units checked{extra}"
        )

    def to_json(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["ok"] = self.ok
        out["summary"] = self.line()
        return out


def _check_record(check: MemberCheck, where: str, body: bytes, offset: int) -> MessageExt | None:
    try:
        msg = decode_record(body, 0)
    except RecordDecodeError as exc:
        check.problem(f"{where}: not a CommitLog record ({exc})")
        return None
    if msg.store_size != len(body):
        check.problem(f"{where}: TOTALSIZE {msg.store_size}, the body is {len(body)} bytes")
    if msg.commit_log_offset != offset:
        check.problem(
            f"{where}: PHYSICALOFFSET {msg.commit_log_offset}, not its offset {offset}"
            + (" (entry pos + 48)" if where.startswith("entry") else "")
        )
    if zlib.crc32(msg.body) & 0x7FFFFFFF != msg.body_crc:
        check.problem(f"{where}: BODYCRC {msg.body_crc} does not match its body")
    return msg


def _check_entries(check: MemberCheck, reader: DLedgerCommitLogReader) -> None:
    for entry in reader.entries:
        body = reader.entry_body(entry)
        if ec.is_noop_body(body):
            check.noops += 1
            continue
        where = f"entry {entry.entry_index} at pos {entry.pos}"
        if _check_record(check, where, body, entry.physical_offset) is not None:
            check.records += 1


def _check_classic(check: MemberCheck, reader: DLedgerCommitLogReader) -> None:
    try:
        for msg in reader.classic_messages():
            check.classic_records += 1
            if zlib.crc32(msg.body) & 0x7FFFFFFF != msg.body_crc:
                check.problem(
                    f"classic record at offset {msg.commit_log_offset}: BODYCRC "
                    f"{msg.body_crc} does not match its body"
                )
    except DLedgerStoreError as exc:
        check.problem(f"classic CommitLog: {exc}")


def _queue_files(directory: Path) -> list[tuple[int, Path]]:
    files = [(int(p.name), p) for p in directory.iterdir() if p.is_file() and len(p.name) == 20]
    return sorted(f for f in files if f[1].name.isdigit())


def _check_queue(
    check: MemberCheck,
    reader: DLedgerCommitLogReader,
    topic: str,
    queue_id: int,
    directory: Path,
    entry_records: list[int],
) -> None:
    name = f"consumequeue {topic}/{queue_id}"
    for start, path in _queue_files(directory):
        data = path.read_bytes()
        for at in range(0, len(data) - _CQ_UNIT.size + 1, _CQ_UNIT.size):
            phys, size, _tags = _CQ_UNIT.unpack_from(data, at)
            if (phys, size) == _BLANK_UNIT:
                continue
            if phys == 0 and size == 0:
                break  # the queue's end in this file
            qoff = (start + at) // _CQ_UNIT.size
            where = f"{name} unit at queue offset {qoff} (offset {phys}, {size} bytes)"
            check.queue_units += 1
            if size <= 0 or phys < 0:
                check.problem(f"{where}: not a unit")
                continue
            if phys < reader.min_offset:
                check.units_expired += 1
                continue
            if phys + size > reader.committed_pos:
                i = bisect.bisect_left(entry_records, phys)
                if i < len(entry_records) and entry_records[i] == phys:
                    check.units_past_commit += 1
                else:
                    check.problem(f"{where}: past the committed position, at no entry's record")
                continue
            try:
                msg = reader.message_at(phys)
            except DLedgerStoreError as exc:
                check.problem(f"{where}: points at no record ({exc})")
                continue
            got = (msg.topic, msg.queue_id, msg.queue_offset, msg.store_size)
            if got != (topic, queue_id, qoff, size):
                check.problem(
                    f"{where}: the record there is {msg.topic}/{msg.queue_id} at queue offset "
                    f"{msg.queue_offset}, {msg.store_size} bytes"
                )


def _check_queues(check: MemberCheck, reader: DLedgerCommitLogReader) -> None:
    root = Path(reader.paths.consume_queue_dir)
    if not root.is_dir():
        return
    entry_records = [e.physical_offset for e in reader.entries]
    for topic_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for queue_dir in sorted(p for p in topic_dir.iterdir() if p.is_dir()):
            if not queue_dir.name.isdigit():
                continue
            _check_queue(
                check, reader, topic_dir.name, int(queue_dir.name), queue_dir, entry_records
            )


def open_member(paths: DLedgerStorePaths, check: MemberCheck) -> DLedgerCommitLogReader | None:
    """Open the member for a check; the walk's refusal is the check's first problem."""
    try:
        return open_dledger_commitlog(paths)
    except DLedgerStoreError as exc:
        check.problem(f"DLedger log: {exc}")
    except StateFileError as exc:  # currterm or checkpoint: not key=value lines
        check.problem(f"DLedger state file: {exc}")
    except OSError as exc:
        check.problem(f"cannot read {exc.filename or paths.member_dir}: {exc.strerror or exc}")
    return None


def _fill(check: MemberCheck, reader: DLedgerCommitLogReader) -> None:
    check.divided_commitlog_offset = reader.divided_commitlog_offset
    check.begin_index = reader.begin_index
    check.end_index = reader.end_index
    check.committed_index = reader.committed_index
    check.committed_pos = reader.committed_pos
    check.entries = len(reader.entries)
    if not reader.entries and os.path.isdir(reader.paths.index_dir):
        if not os.path.isdir(reader.paths.data_dir):
            check.problem(
                f"no DLedger data files in {reader.paths.data_dir}, but an index: is "
                "storePathDLedgerCommitLog elsewhere?"
            )
    _check_entries(check, reader)
    _check_classic(check, reader)
    _check_queues(check, reader)


def check_member(path: str | os.PathLike[str], paths: DLedgerStorePaths) -> MemberCheck:
    """Every check of the module doc on one member's store."""
    check = MemberCheck(str(path), paths.self_id)
    reader = open_member(paths, check)
    if reader is not None:
        try:
            _fill(check, reader)
        finally:
            reader.close()
    return check


@attrs.frozen
class PairCheck:
    """Two members: each one's check, then the comparison of what both hold."""

    master: MemberCheck
    slave: MemberCheck
    compared_entries: int
    first_difference: str | None

    @property
    def ok(self) -> bool:
        return (
            self.master.ok
            and self.slave.ok
            and self.first_difference is None
            and self.slave.end_index <= self.master.end_index
        )

    def lines(self) -> list[str]:
        out = []
        for side in (self.master, self.slave):
            if not side.ok:
                out.append(side.line())
                out += [f"  {p}" for p in side.problems]
        if self.first_difference is not None:
            out.append(f"DIFFERENT {self.first_difference}")
        elif self.master.ok and self.slave.ok and self.slave.end_index > self.master.end_index:
            out.append(
                f"slave is AHEAD of master: slave ends at entry {self.slave.end_index}, "
                f"master at entry {self.master.end_index}"
            )
        if not out:
            lag = self.master.end_index - self.slave.end_index
            out.append(
                f"OK: both DLedger stores are consistent and the slave's entries are the "
                f"master's ({self.compared_entries} entries compared, slave {lag} entries behind)"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "layout": "dledger",
            "master": self.master.to_json(),
            "slave": self.slave.to_json(),
            "comparedEntries": self.compared_entries,
            "firstDifference": self.first_difference,
            "summary": self.lines()[0],
        }


def _compare(a: DLedgerCommitLogReader, b: DLedgerCommitLogReader) -> tuple[int, str | None]:
    """Entries both hold must be the same; so must the classic records below the division."""
    if a.divided_commitlog_offset != b.divided_commitlog_offset:
        return 0, (
            f"at the division: dividedCommitlogOffset {a.divided_commitlog_offset} (master), "
            f"{b.divided_commitlog_offset} (slave)"
        )
    compared = 0
    for ma, mb in zip(a.classic_messages(), b.classic_messages(), strict=False):
        if (ma.commit_log_offset, ma.store_size, ma.body_crc, ma.body) != (
            mb.commit_log_offset,
            mb.store_size,
            mb.body_crc,
            mb.body,
        ):
            return 0, f"at offset {ma.commit_log_offset}: the classic records differ"
    lo = max(a.begin_index, b.begin_index)
    hi = min(a.end_index, b.end_index)
    for index in range(lo, hi + 1):
        ea, eb = a.entry(index), b.entry(index)
        if ea is None or eb is None:
            continue
        if (ea.term, ea.pos, ea.size) != (eb.term, eb.pos, eb.size):
            return compared, (
                f"at entry {index}: term/pos/size {ea.term}/{ea.pos}/{ea.size} (master), "
                f"{eb.term}/{eb.pos}/{eb.size} (slave)"
            )
        body_a, body_b = a.entry_body(ea), b.entry_body(eb)
        if body_a != body_b:
            k = next(i for i in range(len(body_a)) if body_a[i] != body_b[i])
            return compared, (
                f"at entry {index} (offset {ea.pos + ec.BODY_OFFSET + k}): bytes differ "
                f"inside the record at {ea.physical_offset}"
            )
        compared += 1
    return compared, None


def check_pair(
    master_path: str | os.PathLike[str],
    master: DLedgerStorePaths,
    slave_path: str | os.PathLike[str],
    slave: DLedgerStorePaths,
) -> PairCheck:
    mcheck = MemberCheck(str(master_path), master.self_id)
    scheck = MemberCheck(str(slave_path), slave.self_id)
    a = open_member(master, mcheck)
    b = open_member(slave, scheck)
    try:
        compared, difference = 0, None
        if a is not None:
            _fill(mcheck, a)
        if b is not None:
            _fill(scheck, b)
        if a is not None and b is not None and mcheck.ok and scheck.ok:
            compared, difference = _compare(a, b)
        return PairCheck(mcheck, scheck, compared, difference)
    finally:
        for reader in (a, b):
            if reader is not None:
                reader.close()
