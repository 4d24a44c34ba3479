"""The message types and the CommitLog record: its layout, its size and its decoder (RocketMQ 4.x).

Theory of operation
-------------------
A RocketMQ message lives on the wire and on disk as one *record* (``CommitLog.calMsgLength`` and
``MessageExtEncoder`` in ``store/CommitLog.java``): a big-endian, length-prefixed struct whose fixed
part is 88 bytes with IPv4 hosts (112 with two IPv6 hosts), followed by the body (int length), the
topic (byte length) and the properties string (short length).  The same bytes are written to the
CommitLog, served raw in PULL bodies, replicated to slaves and decoded by clients, so this module is
the single definition of that layout: the magic codes, the field positions, :func:`record_size`
(Java's ``calMsgLength``) and the two message types, :class:`MessageExtBrokerInner` (a message ready
to store) and :class:`MessageExt` (every field of a decoded record).

The fields, in order (sizes in bytes)::

    TOTALSIZE 4        the whole record         BORNHOST 8 or 20        ip + port
    MAGICCODE 4        MESSAGE_MAGIC_CODE       STORETIMESTAMP 8
    BODYCRC 4                                   STOREHOSTADDRESS 8 or 20
    QUEUEID 4                                   RECONSUMETIMES 4
    FLAG 4             the user's flag          PREPAREDTRANSACTIONOFFSET 8
    QUEUEOFFSET 8      logical (CQ) offset      BODYLEN 4, BODY
    PHYSICALOFFSET 8   absolute CommitLog pos   TOPICLEN 1, TOPIC (UTF-8, <= 127 bytes)
    SYSFLAG 4                                   PROPERTIESLEN 2, PROPERTIES (<= 32767 bytes)
    BORNTIMESTAMP 8

A host is a 4-byte IPv4 address and a 4-byte port, or 16 + 4 bytes when SYSFLAG has 0x10
(BORNHOST) or 0x20 (STOREHOSTADDRESS).  Prepared and rolled-back transaction messages carry
QUEUEOFFSET 0.

Everything here is a pure function over bytes (no I/O, no Trio):

* ``decode_record`` (Java's ``MessageDecoder.decode``) reads one record at an offset of any
  buffer (bytes, memoryview, mmap) and raises :class:`RecordDecodeError` for anything that is
  not a complete, well-formed record: readers of a torn CommitLog tail must never get garbage
  back.  Trailing bytes after the record are ignored (the caller asked for one record at an
  offset); ``decode_records`` decodes a concatenation and rejects a partial record at the end.
  The common case (IPv4 hosts) takes one ``unpack_from`` for the fixed part; the hosts and the
  properties map of a :class:`MessageExt` are only parsed when read (clients pull thousands of
  records a second and mostly read the body), which is why the decoder lives next to the type.
* BODYCRC is ``crc32(body) & 0x7FFFFFFF`` like ``UtilAll.crc32`` (Java stores the masked value).

The rest of the format has modules of its own, each named for the RocketMQ part it is:
``common.message_encoder`` (the store's put path, Java's ``MessageExtEncoder``),
``common.message_properties`` (``MessageConst`` and the ``k\\x01v\\x02`` codec),
``common.message_id`` (the offset msgId), ``common.batch_body`` (SEND_BATCH_MESSAGE bodies),
``common.socket_address`` (a host as records store it) and ``common.string_hash`` (Java's
``String.hashCode``, for tags codes).  Callers import each name from its home; nothing is
re-exported here.
"""

from __future__ import annotations

import functools
import mmap
import struct
import zlib

import attrs

from common.message_id import create_offset_msg_id
from common.message_properties import MessageConst, decode_properties, encode_properties
from common.socket_address import unpack_host, unpack_ip
from common.string_hash import java_string_hash

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194
MAX_TOPIC_BYTES = 127
MAX_PROPERTIES_BYTES = 32767

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
# TOTALSIZE to BODYLEN with IPv4 hosts (ip+port as 8 raw bytes each): the decoder's fast path
_FIXED_V4 = struct.Struct(">iiiiiqqiq8sq8siqi")
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
# what records are decoded from: a PULL body, a CommitLog segment's memoryview or mmap
RecordBuffer = bytes | bytearray | memoryview | mmap.mmap
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


@functools.lru_cache(maxsize=4096)
def _tags_code_cached(tags: str) -> int:
    return java_string_hash(tags)


def tags_code(tags: str | None) -> int:
    """CQ tagsCode: the tags' Java hash (sign-extended), 0 without tags."""
    if not tags:
        return 0
    return _tags_code_cached(tags)


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


_V6_BITS = MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOSTADDRESS_V6


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
        if isinstance(h, bytes):
            h = self._born_host = unpack_host(h)
        return h

    @property
    def store_host(self) -> tuple[str, int]:
        h = self._store_host
        if isinstance(h, bytes):
            h = self._store_host = unpack_host(h)
        return h

    @property
    def properties(self) -> dict[str, str]:
        p = self._properties
        if isinstance(p, str):
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


def rewritten(
    m: MessageExt | MessageExtBrokerInner,
    topic: str,
    queue_id: int,
    properties: dict[str, str],
    *,
    sys_flag: int | None = None,
    store_host: tuple[str, int] | None = None,
    reconsume_times: int | None = None,
) -> MessageExtBrokerInner:
    """A stored or arriving message written again elsewhere (a retry, a DLQ, a half record and
    its commit, a delayed message's time-up): its flag, body, born time and hosts, sys flag and
    reconsume times carry over unless given."""
    return MessageExtBrokerInner(
        topic=topic,
        queue_id=queue_id,
        flag=m.flag,
        body=m.body,
        properties=properties,
        sys_flag=m.sys_flag if sys_flag is None else sys_flag,
        born_timestamp=m.born_timestamp,
        born_host=m.born_host,
        store_host=m.store_host if store_host is None else store_host,
        reconsume_times=m.reconsume_times if reconsume_times is None else reconsume_times,
    )


@functools.lru_cache(maxsize=1024)
def _topic_from_raw(raw: bytes) -> str:
    return raw.decode("utf-8")


def decode_record(buf: RecordBuffer, offset: int = 0, *, check_crc: bool = False) -> MessageExt:
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


def _decode_record_checked(buf: RecordBuffer, offset: int, check_crc: bool) -> MessageExt:
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
        born_host = (unpack_ip(bytes(buf[pos : pos + hl])), _I.unpack_from(buf, pos + hl)[0])
        pos += hl + 4
        (store_ts,) = _Q.unpack_from(buf, pos)
        pos += 8
        hl = 16 if sys_flag & MessageSysFlag.STOREHOSTADDRESS_V6 else 4
        store_host = (unpack_ip(bytes(buf[pos : pos + hl])), _I.unpack_from(buf, pos + hl)[0])
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


def decode_records(buf: RecordBuffer, *, check_crc: bool = False) -> list[MessageExt]:
    """Decode concatenated records (a PULL body); a partial record at the end raises."""
    out = []
    pos = 0
    n = len(buf)
    while pos < n:
        m = decode_record(buf, pos, check_crc=check_crc)
        out.append(m)
        pos += m.store_size
    return out


def record_properties(buf: RecordBuffer, offset: int = 0) -> dict[str, str]:
    """The properties of the record at ``offset``, without decoding the rest (for filters that
    read only them, as RocketMQ's ``MessageDecoder.decodeProperties``); RecordDecodeError if the
    bytes are not a well-formed record."""
    try:
        (size, magic) = struct.unpack_from(">ii", buf, offset)
        (sys_flag,) = _I.unpack_from(buf, offset + SYSFLAG_POSITION)
        if magic != MESSAGE_MAGIC_CODE or size <= 0 or offset + size > len(buf):
            raise RecordDecodeError(f"not a message record at {offset}")
        pos = offset + BORN_HOST_POSITION
        pos += 20 if sys_flag & MessageSysFlag.BORNHOST_V6 else 8
        pos += 8  # STORETIMESTAMP
        pos += 20 if sys_flag & MessageSysFlag.STOREHOSTADDRESS_V6 else 8
        pos += 12  # RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET
        (body_len,) = _I.unpack_from(buf, pos)
        pos += 4 + body_len
        (topic_len,) = _B.unpack_from(buf, pos)
        pos += 1 + topic_len
        (props_len,) = _H.unpack_from(buf, pos)
        pos += 2
        end = offset + size
        if body_len < 0 or props_len < 0 or pos + props_len != end:
            raise RecordDecodeError(f"record at {offset}: fields do not add up to TOTALSIZE")
        return decode_properties(str(buf[pos:end], "utf-8"))
    except (struct.error, UnicodeDecodeError) as exc:
        raise RecordDecodeError(f"record at {offset}: {exc}") from exc
