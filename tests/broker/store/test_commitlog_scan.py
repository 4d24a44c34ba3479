"""scan_segment / resync over hand-built segments: every way a segment ends."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store import commitlog_scan
from broker.store.commitlog_scan import ScanEnd, resync, scan_segment
from common.message import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE, MessageExtBrokerInner
from common.message_encoder import encode_record

FROM = 1 << 20  # the segment's first physical offset


def segment(bodies, *, file_size=None, blank=False):
    """Records at their true physical offsets, then BLANK filler or zeros up to file_size."""
    buf = bytearray()
    starts = []
    for i, body in enumerate(bodies):
        starts.append(len(buf))
        m = MessageExtBrokerInner(topic="T", queue_id=0, body=body)
        buf += encode_record(m, i, FROM + len(buf), 1)
    if file_size is not None:
        rem = file_size - len(buf)
        if blank:
            buf += rem.to_bytes(4, "big") + BLANK_MAGIC_CODE.to_bytes(4, "big", signed=True)
            buf += bytes(rem - 8)
        else:
            buf += bytes(rem)
    return bytes(buf), starts


def test_end_of_file_when_the_last_record_fills_it():
    buf, starts = segment([b"a", b"bb", b""])
    scan = scan_segment(buf, FROM)
    assert scan.reason is ScanEnd.END_OF_FILE and scan.starts.tolist() == starts
    assert scan.end == len(buf) and scan.end_offset == FROM + len(buf)


def test_blank_filler_ends_a_full_segment():
    buf, starts = segment([b"x" * 10] * 3, file_size=1000, blank=True)
    scan = scan_segment(buf, FROM)
    assert scan.reason is ScanEnd.BLANK and scan.starts.tolist() == starts
    assert scan.blank_at == starts[-1] + (starts[1] - starts[0]) and scan.end == 1000


def test_zeros_after_the_last_record_of_a_segment_being_written():
    buf, starts = segment([b"x"] * 4, file_size=2000)
    scan = scan_segment(buf, FROM)
    assert scan.reason is ScanEnd.ZEROS and scan.starts.tolist() == starts
    assert scan.end == starts[-1] + (starts[1] - starts[0])


@pytest.mark.parametrize("cut", [5, 7, 50])
def test_torn_tail_stops_before_the_partial_record(cut):
    buf, starts = segment([b"x" * 20] * 5)
    torn = buf[: starts[-1] + cut]
    scan = scan_segment(torn, FROM)
    assert scan.reason is ScanEnd.TORN and scan.starts.tolist() == starts[:-1]
    assert scan.end == starts[-1]


def test_record_claiming_another_offset_is_torn():
    buf, starts = segment([b"x"] * 3)
    scan = scan_segment(buf, FROM + 8)
    assert scan.reason is ScanEnd.TORN and scan.count == 0 and "physical offset" in scan.detail


def test_bad_magic_and_short_blank_are_torn():
    buf, starts = segment([b"x"] * 2)
    bad = bytearray(buf)
    bad[starts[1] + 4] ^= 0xFF
    scan = scan_segment(bytes(bad), FROM)
    assert (
        scan.reason is ScanEnd.TORN
        and scan.starts.tolist() == starts[:1]
        and "magic" in scan.detail
    )
    # a BLANK that does not reach the end of the file is not a filler
    short = (
        buf + (16).to_bytes(4, "big") + BLANK_MAGIC_CODE.to_bytes(4, "big", signed=True) + bytes(40)
    )
    assert scan_segment(short, FROM).reason is ScanEnd.TORN


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=30), st.integers(1, 2000))
def test_byte_ranges_resync_to_exactly_the_records_starting_in_them(bodies, width):
    buf, starts = segment(bodies, file_size=None)
    buf += bytes(100)
    got = []
    for lo in range(0, len(buf), width):
        hi = lo + width
        first = 0 if lo == 0 else resync(buf, FROM, lo, stop=hi)
        if first is None:
            continue
        scan = scan_segment(buf, FROM, start=first, stop=hi)
        assert all(lo <= s < hi for s in scan.starts.tolist())
        got += scan.starts.tolist()
    assert got == starts


_MAGIC = MESSAGE_MAGIC_CODE.to_bytes(4, "big", signed=True)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from([b"", b"x", _MAGIC, b"\x00\x00\x00\x5b" + _MAGIC, b"\xda", b"ab" * 20]),
        max_size=12,
    ),
    st.sampled_from(["eof", "blank", "zeros", "torn"]),
    st.integers(0, 3),
)
def test_vectorized_chain_finds_exactly_what_the_record_by_record_walk_finds(pieces, tail, cut):
    # the compiled chain (numba) and the numpy chain alike
    import pipeline.record_batch  # noqa: F401 - plugs the compiled chain in

    assert commitlog_scan._compiled_chain is not None
    _chain_agrees_with_walk(pieces, tail, cut)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(commitlog_scan, "_compiled_chain", None)
        _chain_agrees_with_walk(pieces, tail, cut)


def _chain_agrees_with_walk(pieces, tail, cut):
    # bodies full of magic bytes and fake headers: candidates that are not records
    bodies = [b"".join(pieces[: i + 1]) for i in range(len(pieces))]
    buf, starts = segment(bodies)
    size = len(buf) + 64
    if tail == "blank":
        buf, starts = segment(bodies, file_size=size, blank=True)
    elif tail == "zeros":
        buf, starts = segment(bodies, file_size=size)
    elif tail == "torn" and bodies:
        buf = buf[: len(buf) - 1 - cut]
    fast = scan_segment(buf, FROM)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            commitlog_scan, "chain_starts", lambda buf, pos, *a, **k: (np.empty(0, np.int64), pos)
        )
        slow = scan_segment(buf, FROM)
    assert fast.starts.tolist() == slow.starts.tolist()
    assert (fast.end, fast.reason, fast.blank_at, fast.detail) == (
        slow.end,
        slow.reason,
        slow.blank_at,
        slow.detail,
    )
    if tail != "torn":
        assert fast.starts.tolist() == starts


def test_chain_is_taken_over_by_the_walk_where_a_fake_record_points_at_another():
    # a body holding two fake headers, the first one's size leading to the second: the second
    # looks like a chained record, so the vectorized chain stops before it and the
    # record-by-record walk finishes the window
    body = bytearray(200)
    body[10:14] = (100).to_bytes(4, "big")
    body[14:18] = _MAGIC
    body[110:114] = (91).to_bytes(4, "big")
    body[114:118] = _MAGIC
    buf, starts = segment([b"a", bytes(body), b"b", bytes(body), b"c"])
    chain, after = commitlog_scan._chain_numpy(buf, 0, len(buf))
    assert chain.tolist() == starts[:2] and after == starts[2]
    assert commitlog_scan._chain_numpy(buf, 0, len(buf), FROM)[0].tolist() == starts
    # the compiled chain hops sizes like the walk, so fake headers inside bodies never matter
    for ffo in (None, FROM):
        chain, after = commitlog_scan.chain_starts(buf, 0, len(buf), ffo)
        assert chain.tolist() == starts and after == len(buf)
    scan = scan_segment(buf, FROM)
    assert scan.starts.tolist() == starts and scan.reason is ScanEnd.END_OF_FILE
