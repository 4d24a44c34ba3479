"""``ConsumeQueue.put_tail_unit`` (a single send's unit, packed at the segment's cursor) writes
the same files as ``put_tail`` of the packed unit: same bytes, same segments, same refusals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.store.consumequeue import CQ_UNIT, CQ_UNIT_SIZE, ConsumeQueue

# 3 units per segment: every fourth put rolls a new segment
FILE_SIZE = 3 * CQ_UNIT_SIZE


def _files(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


@pytest.mark.timeout(30)
def test_put_tail_unit_writes_what_put_tail_writes(tmp_path: Path) -> None:
    fast = ConsumeQueue(str(tmp_path / "fast"), "T", 0, FILE_SIZE)
    slow = ConsumeQueue(str(tmp_path / "slow"), "T", 0, FILE_SIZE)
    # no segment yet: both refuse (the caller then uses put), and put creates the first one
    assert not fast.put_tail_unit(0, 100, 10, 7)
    assert not slow.put_tail(0, CQ_UNIT.pack(100, 10, 7))
    assert fast.put(100, 10, 7, 0) and slow.put(100, 10, 7, 0)
    for q in range(1, 10):
        unit = (100 + 64 * q, 64, -q if q % 2 else 2**40 + q)
        assert fast.put_tail_unit(q, *unit)
        assert slow.put_tail(q, CQ_UNIT.pack(*unit))
        assert fast.max_offset == slow.max_offset == q + 1
    # not the queue's end (a gap, or a unit already there): refused, nothing written
    assert not fast.put_tail_unit(12, 1, 1, 1) and not slow.put_tail(12, CQ_UNIT.pack(1, 1, 1))
    assert not fast.put_tail_unit(5, 1, 1, 1) and not slow.put_tail(5, CQ_UNIT.pack(1, 1, 1))
    assert [fast.unit(q) for q in range(10)] == [slow.unit(q) for q in range(10)]
    # (a shared mapping: the file reads see the mapped writes)
    files = _files(tmp_path / "fast")
    assert len(files) == 4  # 10 units, 3 a segment
    assert files == _files(tmp_path / "slow")
    fast.close()
    slow.close()
