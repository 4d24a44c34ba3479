"""gRPC's length-prefixed messages inside an HTTP/2 DATA stream (sans-I/O).

Every message is one byte of compression flag, four bytes of big-endian length, then the
(protobuf) bytes. HTTP/2 DATA frames cut that stream anywhere, so :class:`MessageDecoder` buffers
the bytes of one call and yields whole messages. It refuses a message longer than
``max_message_size`` as soon as its prefix arrives (before buffering it): the caller answers
RESOURCE_EXHAUSTED, as grpc-java does for ``maxInboundMessageSize``. A set compression flag is
refused (INTERNAL is what grpc answers for a compressed message whose grpc-encoding it does not
have): this server only advertises ``identity``.
"""

from __future__ import annotations

import struct

from common.grpc.status import GrpcError, StatusCode

PREFIX = struct.Struct(">BI")


def encode_message(payload: bytes) -> bytes:
    return PREFIX.pack(0, len(payload)) + payload


class MessageDecoder:
    def __init__(self, max_message_size: int) -> None:
        self.max_message_size = max_message_size
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
            if flag == 1:
                raise GrpcError(StatusCode.INTERNAL, "compressed messages are not accepted")
            if length > self.max_message_size:
                raise GrpcError(
                    StatusCode.RESOURCE_EXHAUSTED,
                    f"message of {length} bytes exceeds the limit of {self.max_message_size}",
                )
            end = PREFIX.size + length
            if len(self._buffer) < end:
                break
            messages.append(bytes(self._buffer[PREFIX.size : end]))
            del self._buffer[:end]
        return messages

    def finished_cleanly(self) -> bool:
        """At the end of the stream: no half message left."""
        return not self._buffer
