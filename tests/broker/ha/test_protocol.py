"""HA wire codecs: the 8-byte report and the 12-byte header + body, under every split."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.ha.protocol import (
    HEADER_SIZE,
    HAProtocolError,
    ReportDecoder,
    Transfer,
    TransferDecoder,
    encode_header,
    encode_report,
)


def test_report_is_big_endian_long():
    assert encode_report(0x0102030405060708) == bytes(range(1, 9))
    assert encode_report(0) == b"\0" * 8


def test_header_layout():
    assert encode_header(1 << 32, 5) == struct.pack(">qi", 1 << 32, 5)
    assert len(encode_header(0, 0)) == HEADER_SIZE


def test_report_decoder_takes_last_complete_word():
    d = ReportDecoder()
    assert d.feed(encode_report(1) + encode_report(2) + encode_report(3)[:5]) == 2
    assert d.feed(b"") is None
    assert d.feed(encode_report(3)[5:]) == 3
    assert d.count == 3


def test_report_decoder_byte_at_a_time():
    d = ReportDecoder()
    seen = [d.feed(bytes([b])) for b in encode_report(77)]
    assert seen == [None] * 7 + [77]


def test_negative_report_is_an_error():
    with pytest.raises(HAProtocolError):
        ReportDecoder().feed(encode_report(-1))


reports = st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=20, unique=True)


@given(reports, st.lists(st.integers(1, 40), max_size=30))
def test_report_decoder_any_split(values, cuts):
    stream = b"".join(encode_report(v) for v in values)
    pieces, pos = [], 0
    for c in cuts:
        pieces.append(stream[pos : pos + c])
        pos += c
    pieces.append(stream[pos:])
    d = ReportDecoder()
    answers = [a for a in (d.feed(p) for p in pieces) if a is not None]
    # every answer is a value really sent, answers never go back in the stream, the last
    # answer is the last report
    idx = [values.index(a) for a in answers]
    assert idx == sorted(idx)
    assert answers[-1] == values[-1]
    assert d.count == len(values)


frames = st.lists(
    st.tuples(st.integers(0, 2**62), st.binary(max_size=300)), min_size=1, max_size=12
)


def encode_frames(fs):
    return b"".join(encode_header(o, len(b)) + b for o, b in fs)


@given(frames, st.lists(st.integers(1, 500), max_size=40))
def test_transfer_decoder_any_split(fs, cuts):
    stream = encode_frames(fs)
    d = TransferDecoder()
    out: list[Transfer] = []
    pos = 0
    for c in cuts:
        out += d.feed(stream[pos : pos + c])
        pos += c
    out += d.feed(stream[pos:])
    assert [(t.offset, t.body) for t in out] == fs
    assert d.buffered == 0


@given(frames)
def test_transfer_decoder_one_byte_at_a_time_and_trailing(fs):
    stream = encode_frames(fs)
    d = TransferDecoder()
    out = []
    for i in range(len(stream)):
        out += d.feed(stream[i : i + 1])
    assert [(t.offset, t.body) for t in out] == fs
    # trailing bytes of a next frame stay buffered, nothing is yielded early
    tail = encode_header(5, 10) + b"abc"
    assert d.feed(tail) == []
    assert d.buffered == len(tail)
    assert d.feed(b"x" * 7) == [Transfer(5, b"abc" + b"x" * 7)]


def test_heartbeat_frame():
    (t,) = TransferDecoder().feed(encode_header(4096, 0))
    assert t.is_heartbeat and t.offset == 4096


@pytest.mark.parametrize("header", [struct.pack(">qi", 0, -1), struct.pack(">qi", -5, 0)])
def test_bad_header_is_an_error(header):
    with pytest.raises(HAProtocolError):
        TransferDecoder().feed(header)


def test_oversized_body_is_an_error():
    with pytest.raises(HAProtocolError):
        TransferDecoder(max_body_size=100).feed(encode_header(0, 101))


def test_transfer_bodies_are_views_of_bytes_reads_and_copies_of_anything_mutable():
    stream = encode_frames([(0, b"abc"), (3, b"defg")])
    views = TransferDecoder().feed(stream)
    assert [type(t.body) for t in views] == [memoryview, memoryview]
    assert [bytes(t.body) for t in views] == [b"abc", b"defg"]
    buf = bytearray(stream)
    copies = TransferDecoder().feed(buf)
    buf[12:15] = b"XYZ"  # the caller reuses its buffer: what was decoded must not change
    assert [t.body for t in copies] == [b"abc", b"defg"]
    assert all(type(t.body) is bytes for t in copies)
