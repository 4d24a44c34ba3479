"""A host as RocketMQ stores it: the ip's 4 or 16 bytes, then the port as a big-endian int.

This is Java's ``MessageExt.socketAddress2ByteBuffer``: the born and store hosts of every
CommitLog record (``common.message``) and the first part of an offset msgId
(``common.message_id``) are written this way.  An IPv6 host is told apart by its length (the
record says so in SYSFLAG, the msgId by its own length).  The caches matter: a broker writes
the same two hosts into every record and clients decode the same few over and over.
"""

from __future__ import annotations

import functools
import socket
import struct

_I = struct.Struct(">i")


@functools.lru_cache(maxsize=1024)
def pack_host(ip: str, port: int) -> bytes:
    """``ip`` (IPv4 or IPv6 text) and ``port`` as 8 or 20 bytes; ValueError if either is bad."""
    try:
        if ":" in ip:
            raw = socket.inet_pton(socket.AF_INET6, ip)
        else:
            raw = socket.inet_pton(socket.AF_INET, ip)
    except OSError as exc:
        raise ValueError(f"bad host address {ip!r}") from exc
    if not 0 <= port <= 0x7FFFFFFF:
        raise ValueError(f"bad port {port}")
    return raw + _I.pack(port)


@functools.lru_cache(maxsize=1024)
def unpack_ip(raw: bytes) -> str:
    """The text form of 4 (IPv4) or 16 (IPv6) ip bytes."""
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw)
    return socket.inet_ntop(socket.AF_INET6, raw)


@functools.lru_cache(maxsize=1024)
def unpack_host(raw: bytes) -> tuple[str, int]:
    """Inverse of :func:`pack_host`: 8 or 20 bytes to ``(ip, port)``."""
    return unpack_ip(raw[:-4]), int.from_bytes(raw[-4:], "big", signed=True)
