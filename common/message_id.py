"""The offset msgId: where a message is stored, as 32 (IPv4) or 56 (IPv6) uppercase hex digits.

Java's ``MessageDecoder.createMessageId`` / ``decodeMessageId``
(``common/message/MessageDecoder.java``): the store host (``common.socket_address``: ip bytes +
port) followed by the record's PHYSICALOFFSET (a long), in hex.  The broker answers a SEND with it,
``MessageExt.msg_id`` derives it, and a VIEW_MESSAGE_BY_ID request is routed and served by decoding
it.  (The client's *unique* id, UNIQ_KEY, is a different thing: a property the producer sets, see
``rmq``.)
"""

from __future__ import annotations

import functools
import struct

from common.socket_address import pack_host, unpack_ip

_Q = struct.Struct(">q")
_I = struct.Struct(">i")


@functools.lru_cache(maxsize=1024)
def _host_hex(host: tuple[str, int]) -> str:
    return pack_host(host[0], host[1]).hex().upper()


def create_offset_msg_id(store_host: tuple[str, int], phys_offset: int) -> str:
    """Offset msgId: uppercase hex of store ip (4|16) + port (int) + commit log offset (long)."""
    if phys_offset >= 0:
        return _host_hex(store_host) + f"{phys_offset:016X}"
    return (pack_host(store_host[0], store_host[1]) + _Q.pack(phys_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[tuple[str, int], int]:
    """Inverse of :func:`create_offset_msg_id`; raises ValueError if it is not one."""
    if len(msg_id) not in (32, 56):
        raise ValueError(f"not an offset msgId (length {len(msg_id)}): {msg_id!r}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise ValueError(f"not an offset msgId (not hex): {msg_id!r}") from exc
    iplen = len(raw) - 12
    ip = unpack_ip(raw[:iplen])
    (port,) = _I.unpack_from(raw, iplen)
    (offset,) = _Q.unpack_from(raw, iplen + 4)
    return (ip, port), offset
