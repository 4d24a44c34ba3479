"""The server's HPACK: ``hpack``'s decoder and encoder, cheaper for what a gRPC server does.

Why: profiling the broker under RocketMQ 5 clients (docs/benchmarks.md, "Where the 5.x master's
time goes") put HPACK decoding of each request's ~17 header fields near a tenth of the master's
CPU per call. ``hpack.Decoder.decode`` logs every field at DEBUG (a logger call each even when
off), wraps every field in a ``HeaderTuple`` twice, slices a memoryview per field and decodes
integers through a general helper. :class:`GrpcHpackDecoder` decodes the same wire format
(RFC 7541) in one loop over the block's bytes, and keeps everything else of ``hpack``: its
header table (static and dynamic entries, eviction, size updates), its Huffman decoder and its
exceptions, so h2, which calls ``decoder.decode(block, raw=True)``, sees the same results and the
same errors (a bad index, a truncated block or an over-long integer is an ``HPACKDecodingError``,
a header list over ``max_header_list_size`` an ``OversizedHeaderListError``, a table larger
than allowed an ``InvalidTableSizeError``: each ends the connection with a GOAWAY).

Fields come back as plain ``(name, value)`` tuples of bytes, a never-indexed one as
``NeverIndexedHeaderTuple`` as hpack returns it; ``raw=False`` (not used by h2 here) is hpack's
own code. tests/common/grpc/test_hpack_codec.py checks it against ``hpack.Decoder`` field for
field, malformed blocks included.

Sending, a server answers every call with the same response headers and, mostly, the same OK
trailers. :class:`GrpcHpackEncoder` encodes such constant lists once, as fields that neither
read nor change the dynamic table (static-table indexes and literals "without indexing", RFC
7541 6.1 and 6.2.2), so the cached bytes decode the same whatever the table holds; any other
list, and the first block after a table size change (which must open with the size update),
is hpack's own encoding.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import hpack
from hpack.exceptions import (
    HPACKDecodingError,
    InvalidTableIndex,
    OversizedHeaderListError,
)
from hpack.hpack import encode_integer
from hpack.huffman_table import decode_huffman
from hpack.struct import HeaderTuple, NeverIndexedHeaderTuple
from hpack.table import HeaderTable

# hpack's bound on the octets after an integer's prefix (VARINT_MAX_LENGTH in hpack.hpack)
_VARINT_MAX_OCTETS = 5
_STATIC = HeaderTable.STATIC_TABLE
_STATIC_LENGTH = len(_STATIC)
# RFC 7541 4.1: a field's size counts 32 octets of overhead
_ENTRY_OVERHEAD = 32


def _integer(data: bytes, i: int, number: int, prefix_max: int) -> tuple[int, int]:
    """Finish an integer whose prefix held ``number``: (value, index after it)."""
    if number < prefix_max:
        return number, i
    shift = 0
    start = i
    while True:
        byte = data[i]  # IndexError on a truncated block: h2 makes it a PROTOCOL_ERROR
        i += 1
        number += (byte & 0x7F) << shift
        if byte < 0x80:
            return number, i
        shift += 7
        if i - start >= _VARINT_MAX_OCTETS:
            raise HPACKDecodingError("Variable integer representation is too long")


class GrpcHpackDecoder(hpack.Decoder):
    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= _STATIC_LENGTH:
            return _STATIC[index - 1]
        dynamic = self.header_table.dynamic_entries
        if _STATIC_LENGTH < index <= _STATIC_LENGTH + len(dynamic):
            return dynamic[index - _STATIC_LENGTH - 1]
        raise InvalidTableIndex(f"Invalid table index {index}")

    @staticmethod
    def _string(data: bytes, i: int) -> tuple[bytes, int]:
        huffman = data[i] & 0x80
        length, i = _integer(data, i + 1, data[i] & 0x7F, 0x7F)
        end = i + length
        if end > len(data):
            raise HPACKDecodingError("Truncated header block")
        value = data[i:end]
        return (decode_huffman(value) if huffman else value), end

    def decode(self, data: bytes, raw: bool = False) -> Iterable[HeaderTuple]:
        if not raw:
            return super().decode(data, raw)
        data = bytes(data)
        end = len(data)
        limit = self.max_header_list_size
        table = self.header_table
        headers: list[tuple[bytes, bytes]] = []
        append = headers.append
        inflated = 0
        i = 0
        while i < end:
            first = data[i]
            if first & 0x80:  # indexed field (the common case: inlined)
                index = first & 0x7F
                if index == 0x7F:
                    index, i = _integer(data, i + 1, index, 0x7F)
                else:
                    i += 1
                header = _STATIC[index - 1] if 0 < index <= _STATIC_LENGTH else self._entry(index)
            elif first & 0x40:  # literal, added to the table
                index, i = _integer(data, i + 1, first & 0x3F, 0x3F)
                if index:
                    name = self._entry(index)[0]
                else:
                    name, i = self._string(data, i)
                value, i = self._string(data, i)
                table.add(name, value)
                header = (name, value)
            elif first & 0x20:  # dynamic table size update
                if headers:
                    raise HPACKDecodingError("Table size update not at the start of the block")
                size, i = _integer(data, i + 1, first & 0x1F, 0x1F)
                if size > self.max_allowed_table_size:
                    raise hpack.InvalidTableSizeError("Encoder exceeded max allowable table size")
                self.header_table_size = size
                continue
            else:  # literal, not added (0x10: never indexed)
                index, i = _integer(data, i + 1, first & 0x0F, 0x0F)
                if index:
                    name = self._entry(index)[0]
                else:
                    name, i = self._string(data, i)
                value, i = self._string(data, i)
                header = NeverIndexedHeaderTuple(name, value) if first & 0x10 else (name, value)
            append(header)
            inflated += _ENTRY_OVERHEAD + len(header[0]) + len(header[1])
            if inflated > limit:
                raise OversizedHeaderListError(
                    f"A header list larger than {limit} has been received"
                )
        self._assert_valid_table_size()
        return headers  # type: ignore[return-value]  # (plain tuples: see the module doc)


def _literal(value: bytes) -> bytes:
    return bytes(encode_integer(len(value), 7)) + value  # (no Huffman: H bit 0)


def table_free_block(headers: Sequence[tuple[bytes, bytes]]) -> bytes:
    """An HPACK block of ``headers`` that neither reads nor changes the dynamic table."""
    out = bytearray()
    for name, value in headers:
        if (name, value) in _STATIC:  # indexed field, static table
            index = encode_integer(_STATIC.index((name, value)) + 1, 7)
            index[0] |= 0x80
            out += index
            continue
        names = [n for n, _ in _STATIC]
        if name in names:  # literal without indexing, name from the static table
            out += encode_integer(names.index(name) + 1, 4) + _literal(value)
        else:  # literal without indexing, new name
            out += b"\x00" + _literal(name) + _literal(value)
    return bytes(out)


class GrpcHpackEncoder(hpack.Encoder):
    def __init__(self, constants: Iterable[Sequence[tuple[bytes, bytes]]] = ()) -> None:
        super().__init__()
        self._constant = {tuple(h): table_free_block(h) for h in constants}

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        # (h2 hands over a list of (bytes, bytes) tuples)
        if not self.header_table.resized and isinstance(headers, list):
            block = self._constant.get(tuple(headers))
            if block is not None:
                return block
        return super().encode(headers, huffman)
