"""`rmq store verify`: is a slave's CommitLog a byte-identical prefix of its master's?

Both logs are walked segment by segment with ``broker.store.commitlog_scan.scan_segment``
(pure: record starts and why each segment ends).  Over the offsets both sides hold (from the
later of their first segments to the earlier of their valid ends) the record starts must be the
same and the bytes identical; the first difference is reported with its absolute offset.  The
side with the larger valid end is "ahead".  A slave is healthy when it has no difference and is
not ahead of its master (it may lag).
"""

from __future__ import annotations

import mmap
import os
import re
from pathlib import Path

import attrs

from broker.store.commitlog_scan import ScanEnd, scan_segment

_SEGMENT = re.compile(r"^\d{20}$")


class VerifyError(ValueError):
    """A path that is not a store (the message names it)."""


@attrs.frozen
class LogSummary:
    path: str
    first_offset: int
    end_offset: int  # valid end: after the last complete record
    records: int
    torn: str = ""  # why the last segment ended early, when it was torn


@attrs.frozen
class VerifyResult:
    master: LogSummary
    slave: LogSummary
    compared_from: int
    compared_to: int
    common_records: int
    first_difference: int | None
    detail: str

    @property
    def ok(self) -> bool:
        return self.first_difference is None and self.slave.end_offset <= self.master.end_offset

    @property
    def ahead(self) -> str:
        m, s = self.master.end_offset, self.slave.end_offset
        return "master" if m > s else "slave" if s > m else "neither"

    def line(self) -> str:
        if self.first_difference is not None:
            return f"DIFFERENT at offset {self.first_difference}: {self.detail}"
        if not self.ok:
            return (
                f"slave is AHEAD of master: slave ends at {self.slave.end_offset}, "
                f"master at {self.master.end_offset}"
            )
        lag = self.master.end_offset - self.slave.end_offset
        return (
            f"OK: slave is a byte-identical prefix of master ({self.common_records} records "
            f"compared, slave {lag} bytes behind)"
        )

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "ahead": self.ahead,
            "master": attrs.asdict(self.master),
            "slave": attrs.asdict(self.slave),
            "comparedFrom": self.compared_from,
            "comparedTo": self.compared_to,
            "commonRecords": self.common_records,
            "firstDifference": self.first_difference,
            "detail": self.detail,
            "summary": self.line(),
        }


def _segments(path: str | os.PathLike[str]) -> list[tuple[Path, int]]:
    p = Path(path)
    d = p / "commitlog" if (p / "commitlog").is_dir() else p
    if not d.is_dir():
        raise VerifyError(f"{str(p)!r} is not a store directory (no commitlog/)")
    try:
        segs = [(e, int(e.name)) for e in d.iterdir() if e.is_file() and _SEGMENT.match(e.name)]
    except OSError as exc:
        raise VerifyError(f"cannot read {str(d)!r}: {exc.strerror or exc}") from None
    if not segs and d == p and p.name != "commitlog":
        # an empty commitlog/ is an empty store; any other directory without one segment
        # file is a wrong path, not a store that happens to hold nothing
        raise VerifyError(f"{str(p)!r} is not a store directory (no commitlog/)")
    return sorted(segs, key=lambda t: t[1])


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return bytes(mm)


def _scan_log(
    path: str | os.PathLike[str],
) -> tuple[LogSummary, dict[int, tuple[bytes, list[int], int, str]]]:
    """Per segment: (bytes, record starts, valid end position); summary of the whole log."""
    segs = _segments(path)
    out: dict[int, tuple[bytes, list[int], int, str]] = {}
    records = 0
    end = segs[0][1] if segs else 0
    torn = ""
    for file, base in segs:
        try:
            data = _read(file)
        except OSError as exc:
            raise VerifyError(f"cannot read {str(file)!r}: {exc.strerror or exc}") from None
        scan = scan_segment(data, base)
        out[base] = (
            data,
            scan.starts.tolist(),
            scan.end,
            scan.detail if scan.reason is ScanEnd.TORN else "",
        )
        records += scan.count
        if scan.count or scan.reason is ScanEnd.BLANK:
            end = scan.end_offset
        if scan.reason is ScanEnd.TORN:
            torn = f"segment {file.name}: {scan.detail}"
        if scan.reason is not ScanEnd.BLANK:
            break  # the log's valid end: later files hold nothing valid
    first = segs[0][1] if segs else 0
    return LogSummary(str(path), first, end, records, torn), out


def verify(master_dir: str | os.PathLike[str], slave_dir: str | os.PathLike[str]) -> VerifyResult:
    master, msegs = _scan_log(master_dir)
    slave, ssegs = _scan_log(slave_dir)
    lo = max(master.first_offset, slave.first_offset)
    hi = min(master.end_offset, slave.end_offset)
    common = 0
    for base in sorted(set(msegs) & set(ssegs)):
        mdata, mstarts, mend, mtorn = msegs[base]
        sdata, sstarts, send, storn = ssegs[base]
        upto = min(mend, send)
        ms = [s for s in mstarts if s < upto]
        ss = [s for s in sstarts if s < upto]
        for a, b in zip(ms, ss, strict=False):
            if a != b:
                pos = min(a, b)
                return VerifyResult(
                    master,
                    slave,
                    lo,
                    hi,
                    common,
                    base + pos,
                    f"record starts differ (master {base + a}, slave {base + b})",
                )
            size = int.from_bytes(mdata[a : a + 4], "big")
            if mdata[a : a + size] != sdata[a : a + size]:
                diff = next(i for i in range(size) if mdata[a + i] != sdata[a + i])
                return VerifyResult(
                    master,
                    slave,
                    lo,
                    hi,
                    common,
                    base + a + diff,
                    f"bytes differ inside the record at {base + a}",
                )
            common += 1
        if len(ms) != len(ss):
            pos = ms[len(ss)] if len(ms) > len(ss) else ss[len(ms)]
            return VerifyResult(
                master,
                slave,
                lo,
                hi,
                common,
                base + pos,
                "one side has a record the other lacks before its end",
            )
        # a side whose segment is torn where the other still has records differs there
        if storn and mend > send:
            return VerifyResult(
                master, slave, lo, hi, common, base + send, f"slave's log is torn there ({storn})"
            )
        if mtorn and send > mend:
            return VerifyResult(
                master, slave, lo, hi, common, base + mend, f"master's log is torn there ({mtorn})"
            )
    return VerifyResult(master, slave, lo, hi, common, None, "")
