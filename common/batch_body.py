"""Batch bodies: the messages of one SEND_BATCH_MESSAGE request.

A batch body is a concatenation of small per-message structs, Java's
``MessageDecoder.encodeMessages`` (``common/message/MessageDecoder.java``): TOTALSIZE, MAGIC,
BODYCRC, FLAG, BODYLEN (ints), the body, then the properties string
(``common.message_properties``) with a short length.  The producer encodes it (``rmq``), the
broker's SEND processor decodes it and stores each message as its own
CommitLog record (``common.message``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

from common.message import MAX_PROPERTIES_BYTES, RecordDecodeError
from common.message_properties import decode_properties, encode_properties

_H = struct.Struct(">h")

# TOTALSIZE MAGIC BODYCRC FLAG BODYLEN
_BATCH_HEAD = struct.Struct(">iiiii")


def split_batch_body(body: bytes | bytearray | memoryview) -> list[tuple[int, bytes, str]]:
    """SEND_BATCH_MESSAGE body -> [(flag, body, properties string)], the strings undecoded.

    Like the broker (``MessageExtBatchEncoder``) the per-message TOTALSIZE/MAGIC/BODYCRC are not
    trusted; the lengths of body and properties delimit each message.  Truncation raises.
    The broker stores each string as it came (plus the batch's own properties), as Java does.
    """
    out = []
    pos = 0
    n = len(body)
    try:
        while pos < n:
            if pos + _BATCH_HEAD.size > n:
                raise RecordDecodeError(f"truncated batch message header at {pos}")
            _size, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(body, pos)
            pos += _BATCH_HEAD.size
            if body_len < 0 or pos + body_len + 2 > n:
                raise RecordDecodeError(f"batch message body length {body_len} overruns body")
            mbody = bytes(body[pos : pos + body_len])
            pos += body_len
            (props_len,) = _H.unpack_from(body, pos)
            pos += 2
            if props_len < 0 or pos + props_len > n:
                raise RecordDecodeError(
                    f"batch message properties length {props_len} overruns body"
                )
            props = bytes(body[pos : pos + props_len]).decode("utf-8")
            pos += props_len
            out.append((flag, mbody, props))
    except UnicodeDecodeError as exc:
        raise RecordDecodeError(f"batch message properties are not UTF-8: {exc}") from exc
    return out


def decode_batch_body(
    body: bytes | bytearray | memoryview,
) -> list[tuple[int, bytes, dict[str, str]]]:
    """SEND_BATCH_MESSAGE body -> [(flag, body, properties)] (:func:`split_batch_body`, decoded)."""
    return [(flag, b, decode_properties(p)) for flag, b, p in split_batch_body(body)]


def encode_batch_body(messages: Iterable[tuple[int, bytes, Mapping[str, str]]]) -> bytes:
    """Inverse of :func:`decode_batch_body` (Java ``MessageDecoder.encodeMessage`` per message)."""
    parts = []
    for flag, body, props in messages:
        props_b = encode_properties(props).encode("utf-8")
        if len(props_b) > MAX_PROPERTIES_BYTES:
            raise ValueError("batch message properties too long")
        size = _BATCH_HEAD.size + len(body) + 2 + len(props_b)
        parts.append(_BATCH_HEAD.pack(size, 0, 0, flag, len(body)))
        parts.append(bytes(body))
        parts.append(_H.pack(len(props_b)))
        parts.append(props_b)
    return b"".join(parts)
