"""Encoding messages into CommitLog records: the store's put path (Java's ``MessageExtEncoder``).

``encode_record`` builds the record of one :class:`~common.message.MessageExtBrokerInner` given
the three values only the store knows (queue offset, physical offset, store timestamp);
``encode_records`` encodes a whole put into one buffer.  The layout is ``common.message``'s
(``store/CommitLog.java``), and ``common.message.decode_record`` reads back exactly what is
written here.
The host IPv6 bits of SYSFLAG are derived from the host addresses, so a record is always
self-consistent.

The put path is hot (one call per stored message), so each record is one ``struct.pack`` of
everything from TOTALSIZE to BODYLEN and one join, with the topic part and host bytes cached.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Iterable

from common.message import (
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES,
    MESSAGE_MAGIC_CODE,
    MessageExtBrokerInner,
    MessageSysFlag,
)
from common.message_properties import encode_properties
from common.socket_address import pack_host

_H = struct.Struct(">h")
_B = struct.Struct(">B")
_V6_BITS = MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOSTADDRESS_V6


@functools.lru_cache(maxsize=16)
def _fixed_struct(born_len: int, store_len: int) -> struct.Struct:
    # everything from TOTALSIZE to BODYLEN in one pack: hosts go in as raw ip+port bytes
    return struct.Struct(f">iiiiiqqiq{born_len}sq{store_len}siqi")


@functools.lru_cache(maxsize=4096)
def _topic_part(topic: str) -> bytes:
    topic_b = topic.encode("utf-8")
    if len(topic_b) > MAX_TOPIC_BYTES:
        raise ValueError(f"topic is {len(topic_b)} bytes, max {MAX_TOPIC_BYTES}")
    return _B.pack(len(topic_b)) + topic_b


@functools.lru_cache(maxsize=1024)
def _host_bytes(host: tuple[str, int]) -> bytes:
    return pack_host(host[0], host[1])


def encode_record(
    msg: MessageExtBrokerInner, queue_offset: int, phys_offset: int, store_timestamp: int
) -> bytes:
    """One CommitLog record (Java's ``MessageExtEncoder.encode``).

    Raises ValueError for a topic or properties string too long.
    """
    topic_part = _topic_part(msg.topic)
    props = msg.properties_string
    if props is None:
        props = encode_properties(msg.properties)
    props_b = props.encode("utf-8")
    if len(props_b) > MAX_PROPERTIES_BYTES:
        raise ValueError(f"properties are {len(props_b)} bytes, max {MAX_PROPERTIES_BYTES}")
    body = msg.body
    born = _host_bytes(msg.born_host)
    store = _host_bytes(msg.store_host)
    sys_flag = msg.sys_flag & ~_V6_BITS
    if len(born) == 20:
        sys_flag |= MessageSysFlag.BORNHOST_V6
    if len(store) == 20:
        sys_flag |= MessageSysFlag.STOREHOSTADDRESS_V6
    fixed = _fixed_struct(len(born), len(store))
    blen = len(body)
    size = fixed.size + blen + len(topic_part) + 2 + len(props_b)
    return b"".join(
        (
            fixed.pack(
                size,
                MESSAGE_MAGIC_CODE,
                zlib.crc32(body) & 0x7FFFFFFF,
                msg.queue_id,
                msg.flag,
                queue_offset,
                phys_offset,
                sys_flag,
                msg.born_timestamp,
                born,
                store_timestamp,
                store,
                msg.reconsume_times,
                msg.prepared_transaction_offset,
                blen,
            ),
            body,
            topic_part,
            _H.pack(len(props_b)),
            props_b,
        )
    )


_FIXED_BY_LEN = {(b, st): _fixed_struct(b, st) for b in (8, 20) for st in (8, 20)}


def encode_records(
    msgs: Iterable[MessageExtBrokerInner], queue_offsets: Iterable[int], store_timestamp: int
) -> tuple[bytearray, list[int]]:
    """Records for several messages in one buffer, PHYSICALOFFSET 0 (the caller patches it).

    Byte for byte ``b"".join(encode_record(m, q, 0, store_timestamp) ...)``; returns the buffer
    and the record sizes.  One ``pack`` per record and one join: the put path of a batch.
    """
    parts: list = []
    add = parts.extend
    sizes: list[int] = []
    crc32 = zlib.crc32
    hpack = _H.pack
    last_topic = last_born = last_store = None
    for m, q in zip(msgs, queue_offsets, strict=True):
        props = m.properties_string
        if props is None:
            props = encode_properties(m.properties)
        props_b = props.encode("utf-8")
        plen = len(props_b)
        if plen > MAX_PROPERTIES_BYTES:
            raise ValueError(f"properties are {plen} bytes, max {MAX_PROPERTIES_BYTES}")
        # the messages of one put mostly share topic and hosts: skip the cache lookups then
        if m.topic is not last_topic:
            last_topic = m.topic
            topic_part = _topic_part(last_topic)
        if m.born_host is not last_born or m.store_host is not last_store:
            last_born, last_store = m.born_host, m.store_host
            born = _host_bytes(last_born)
            store = _host_bytes(last_store)
            v6 = (MessageSysFlag.BORNHOST_V6 if len(born) == 20 else 0) | (
                MessageSysFlag.STOREHOSTADDRESS_V6 if len(store) == 20 else 0
            )
            fixed = _FIXED_BY_LEN[len(born), len(store)]
        sys_flag = (m.sys_flag & ~_V6_BITS) | v6
        body = m.body
        blen = len(body)
        size = fixed.size + blen + len(topic_part) + 2 + plen
        add(
            (
                fixed.pack(
                    size,
                    MESSAGE_MAGIC_CODE,
                    crc32(body) & 0x7FFFFFFF,
                    m.queue_id,
                    m.flag,
                    q,
                    0,
                    sys_flag,
                    m.born_timestamp,
                    born,
                    store_timestamp,
                    store,
                    m.reconsume_times,
                    m.prepared_transaction_offset,
                    blen,
                ),
                body,
                topic_part,
                hpack(plen),
                props_b,
            )
        )
        sizes.append(size)
    return bytearray(b"".join(parts)), sizes
