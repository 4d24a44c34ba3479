"""Where the DLedger apply resumes after a restart, and what of it a new leader can take back.

This is the copying apply's (applier.py: the in-memory stores of tests).  The broker writes once
(committed_dispatch.py): there the store's own recovery finds the resume point (the visible end)
and a truncation of the log calls the store back, so no hint files and no pairing walk are
needed; the theory of the unconfirmed prefix below is the same.

Theory of operation
-------------------
**The resume point** (:func:`find_resume_point`).  The hint file ``dledger_applied`` in the
classic store's root holds a pair (index, offset) that was true when written: the classic
CommitLog ended at ``offset`` holding exactly the records of the entries ``<= index``.  A
process crash loses nothing of the classic CommitLog (its files are memory-mapped; recovery
only cuts a torn last record), so its recovered end is at or past ``offset``; resume walks the
classic records from ``offset`` to that end, pairing each with the next non-empty entry after
``index`` and checking they are the same record (every byte but PHYSICALOFFSET).  The last one
paired is the applied index: apply goes on at the next entry, with no record applied twice and
none skipped.

A power cut can leave the plain hint (not fsynced) past what the classic store or the log kept.
Such a hint gives way to the *durable* hint, ``dledger_applied.durable``: a pair log retention
(log_retention.py) wrote with fsync once the classic flush and the log flush had passed it, and
below which alone it deletes log files.  Without either, the classic store is walked from its
start (which must be 0).  The two files are synced by different tasks, so after a power cut the
classic store can also hold records of entries the log lost: the walk stops at the first one
(``cut_from``) and the caller cuts the store back there (broker/store/dirty_files.py) before
anything is applied.  So is the first record that is not the record of the log's entry there,
once the walk matched records before it or started from a hint whose term the log confirms:
after a second power cut the store can keep a new leader's record whose replacement the log
lost.  A store that nothing vouches for and whose first record does not match stops the broker
(``ApplyError``): it is likely another log's store.

**The unconfirmed prefix** (:class:`UnconfirmedPrefix`).  A restarted member's commit index is
learned again from a leader (broker/dledger/driver/node.py).  Until a leader confirms them (the
member's commit index passes them while its log still holds them: an index can be committed again
with another entry in it), the entries applied before the restart are the member's own word: after a
whole-group power cut the other members' logs can lack them, a new leader elected without this
member replaces them, and the member's log takes the replacement.  The applier keeps the points
the resume walk passed (index, term, classic end after it); when the log no longer holds the
newest one (its term there changed), the classic store goes back to the newest point the log
still holds, and apply goes on from there: every member then serves the leader's log.  The
hints carry the term of the entry they name, so one whose entry a leader replaced is not used.
A crash in the moment between the log taking the replacement and the applier cutting the
classic store (it looks at the log every 50 ms while points remain) is met by the next resume
as a record that is not its entry's, past a vouched prefix, and cut then.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
from pathlib import Path
from typing import NamedTuple

import attrs

from broker.dledger.driver.entry_coder import is_noop_body
from broker.dledger.raft.log import RaftLog
from broker.store.api import MessageStore
from common.config_file import atomic_write
from common.message import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE, PHYSICAL_OFFSET_POSITION

log = logging.getLogger(__name__)

__all__ = [
    "DURABLE_SUFFIX",
    "HINT_FILE",
    "ApplyError",
    "Hint",
    "ResumeReport",
    "UnconfirmedPrefix",
    "drop_durable_hint",
    "find_resume_point",
    "read_hint",
    "write_durable_hint",
    "write_hint",
]

HINT_FILE = "dledger_applied"
# the fsynced hint beside it (write_durable_hint)
DURABLE_SUFFIX = ".durable"
_BLANK_HEAD = struct.Struct(">ii")
_PHYS_END = PHYSICAL_OFFSET_POSITION + 8


class ApplyError(RuntimeError):
    """The classic store and the DLedger log disagree (or the store refused a record)."""


# (index, term, classic end after it): a place the apply can go back to
Point = tuple[int, int, int]


@attrs.frozen
class ResumeReport:
    hint_index: int
    hint_offset: int
    # records found after the hint's offset (applied before the restart, paired with entries)
    records_after_hint: int
    applied_index: int
    applied_offset: int
    # where the classic CommitLog holds records of entries the log no longer has (after a power
    # cut): the store must be cut back to it before anything is applied; None when it agrees
    cut_from: int | None = None
    # index -> (term, classic end): the hint and every record paired (UnconfirmedPrefix)
    points: tuple[tuple[int, tuple[int, int]], ...] = ()


class Hint(NamedTuple):
    """A pair the classic store held: its CommitLog ended at ``offset`` with the records of the
    entries ``<= entry``; ``term`` is that entry's (None in a hint written without it)."""

    entry: int
    offset: int
    term: int | None = None


def read_hint(path: str) -> Hint | None:
    try:
        with open(path, "rb") as f:
            obj = json.loads(f.read())
        term = obj.get("appliedTerm")
        return Hint(
            int(obj["appliedIndex"]), int(obj["appliedOffset"]), None if term is None else int(term)
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _hint_json(hint: Hint) -> bytes:
    return json.dumps(
        {"appliedIndex": hint.entry, "appliedOffset": hint.offset, "appliedTerm": hint.term}
    ).encode()


def write_hint(path: str, hint: Hint) -> None:
    """Atomically replace the hint (no fsync: see the module doc)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(_hint_json(hint))
    os.replace(tmp, path)


def write_durable_hint(path: str, hint: Hint) -> None:
    """The durable hint beside ``path``, fsynced (blocking: for a worker thread)."""
    atomic_write(Path(path + DURABLE_SUFFIX), _hint_json(hint))


def drop_durable_hint(path: str) -> None:
    """Remove the durable hint (after a cut it may name records that are gone); blocking."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path + DURABLE_SUFFIX)


def _holds(classic: MessageStore, log_: RaftLog, hint: Hint | None) -> bool:
    """The classic store and the log can both hold ``hint``: its offset within the store, its
    index within the log, and the entry there the one it named (a new leader may have replaced
    it after a whole-group power cut)."""
    if hint is None:
        return False
    if not classic.get_min_phy_offset() <= hint.offset <= classic.get_max_phy_offset():
        return False
    if hint.entry < 0:
        return True
    if not log_.begin_index <= hint.entry <= log_.end_index:
        return False
    return hint.term is None or log_.term_at(hint.entry) == hint.term


def find_resume_point(classic: MessageStore, log_: RaftLog, hint_path: str) -> ResumeReport:
    """Where the apply resumes (module docstring)."""
    end = classic.get_max_phy_offset()
    plain, durable = read_hint(hint_path), read_hint(hint_path + DURABLE_SUFFIX)
    usable = [h for h in (plain, durable) if h is not None and _holds(classic, log_, h)]
    if classic.get_min_phy_offset() == 0:
        usable.append(Hint(-1, 0, -1))
    if not usable:
        raise ApplyError(f"no usable {HINT_FILE} and the classic CommitLog does not start at 0")
    hint = usable[0]
    index, offset = hint.entry, hint.offset
    # every usable hint below the one the walk starts from is a place to go back to as well
    points: dict[int, tuple[int, int]] = {
        h.entry: (log_.term_at(h.entry), h.offset) for h in usable if h.entry <= index
    }
    file_size = classic.config.mapped_file_size_commit_log
    paired = 0
    cut_from: int | None = None
    while offset < end:
        data = classic.get_commit_log_data(offset)
        if data is None or len(data) < 8:
            raise ApplyError(f"classic CommitLog unreadable at {offset} (end {end})")
        size, magic = _BLANK_HEAD.unpack_from(data, 0)
        if magic == BLANK_MAGIC_CODE:
            offset += file_size - offset % file_size
            continue
        if magic != MESSAGE_MAGIC_CODE or size > len(data):
            raise ApplyError(f"classic CommitLog has no record at {offset}")
        nxt = _next_record_entry(log_, index, offset)
        if nxt is None:
            # the classic store outlived the log's tail (a power cut): these records are of
            # entries no log holds now; the caller cuts them
            log.warning(
                "classic records from %d on have no DLedger entry (the log ends at %d): they go",
                offset,
                log_.end_index,
            )
            cut_from = end = offset
            break
        entry = log_.get(nxt)
        assert entry is not None
        if not _same_record(data[:size], entry.body):
            if not paired and (hint.entry < 0 or hint.term is None):
                # nothing vouches for the store against this log: another log's store?
                raise ApplyError(
                    f"classic record at {offset} is not the record of DLedger entry {nxt}"
                )
            # what came before matched (or a hint of the right term vouches for it): the log
            # holds another entry here than the store applied, as after a power cut that kept
            # the store's record of a replacement the log lost; the store follows the log
            log.warning(
                "classic record at %d is not the record of DLedger entry %d: the classic "
                "records from there go",
                offset,
                nxt,
            )
            cut_from = end = offset
            break
        index = nxt
        offset += size
        paired += 1
        points[index] = (entry.term, offset)
    report = ResumeReport(
        hint.entry, hint.offset, paired, index, end, cut_from, tuple(sorted(points.items()))
    )
    log.info(
        "dledger apply resumes after entry %d (classic end %d): hint %s, %d records after it",
        index,
        end,
        hint,
        paired,
    )
    return report


def _next_record_entry(log_: RaftLog, index: int, offset: int) -> int | None:
    """The first entry after ``index`` that is not a no-op; None when the log ends before one."""
    i = index + 1
    if i < log_.begin_index:
        raise ApplyError(
            f"classic record at {offset} follows entry {index}, which the log (from "
            f"{log_.begin_index}) no longer holds"
        )
    while True:
        entry = log_.get(i)
        if entry is None:
            return None
        if not is_noop_body(entry.body):
            return i
        i += 1


def _same_record(stored: memoryview | bytes, body: bytes) -> bool:
    """The classic record is the entry's record: every byte equal but PHYSICALOFFSET."""
    return (
        len(stored) == len(body)
        and stored[:PHYSICAL_OFFSET_POSITION] == body[:PHYSICAL_OFFSET_POSITION]
        and stored[_PHYS_END:] == body[_PHYS_END:]
    )


@attrs.define(eq=False)
class UnconfirmedPrefix:
    """The resume points of entries no leader has confirmed since the restart (module doc)."""

    # index -> (term, classic end after it)
    points: dict[int, tuple[int, int]]

    def confirmed_by(self, committed_index: int) -> bool:
        """True (and forgotten) once the commit index passed every point; only to be asked
        when ``cut_point`` found the log still holding them (an index can be committed again
        with another entry in it)."""
        if self.points and committed_index >= max(self.points):
            self.points.clear()
        return not self.points

    def cut_point(self, log_: RaftLog) -> tuple[int, int] | None:
        """None while the log holds the newest point's entry (log matching: then all of
        them); else the newest point it still holds, (index, classic end)."""
        newest = max(self.points)
        if newest < 0 or log_.term_at(newest) == self.points[newest][0]:
            return None
        for index in sorted(self.points, reverse=True):
            term, offset = self.points[index]
            if index < 0 or log_.term_at(index) == term:
                return index, offset
        raise ApplyError(f"the log replaced every entry applied since {min(self.points)}")

    def drop_above(self, index: int) -> None:
        for i in [i for i in self.points if i > index]:
            del self.points[i]
