"""CommitLog message record codec, message properties and message ids (RocketMQ 4.x, v1 records).

Theory of operation
-------------------
A RocketMQ message lives on the wire and on disk as one *record* (facts §4.1): a big-endian,
length-prefixed struct whose fixed part is 88 bytes with IPv4 hosts (112 with two IPv6 hosts),
followed by the body (int length), the topic (byte length) and the properties string (short
length).  The same bytes are written to the CommitLog, served raw in PULL bodies, replicated to
slaves and decoded by clients, so this module is the single definition of that layout.

Everything here is a pure function over bytes (no I/O, no Trio):

* ``encode_record`` builds a record for a :class:`MessageExtBrokerInner` given the three values
  only the store knows (queue offset, physical offset, store timestamp).  The host IPv6 bits of
  SYSFLAG are derived from the host addresses, so a record is always self-consistent.
* ``decode_record`` reads one record at an offset of any buffer (bytes, memoryview, mmap) and
  raises :class:`RecordDecodeError` for anything that is not a complete, well-formed record:
  readers of a torn CommitLog tail must never get garbage back.  Trailing bytes after the record
  are ignored (the caller asked for one record at an offset); ``decode_records`` decodes a
  concatenation and rejects a partial record at the end.  The common case (IPv4 hosts) takes
  one ``unpack_from`` for the fixed part; the hosts and the properties map of a
  :class:`MessageExt` are only parsed when read (clients pull thousands of records a second
  and mostly read the body).  ``encode_records`` encodes a whole put into one buffer.
* Properties are ``k\\x01v\\x02k\\x01v`` (facts §4.5); the parser mirrors Java's tolerance
  (segments shorter than 3 chars and empty keys/values are skipped).
* The "offset msgId" is the hex of store host + physical offset (facts §4.4).
* Batch bodies (SEND_BATCH_MESSAGE, facts §4.6) are a concatenation of small per-message structs.

BODYCRC is ``crc32(body) & 0x7FFFFFFF`` like ``UtilAll.crc32`` (Java stores the masked value).
"""

from __future__ import annotations

import functools
import operator
import socket
import struct
import zlib
from collections.abc import Iterable, Mapping

import attrs

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194
MAX_TOPIC_BYTES = 127
MAX_PROPERTIES_BYTES = 32767

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# Fixed byte positions inside a record (identical for IPv4 and IPv6 up to BORNTIMESTAMP).
TOTAL_SIZE_POSITION = 0
MAGIC_CODE_POSITION = 4
BODY_CRC_POSITION = 8
QUEUE_ID_POSITION = 12
FLAG_POSITION = 16
QUEUE_OFFSET_POSITION = 20
PHYSICAL_OFFSET_POSITION = 28
SYSFLAG_POSITION = 36
BORN_TIMESTAMP_POSITION = 40
BORN_HOST_POSITION = 48

# TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSOFFSET SYSFLAG BORNTIMESTAMP
_HEAD = struct.Struct(">iiiiiqqiq")
# RECONSUMETIMES PREPAREDTXOFFSET BODYLEN
_MID = struct.Struct(">iqi")
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_H = struct.Struct(">h")
_B = struct.Struct(">B")


class RecordDecodeError(ValueError):
    """Bytes that are not a complete, well-formed CommitLog record (or batch body)."""


class MessageSysFlag:
    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_NOT_TYPE = 0
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    TRANSACTION_ROLLBACK = 0xC
    TRANSACTION_MASK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOSTADDRESS_V6 = 0x20
    NEED_UNWRAP = 0x40
    INNER_BATCH = 0x80
    COMPRESSION_TYPE_MASK = 0x700

    @staticmethod
    def transaction_value(sys_flag: int) -> int:
        return sys_flag & MessageSysFlag.TRANSACTION_MASK


class MessageConst:
    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT = "WAIT"
    DELAY = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    TRAN_MSG = "TRAN_MSG"
    PGROUP = "PGROUP"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    BUYER_ID = "BUYER_ID"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    TRANSFER_FLAG = "TRANSFER_FLAG"
    CORRECTION_FLAG = "CORRECTION_FLAG"
    MQ2_FLAG = "MQ2_FLAG"
    RECONSUME_TIME = "RECONSUME_TIME"
    MSG_REGION = "MSG_REGION"
    TRACE_ON = "TRACE_ON"
    UNIQ_KEY = "UNIQ_KEY"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIME = "CONSUME_START_TIME"
    TRAN_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    INSTANCE_ID = "INSTANCE_ID"
    CORRELATION_ID = "CORRELATION_ID"
    REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
    TTL = "TTL"
    ARRIVE_TIME = "ARRIVE_TIME"
    PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
    CLUSTER = "CLUSTER"
    MSG_TYPE = "MSG_TYPE"
    INNER_MULTI_DISPATCH = "INNER_MULTI_DISPATCH"
    INNER_MULTI_QUEUE_OFFSET = "INNER_MULTI_QUEUE_OFFSET"
    KEY_SEPARATOR = " "


# --------------------------------------------------------------------------------------- properties


def encode_properties(props: Mapping[str, str]) -> str:
    """``k\\x01v\\x02k\\x01v`` with no trailing separator; None values are skipped like Java."""
    items = [(k, v if isinstance(v, str) else str(v)) for k, v in props.items() if v is not None]
    s = PROPERTY_SEPARATOR.join([k + NAME_VALUE_SEPARATOR + v for k, v in items])
    # one C-level scan instead of four per property: exactly one \x01 per pair, \x02 between
    if s.count(NAME_VALUE_SEPARATOR) != len(items) or s.count(PROPERTY_SEPARATOR) != max(
        len(items) - 1, 0
    ):
        for k, v in items:
            if NAME_VALUE_SEPARATOR in k or PROPERTY_SEPARATOR in k:
                raise ValueError(f"property name {k!r} contains a separator character")
            if NAME_VALUE_SEPARATOR in v or PROPERTY_SEPARATOR in v:
                raise ValueError(f"property {k!r} value contains a separator character")
    return s


def decode_properties(s: str) -> dict[str, str]:
    """Java ``string2messageProperties``: skip segments < 3 chars, need non-empty key and value."""
    out: dict[str, str] = {}
    if not s:
        return out
    for seg in s.split(PROPERTY_SEPARATOR):
        # key before the first \x01, value after it; both non-empty (so len(seg) >= 3)
        k, _, v = seg.partition(NAME_VALUE_SEPARATOR)
        if k and v:
            out[k] = v
    return out


# ------------------------------------------------------------------------------------ hash / tags


_MASK32 = 0xFFFFFFFF
# 31**k mod 2**32, highest power first when sliced from the end: hash = sum(c_i * 31**(n-1-i))
_POW31 = [pow(31, k, 1 << 32) for k in range(255, -1, -1)]


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode``: signed 32-bit ``s[0]*31^(n-1)+...`` over UTF-16 code units."""
    if s.isascii():
        units: bytes | list[int] = s.encode("ascii")
    else:
        raw = s.encode("utf-16-be", "surrogatepass")
        units = [u for (u,) in struct.iter_unpack(">H", raw)]
    n = len(units)
    if n <= len(_POW31):
        # the dot product runs in C (map/sum), much faster than a Python loop per char
        h = sum(map(operator.mul, units, _POW31[len(_POW31) - n :])) & _MASK32
    else:
        h = 0
        for u in units:
            h = (31 * h + u) & _MASK32
    return h - 0x100000000 if h & 0x80000000 else h


@functools.lru_cache(maxsize=256)
def _pow31_tail(n: int) -> list[int]:
    return _POW31[len(_POW31) - n :]


@functools.lru_cache(maxsize=4096)
def _java_hash_u32(s: str) -> int:
    return java_string_hash(s) & _MASK32


def java_string_hash_concat(prefix: str, s: str) -> int:
    """``java_string_hash(prefix + s)`` without hashing ``prefix`` again for every ``s``.

    Java's hash is a polynomial, so h(a + b) = h(a) * 31**len(b) + h(b) (mod 2**32) with lengths
    in UTF-16 units; the prefix's hash is cached (index keys are "topic#" + key).
    """
    n = len(s)
    if n >= len(_POW31) or not s.isascii():
        return java_string_hash(prefix + s)
    if n > 8:
        # UNIQ_KEYs of one producer share their first 20 hex chars and those of one batch
        # (one millisecond) their first 28: the hash of all but the last 4 chars is cached
        h = (
            _head_hash(prefix, s[:-4]) * 923521  # 31**4
            + ord(s[-4]) * 29791
            + ord(s[-3]) * 961
            + ord(s[-2]) * 31
            + ord(s[-1])
        ) & _MASK32
    else:
        h = (
            _java_hash_u32(prefix) * _POW31[len(_POW31) - 1 - n]
            + sum(map(operator.mul, s.encode("ascii"), _pow31_tail(n)))
        ) & _MASK32
    return h - 0x100000000 if h & 0x80000000 else h


@functools.lru_cache(maxsize=1024)
def _head_hash(prefix: str, head: str) -> int:
    """Unsigned Java hash of ``prefix + head`` (``head`` ASCII, shorter than 256 chars)."""
    n = len(head)
    return (
        _java_hash_u32(prefix) * _POW31[len(_POW31) - 1 - n]
        + sum(map(operator.mul, head.encode("ascii"), _pow31_tail(n)))
    ) & _MASK32


@functools.lru_cache(maxsize=4096)
def _tags_code_cached(tags: str) -> int:
    return java_string_hash(tags)


def tags_code(tags: str | None) -> int:
    """CQ tagsCode: the tags' Java hash (sign-extended), 0 without tags."""
    if not tags:
        return 0
    return _tags_code_cached(tags)


# --------------------------------------------------------------------------------------- hosts


@functools.lru_cache(maxsize=1024)
def _pack_host(ip: str, port: int) -> bytes:
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
def _unpack_ip(raw: bytes) -> str:
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw)
    return socket.inet_ntop(socket.AF_INET6, raw)


def _is_v6(host: tuple[str, int]) -> bool:
    return ":" in host[0]


@functools.lru_cache(maxsize=1024)
def _host_hex(host: tuple[str, int]) -> str:
    return _pack_host(host[0], host[1]).hex().upper()


def create_offset_msg_id(store_host: tuple[str, int], phys_offset: int) -> str:
    """Offset msgId: uppercase hex of store ip (4|16) + port (int) + commit log offset (long)."""
    if phys_offset >= 0:
        return _host_hex(store_host) + f"{phys_offset:016X}"
    return (_pack_host(store_host[0], store_host[1]) + _Q.pack(phys_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[tuple[str, int], int]:
    """Inverse of :func:`create_offset_msg_id`; raises ValueError if it is not one."""
    if len(msg_id) not in (32, 56):
        raise ValueError(f"not an offset msgId (length {len(msg_id)}): {msg_id!r}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise ValueError(f"not an offset msgId (not hex): {msg_id!r}") from exc
    iplen = len(raw) - 12
    ip = _unpack_ip(raw[:iplen])
    (port,) = _I.unpack_from(raw, iplen)
    (offset,) = _Q.unpack_from(raw, iplen + 4)
    return (ip, port), offset


# ------------------------------------------------------------------------------------- records


@attrs.define(eq=False)
class MessageExtBrokerInner:
    """A message ready to store (what the broker hands the store).

    The store fills ``store_timestamp`` and caches the encoded properties in
    ``properties_string`` when it checks the message; build a new object (or reset
    ``properties_string``) rather than editing ``properties`` of one that was already put.
    """

    topic: str
    queue_id: int
    flag: int = 0
    body: bytes = b""
    properties: dict[str, str] = attrs.Factory(dict)
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    store_host: tuple[str, int] = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    store_timestamp: int = 0  # filled by the store
    # When set, written verbatim instead of encode_properties(properties): lets the broker store
    # a string without WAIT while keeping WAIT in the map (SendMessageProcessor does this).
    properties_string: str | None = None

    @property
    def tags_code(self) -> int:
        return tags_code(self.properties.get(MessageConst.TAGS))

    def stored_properties_string(self) -> str:
        if self.properties_string is not None:
            return self.properties_string
        return encode_properties(self.properties)


def record_size(body_len: int, topic_len: int, props_len: int, sys_flag: int) -> int:
    """Java ``calMsgLength``: total record size for the given part sizes."""
    born = 20 if sys_flag & MessageSysFlag.BORNHOST_V6 else 8
    store = 20 if sys_flag & MessageSysFlag.STOREHOSTADDRESS_V6 else 8
    return (
        4
        + 4
        + 4
        + 4
        + 4
        + 8
        + 8
        + 4
        + 8
        + born
        + 8
        + store
        + 4
        + 8
        + 4
        + body_len
        + 1
        + topic_len
        + 2
        + props_len
    )


def store_timestamp_position(sys_flag: int) -> int:
    return BORN_HOST_POSITION + (20 if sys_flag & MessageSysFlag.BORNHOST_V6 else 8)


def effective_sys_flag(msg: MessageExtBrokerInner) -> int:
    """sys_flag with the two host-IPv6 bits matching the actual host addresses."""
    f = msg.sys_flag & ~(MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOSTADDRESS_V6)
    if _is_v6(msg.born_host):
        f |= MessageSysFlag.BORNHOST_V6
    if _is_v6(msg.store_host):
        f |= MessageSysFlag.STOREHOSTADDRESS_V6
    return f


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
    return _pack_host(host[0], host[1])


def encode_record(
    msg: MessageExtBrokerInner, queue_offset: int, phys_offset: int, store_timestamp: int
) -> bytes:
    """One CommitLog record (facts §4.1). Raises ValueError for a topic/properties too long."""
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


_MESSAGE_EXT_FIELDS = (
    "store_size",
    "body_crc",
    "queue_id",
    "flag",
    "queue_offset",
    "commit_log_offset",
    "sys_flag",
    "born_timestamp",
    "born_host",
    "store_timestamp",
    "store_host",
    "reconsume_times",
    "prepared_transaction_offset",
    "body",
    "topic",
    "properties",
)


@functools.lru_cache(maxsize=1024)
def _host_from_raw(raw: bytes) -> tuple[str, int]:
    return _unpack_ip(raw[:-4]), int.from_bytes(raw[-4:], "big", signed=True)


class MessageExt:
    """Every field of one decoded record.

    A plain slotted class, not attrs: clients build one per pulled message, so construction
    must be cheap.  ``born_host``/``store_host`` may be given as the record's raw ip+port bytes
    and ``properties`` as the record's properties string: each is turned into its
    ``(ip, port)`` / dict form on first access (most consumers read only body and topic).
    Treat instances as read-only values; equality compares every field.
    """

    __slots__ = (
        "_born_host",
        "_properties",
        "_store_host",
        "body",
        "body_crc",
        "born_timestamp",
        "commit_log_offset",
        "flag",
        "prepared_transaction_offset",
        "queue_id",
        "queue_offset",
        "reconsume_times",
        "store_size",
        "store_timestamp",
        "sys_flag",
        "topic",
    )

    def __init__(
        self,
        store_size: int,
        body_crc: int,
        queue_id: int,
        flag: int,
        queue_offset: int,
        commit_log_offset: int,
        sys_flag: int,
        born_timestamp: int,
        born_host: tuple[str, int] | bytes,
        store_timestamp: int,
        store_host: tuple[str, int] | bytes,
        reconsume_times: int,
        prepared_transaction_offset: int,
        body: bytes,
        topic: str,
        properties: dict[str, str] | str,
    ):
        self.store_size = store_size
        self.body_crc = body_crc
        self.queue_id = queue_id
        self.flag = flag
        self.queue_offset = queue_offset
        self.commit_log_offset = commit_log_offset
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self._born_host = born_host
        self.store_timestamp = store_timestamp
        self._store_host = store_host
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self.body = body
        self.topic = topic
        self._properties = properties

    @property
    def born_host(self) -> tuple[str, int]:
        h = self._born_host
        if type(h) is bytes:
            h = self._born_host = _host_from_raw(h)
        return h

    @property
    def store_host(self) -> tuple[str, int]:
        h = self._store_host
        if type(h) is bytes:
            h = self._store_host = _host_from_raw(h)
        return h

    @property
    def properties(self) -> dict[str, str]:
        p = self._properties
        if type(p) is str:
            p = self._properties = decode_properties(p)
        return p

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in _MESSAGE_EXT_FIELDS)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # properties is a dict: not hashable

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{n}={v!r}" for n, v in zip(_MESSAGE_EXT_FIELDS, self._values(), strict=True)
        )
        return f"MessageExt({fields})"

    @property
    def tags(self) -> str | None:
        return self.properties.get(MessageConst.TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(MessageConst.KEYS)

    @property
    def msg_id(self) -> str:
        """Offset msgId (what MessageDecoder.decode assigns)."""
        return create_offset_msg_id(self.store_host, self.commit_log_offset)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(MessageConst.UNIQ_KEY)

    @property
    def tags_code(self) -> int:
        return tags_code(self.tags)


_FIXED_V4 = _FIXED_BY_LEN[8, 8]


@functools.lru_cache(maxsize=1024)
def _topic_from_raw(raw: bytes) -> str:
    return raw.decode("utf-8")


def decode_record(buf, offset: int = 0, *, check_crc: bool = False) -> MessageExt:
    """Decode the record starting at ``offset``; bytes after it are ignored."""
    # Fast path: IPv4 hosts and a well-formed record: one unpack for the fixed part. Anything
    # unusual goes through the careful path below, which also words the errors.
    n = len(buf)
    if offset < 0 or offset + 91 > n:
        return _decode_record_checked(buf, offset, check_crc)
    (
        size,
        magic,
        crc,
        queue_id,
        flag,
        qoff,
        poff,
        sys_flag,
        born_ts,
        born,
        store_ts,
        store,
        reconsume,
        prepared,
        body_len,
    ) = _FIXED_V4.unpack_from(buf, offset)
    end = offset + size
    p = offset + 88 + body_len
    if magic != MESSAGE_MAGIC_CODE or sys_flag & _V6_BITS or body_len < 0 or end > n or p + 3 > end:
        return _decode_record_checked(buf, offset, check_crc)
    t = p + 1 + buf[p]
    if t + 2 > end or t + 2 + ((buf[t] << 8) | buf[t + 1]) != end:
        return _decode_record_checked(buf, offset, check_crc)
    body = bytes(buf[offset + 88 : p])
    if check_crc and (zlib.crc32(body) & 0x7FFFFFFF) != crc:
        raise RecordDecodeError(f"record at {offset}: body CRC mismatch")
    try:
        topic = _topic_from_raw(bytes(buf[p + 1 : t]))
        props = str(buf[t + 2 : end], "utf-8")
    except UnicodeDecodeError as exc:
        raise RecordDecodeError(f"record at {offset}: {exc}") from exc
    return MessageExt(
        size,
        crc,
        queue_id,
        flag,
        qoff,
        poff,
        sys_flag,
        born_ts,
        born,
        store_ts,
        store,
        reconsume,
        prepared,
        body,
        topic,
        props,
    )


def _decode_record_checked(buf, offset: int, check_crc: bool) -> MessageExt:
    n = len(buf)
    if offset < 0 or offset + _HEAD.size > n:
        raise RecordDecodeError(f"truncated record header at {offset} (buffer {n} bytes)")
    (size, magic, crc, queue_id, flag, qoff, poff, sys_flag, born_ts) = _HEAD.unpack_from(
        buf, offset
    )
    if magic != MESSAGE_MAGIC_CODE:
        kind = "BLANK filler" if magic == BLANK_MAGIC_CODE else f"bad magic {magic:#x}"
        raise RecordDecodeError(f"not a message record at {offset}: {kind}")
    if size < record_size(0, 0, 0, sys_flag):
        raise RecordDecodeError(f"record at {offset} declares impossible size {size}")
    end = offset + size
    if end > n:
        raise RecordDecodeError(
            f"truncated record at {offset}: needs {size} bytes, has {n - offset}"
        )
    try:
        pos = offset + _HEAD.size
        hl = 16 if sys_flag & MessageSysFlag.BORNHOST_V6 else 4
        born_host = (_unpack_ip(bytes(buf[pos : pos + hl])), _I.unpack_from(buf, pos + hl)[0])
        pos += hl + 4
        (store_ts,) = _Q.unpack_from(buf, pos)
        pos += 8
        hl = 16 if sys_flag & MessageSysFlag.STOREHOSTADDRESS_V6 else 4
        store_host = (_unpack_ip(bytes(buf[pos : pos + hl])), _I.unpack_from(buf, pos + hl)[0])
        pos += hl + 4
        reconsume, prepared, body_len = _MID.unpack_from(buf, pos)
        pos += _MID.size
        if body_len < 0 or pos + body_len + 3 > end:
            raise RecordDecodeError(f"record at {offset}: body length {body_len} overruns record")
        body = bytes(buf[pos : pos + body_len])
        pos += body_len
        (topic_len,) = _B.unpack_from(buf, pos)
        pos += 1
        if pos + topic_len + 2 > end:
            raise RecordDecodeError(f"record at {offset}: topic length overruns record")
        topic = bytes(buf[pos : pos + topic_len]).decode("utf-8")
        pos += topic_len
        (props_len,) = _H.unpack_from(buf, pos)
        pos += 2
        if props_len < 0 or pos + props_len != end:
            raise RecordDecodeError(
                f"record at {offset}: fields end at {pos + props_len - offset}, TOTALSIZE {size}"
            )
        props = decode_properties(bytes(buf[pos:end]).decode("utf-8"))
    except (struct.error, UnicodeDecodeError) as exc:
        raise RecordDecodeError(f"record at {offset}: {exc}") from exc
    if check_crc and (zlib.crc32(body) & 0x7FFFFFFF) != crc:
        raise RecordDecodeError(f"record at {offset}: body CRC mismatch")
    return MessageExt(
        store_size=size,
        body_crc=crc,
        queue_id=queue_id,
        flag=flag,
        queue_offset=qoff,
        commit_log_offset=poff,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=born_host,
        store_timestamp=store_ts,
        store_host=store_host,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body=body,
        topic=topic,
        properties=props,
    )


def decode_records(buf, *, check_crc: bool = False) -> list[MessageExt]:
    """Decode concatenated records (a PULL body); a partial record at the end raises."""
    out = []
    pos = 0
    n = len(buf)
    while pos < n:
        m = decode_record(buf, pos, check_crc=check_crc)
        out.append(m)
        pos += m.store_size
    return out


# ------------------------------------------------------------------------------------ batches

# TOTALSIZE MAGIC BODYCRC FLAG BODYLEN
_BATCH_HEAD = struct.Struct(">iiiii")


def decode_batch_body(body) -> list[tuple[int, bytes, dict[str, str]]]:
    """SEND_BATCH_MESSAGE body -> [(flag, body, properties)].

    Like the broker (``MessageExtBatchEncoder``) the per-message TOTALSIZE/MAGIC/BODYCRC are not
    trusted; the lengths of body and properties delimit each message.  Truncation raises.
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
            props = decode_properties(bytes(body[pos : pos + props_len]).decode("utf-8"))
            pos += props_len
            out.append((flag, mbody, props))
    except UnicodeDecodeError as exc:
        raise RecordDecodeError(f"batch message properties are not UTF-8: {exc}") from exc
    return out


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
