"""GrpcHpackDecoder decodes what hpack.Decoder decodes, field for field and table for table, and
refuses what it refuses with the same exception classes; GrpcHpackEncoder's cached blocks decode
the same whatever the dynamic table holds, and leave it as it was."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.grpc.hpack_codec import GrpcHpackDecoder, GrpcHpackEncoder, table_free_block

pytestmark = pytest.mark.timeout(120)

_names = st.sampled_from(
    [b":method", b":path", b"content-type", b"te", b"x-mq-client-id", b"user-agent", b"a"]
) | st.binary(min_size=0, max_size=40)
_values = st.binary(min_size=0, max_size=300)
_field = st.tuples(_names, _values, st.booleans())  # (name, value, never indexed)


def _pair(size: int = 4096) -> tuple[hpack.Decoder, GrpcHpackDecoder]:
    ref, ours = hpack.Decoder(), GrpcHpackDecoder()
    for d in (ref, ours):
        d.max_header_list_size = 1 << 20
        d.max_allowed_table_size = size
    return ref, ours


def _fields(block: list[tuple[bytes, bytes, bool]]) -> list[hpack.HeaderTuple]:
    return [
        hpack.NeverIndexedHeaderTuple(n, v) if never else hpack.HeaderTuple(n, v)
        for n, v, never in block
    ]


def _same(a: object, b: object) -> None:
    assert [tuple(h) for h in a] == [tuple(h) for h in b]  # type: ignore[attr-defined]
    # never-indexed fields stay marked as such
    assert [isinstance(h, hpack.NeverIndexedHeaderTuple) for h in a] == [  # type: ignore[attr-defined]
        isinstance(h, hpack.NeverIndexedHeaderTuple)
        for h in b  # type: ignore[attr-defined]
    ]


@settings(max_examples=200, deadline=None)
@given(
    blocks=st.lists(st.lists(_field, max_size=20), min_size=1, max_size=6),
    huffman=st.booleans(),
    table_size=st.sampled_from([0, 64, 256, 4096]),
)
def test_decodes_as_hpack_does_block_after_block(
    blocks: list[list[tuple[bytes, bytes, bool]]], huffman: bool, table_size: int
) -> None:
    encoder = hpack.Encoder()
    encoder.header_table_size = table_size  # the next block starts with a size update
    ref, ours = _pair()
    for block in blocks:
        wire = encoder.encode(_fields(block), huffman=huffman)
        _same(ref.decode(wire, raw=True), ours.decode(wire, raw=True))
        assert list(ref.header_table.dynamic_entries) == list(ours.header_table.dynamic_entries)
        assert ref.header_table_size == ours.header_table_size


def _outcome(decoder: hpack.Decoder, wire: bytes) -> object:
    try:
        return [tuple(h) for h in decoder.decode(wire, raw=True)]
    except (hpack.HPACKError, IndexError) as exc:
        # h2 turns both into a connection error (IndexError: a block cut inside an integer)
        return type(exc)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_garbage_fails_as_hpack_fails(wire: bytes) -> None:
    ref, ours = _pair()
    ref_outcome = _outcome(ref, wire)
    ours_outcome = _outcome(ours, wire)
    if ref_outcome is IndexError or ours_outcome is IndexError:
        # a cut integer: hpack reports IndexError or HPACKDecodingError depending on where
        assert ref_outcome in (IndexError, hpack.HPACKDecodingError)
        assert ours_outcome in (IndexError, hpack.HPACKDecodingError)
    else:
        assert ours_outcome == ref_outcome


@pytest.mark.parametrize(
    "wire",
    [
        b"\x80",  # index 0
        b"\xff\x80\x80\x80\x80\x80\x01",  # an integer longer than 5 octets
        b"\x40\x05ab",  # a name shorter than its length
        b"\xbf\x7f",  # index past the tables
        b"\x82\x3f\xe1\x1f",  # a size update after a field
    ],
)
def test_malformed_blocks_raise_hpack_errors(wire: bytes) -> None:
    ref, ours = _pair()
    with pytest.raises(hpack.HPACKDecodingError):
        ref.decode(wire, raw=True)
    with pytest.raises(hpack.HPACKDecodingError):
        ours.decode(wire, raw=True)


def test_a_header_list_over_the_limit_is_refused() -> None:
    ours = GrpcHpackDecoder(max_header_list_size=100)
    wire = hpack.Encoder().encode([(b"x-big", b"v" * 200)])
    with pytest.raises(hpack.OversizedHeaderListError):
        ours.decode(wire, raw=True)


def test_a_table_larger_than_allowed_is_refused() -> None:
    ours = GrpcHpackDecoder()
    ours.max_allowed_table_size = 100
    with pytest.raises(hpack.InvalidTableSizeError):
        ours.decode(b"\x3f\xe1\x1f", raw=True)  # size update to 4096


RESPONSE = [
    (b":status", b"200"),
    (b"content-type", b"application/grpc"),
    (b"grpc-accept-encoding", b"identity"),
]
OK = [(b"grpc-status", b"0")]


@settings(max_examples=100, deadline=None)
@given(before=st.lists(st.lists(_field, max_size=8), max_size=4), huffman=st.booleans())
def test_constant_blocks_decode_alike_in_any_table_state(
    before: list[list[tuple[bytes, bytes, bool]]], huffman: bool
) -> None:
    encoder = GrpcHpackEncoder([RESPONSE, OK])
    decoder = hpack.Decoder()
    for block in before:  # whatever the connection sent before fills both tables
        decoder.decode(encoder.encode(_fields(block), huffman=huffman), raw=True)
    table = list(decoder.header_table.dynamic_entries)
    for constant in (RESPONSE, OK, RESPONSE):
        wire = encoder.encode(list(constant))
        assert wire == table_free_block(constant)
        assert [tuple(h) for h in decoder.decode(wire, raw=True)] == constant
        assert list(decoder.header_table.dynamic_entries) == table
        assert list(encoder.header_table.dynamic_entries) == table


def test_other_headers_and_a_pending_size_update_are_hpack_s_encoding() -> None:
    ours, ref = GrpcHpackEncoder([OK]), hpack.Encoder()
    other = [(b"grpc-status", b"13"), (b"grpc-message", b"boom")]
    assert ours.encode(list(other)) == ref.encode(list(other))
    # a table size change must open the next block, constant or not
    ours.header_table_size = ref.header_table_size = 256
    assert ours.encode(list(OK)) == ref.encode(list(OK))
    assert ours.encode(list(OK)) == table_free_block(OK)
