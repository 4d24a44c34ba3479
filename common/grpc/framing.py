"""gRPC's length-prefixed messages inside an HTTP/2 DATA stream (sans-I/O).

Every message is one byte of compression flag, four bytes of big-endian length, then the
(protobuf) bytes. HTTP/2 DATA frames cut that stream anywhere, so :class:`MessageDecoder` buffers
the bytes of one call and yields whole messages. It refuses a message longer than
``max_message_size`` as soon as its prefix arrives (before buffering it): the caller answers
RESOURCE_EXHAUSTED, as grpc-java does for ``maxInboundMessageSize``.

Compression (gRPC's ``doc/compression.md`` and ``PROTOCOL-HTTP2.md``): a call names its
encoding in ``grpc-encoding``; a message whose flag is 1 is compressed with it. We accept
``identity``, ``gzip`` and ``deflate`` (zlib's format, as gRPC means it), advertised in
``grpc-accept-encoding``; a call naming another encoding is answered UNIMPLEMENTED (the
connection does that at the call's start), and a set flag on a call without an encoding is a
protocol error (INTERNAL). The decoder does not inflate: it yields a compressed message as a
:class:`CompressedMessage` (its bytes as received) and the call task inflates it with
:func:`inflate` when it parses it, so the connection's reader never spends time on it and the
inbound budget (limits.py) counts the bytes that are actually buffered. :func:`inflate` stops
as soon as the output would pass ``max_message_size`` (RESOURCE_EXHAUSTED): the limit applies
to the decompressed size, and a small "zip bomb" never becomes more than that many bytes (and
the connection bounds what all its calls hold inflated, limits.py). We answer uncompressed
(flag 0), which every client accepts.
"""

from __future__ import annotations

import struct
import zlib

from common.grpc.status import GrpcError, StatusCode

PREFIX = struct.Struct(">BI")

IDENTITY = "identity"
# grpc-encoding -> zlib's wbits for it (gzip's header and trailer, or zlib's)
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
ENCODINGS = (IDENTITY, *sorted(_WBITS))
ACCEPT_ENCODING = ",".join(ENCODINGS)
# inflate this many bytes of output at a time (bounds what one step allocates)
_INFLATE_STEP = 256 * 1024


class CompressedMessage(bytes):
    """A message whose flag was set: its bytes as received, still in the call's encoding."""


def inflate(data: bytes, encoding: str, max_message_size: int) -> bytes:
    """Decompress one message; GrpcError RESOURCE_EXHAUSTED as soon as it would exceed
    ``max_message_size``, INTERNAL when it is not valid in ``encoding``."""
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise GrpcError(StatusCode.INTERNAL, f"compressed message on a {encoding} call")
    out = bytearray()
    pending = data
    try:
        # gzip members may follow one another (RFC 1952): each gets a fresh inflater
        while True:
            inflater = zlib.decompressobj(wbits)
            while not inflater.eof:
                # at most one byte past the limit is ever produced
                room = max_message_size + 1 - len(out)
                chunk = inflater.decompress(pending, min(room, _INFLATE_STEP))
                pending = inflater.unconsumed_tail
                out += chunk
                if len(out) > max_message_size:
                    raise GrpcError(
                        StatusCode.RESOURCE_EXHAUSTED,
                        f"message inflates past the limit of {max_message_size} bytes",
                    )
                if not chunk and not pending:
                    break  # it needs input there is no more of
            if not inflater.eof:
                raise GrpcError(StatusCode.INTERNAL, f"truncated {encoding} message")
            pending = inflater.unused_data
            if not pending or wbits != _WBITS["gzip"]:
                break
    except zlib.error as exc:
        raise GrpcError(StatusCode.INTERNAL, f"bad {encoding} message: {exc}") from None
    if pending:
        raise GrpcError(StatusCode.INTERNAL, f"bytes after the end of the {encoding} message")
    return bytes(out)


def encode_message(payload: bytes) -> bytes:
    return PREFIX.pack(0, len(payload)) + payload


class MessageDecoder:
    def __init__(self, max_message_size: int, encoding: str = IDENTITY) -> None:
        self.max_message_size = max_message_size
        # the call's grpc-encoding (one of ENCODINGS: the connection refused any other)
        self.encoding = encoding
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; the whole messages they complete. Raises GrpcError."""
        self._buffer += data
        messages: list[bytes] = []
        while len(self._buffer) >= PREFIX.size:
            flag, length = PREFIX.unpack_from(self._buffer)
            if flag not in (0, 1):
                raise GrpcError(StatusCode.INTERNAL, f"bad message flag {flag}")
            if flag == 1 and self.encoding == IDENTITY:
                raise GrpcError(
                    StatusCode.INTERNAL, "a compressed message on a call without grpc-encoding"
                )
            if length > self.max_message_size:
                raise GrpcError(
                    StatusCode.RESOURCE_EXHAUSTED,
                    f"message of {length} bytes exceeds the limit of {self.max_message_size}",
                )
            end = PREFIX.size + length
            if len(self._buffer) < end:
                break
            payload = bytes(self._buffer[PREFIX.size : end])
            messages.append(CompressedMessage(payload) if flag else payload)
            del self._buffer[:end]
        return messages

    def inflate(self, message: bytes) -> bytes:
        """A message as the handler parses it: inflated when it came compressed."""
        if isinstance(message, CompressedMessage):
            return inflate(message, self.encoding, self.max_message_size)
        return message

    def finished_cleanly(self) -> bool:
        """At the end of the stream: no half message left."""
        return not self._buffer
