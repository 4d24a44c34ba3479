"""Dispatch: what a CommitLog record becomes in the ConsumeQueue and the index (RocketMQ
``CommitLog.checkMessageAndReturnSize`` + ``CommitLogDispatcherBuildConsumeQueue`` /
``CommitLogDispatcherBuildIndex``).

Theory of operation
-------------------
This module is the one place that decides, for a record, which ConsumeQueue unit and which index
entries it gets.  The rules:

* a unit ``(commitLogOffset, size, tagsCode)`` at the record's queue offset, unless the record
  is a prepared or rolled-back transaction half (``takes_queue_unit``);
* ``tagsCode`` is the tags' Java hash, except in ``SCHEDULE_TOPIC`` where it is the time the
  message is due (store timestamp + its level's delay), which the schedule service scans by
  (``dispatch_tags_code``);
* index entries ``topic#key`` for the UNIQ_KEY and every non-empty KEYS token
  (``index_key_names``), unless the record is a rolled-back transaction (``takes_index_entries``)
  or the index is disabled.

They reach the stores by two paths that apply the same functions:

* ``parse_record`` reads the fields dispatch needs from raw bytes (bytes a slave received
  over HA, records recovery re-dispatches, the in-memory store) into a :class:`DispatchRequest`;
  the put path builds the same request from the message when the reput task is behind
  (``request_for_put``);
* ``dispatch_put`` is the file store's fast path for a put that arrives while reput is caught
  up: the same rules over the messages just encoded, without building a request per record,
  yielding runs of packed units (one copy per queue run) and index entries as key hashes.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Sequence
from typing import Final, NamedTuple

from broker.store.consumequeue import CQ_UNIT
from broker.store.index import topic_key_hash
from broker.store.results import Buffer
from common.message import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    MessageExtBrokerInner,
    MessageSysFlag,
    RecordDecodeError,
    tags_code,
)
from common.message_properties import MessageConst, decode_properties
from common.topics import SCHEDULE_TOPIC

_TRANSACTION_MASK = MessageSysFlag.TRANSACTION_MASK
_PREPARED = MessageSysFlag.TRANSACTION_PREPARED
_ROLLBACK = MessageSysFlag.TRANSACTION_ROLLBACK
_TAGS = MessageConst.TAGS
_UNIQ_KEY = MessageConst.UNIQ_KEY
_KEYS = MessageConst.KEYS
_KEY_SEPARATOR = MessageConst.KEY_SEPARATOR


# ------------------------------------------------------------------------------------ rules


def takes_queue_unit(sys_flag: int) -> bool:
    """Prepared and rolled-back transaction halves get no ConsumeQueue unit (nor an offset)."""
    t = sys_flag & _TRANSACTION_MASK
    return t != _PREPARED and t != _ROLLBACK


def takes_index_entries(sys_flag: int) -> bool:
    """A rolled-back transaction half is not indexed (a prepared one is: checks look it up)."""
    return sys_flag & _TRANSACTION_MASK != _ROLLBACK


def delay_level_of(props: dict[str, str]) -> int:
    v = props.get(MessageConst.DELAY)
    if not v:
        return 0
    try:
        return int(v)
    except ValueError:
        return 0


def dispatch_tags_code(
    topic: str, props: dict[str, str], store_timestamp: int, delay_millis: tuple[int, ...]
) -> int:
    """CQ tagsCode: the tags' hash, or the deliver timestamp of a delayed message."""
    if topic == SCHEDULE_TOPIC:
        level = delay_level_of(props)
        if level > 0:
            level = min(level, len(delay_millis))
            return store_timestamp + delay_millis[level - 1]
    return tags_code(props.get(_TAGS))


def index_key_names(props: dict[str, str]) -> list[str]:
    """The keys a record is indexed by: its UNIQ_KEY and every non-empty KEYS token."""
    uniq = props.get(_UNIQ_KEY)
    out = [uniq] if uniq else []
    keys = props.get(_KEYS)
    if keys:
        out.extend(k for k in keys.split(_KEY_SEPARATOR) if k)
    return out


def index_keys(topic: str, props: dict[str, str]) -> tuple[str, ...]:
    """Index keys as stored and queried: ``topic#key``."""
    return tuple(f"{topic}#{k}" for k in index_key_names(props))


# ------------------------------------------------------------------------------------ requests


class DispatchRequest(NamedTuple):
    """What the reput dispatcher needs from one record (CommitLog.checkMessageAndReturnSize).

    A NamedTuple: one is built per message when reput is behind, so construction must be cheap.
    """

    topic: str
    queue_id: int
    commit_log_offset: int
    msg_size: int
    tags_code: int
    store_timestamp: int
    consume_queue_offset: int
    sys_flag: int
    keys: tuple[str, ...]  # index keys, "topic#key"


def request_for_put(
    msg: MessageExtBrokerInner,
    phys: int,
    size: int,
    queue_offset: int,
    store_timestamp: int,
    delay_millis: tuple[int, ...],
) -> DispatchRequest:
    """The request for a record the put path just wrote (no re-parse of its bytes)."""
    topic, props = msg.topic, msg.properties
    return DispatchRequest(
        topic,
        msg.queue_id,
        phys,
        size,
        dispatch_tags_code(topic, props, store_timestamp, delay_millis),
        store_timestamp,
        queue_offset,
        msg.sys_flag,
        index_keys(topic, props),
    )


class NotARecord(enum.Enum):
    """``parse_record`` outcomes besides a DispatchRequest."""

    # not enough bytes yet (an HA chunk boundary, or a torn tail)
    PARTIAL = "partial"
    # the end-of-file filler: continue at the next file
    BLANK = "blank"


PARTIAL: Final = NotARecord.PARTIAL
BLANK: Final = NotARecord.BLANK


class Framing(enum.Enum):
    """What a CommitLog with its own framing finds besides records (``ReputService.parse_at``)."""

    # an entry with nothing to dispatch (a DLedger no-op): continue after its size
    SKIP = "skip"


SKIP: Final = Framing.SKIP

_HEAD2 = struct.Struct(">ii")
_HEAD9 = struct.Struct(">iiiiiqqiq")
_BORN_V6 = MessageSysFlag.BORNHOST_V6
_STORE_V6 = MessageSysFlag.STOREHOSTADDRESS_V6
# from a record's start to STORETIMESTAMP: the 48 fixed bytes, then BORNHOST (8, or 20 for v6)
_STORE_TS_V4, _STORE_TS_V6 = 48 + 8, 48 + 20
# from STORETIMESTAMP to BODYLENGTH: itself (8), STOREHOST (8 or 20), RECONSUME, PREPARED OFFSET
_BODY_LEN_V4, _BODY_LEN_V6 = 8 + 8 + 12, 8 + 20 + 12
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_H = struct.Struct(">h")


def parse_record(
    buf: Buffer, pos: int, end: int, delay_millis: tuple[int, ...], *, check_crc: bool
) -> tuple[DispatchRequest | NotARecord, int]:
    """Classify the bytes at ``buf[pos:end]``.

    Returns ``(PARTIAL, 0)``, ``(BLANK, size)``, ``(DispatchRequest, size)``; raises
    RecordDecodeError for bytes that can never become a valid record (bad magic, size or CRC).
    """
    if end - pos < 8:
        return PARTIAL, 0
    size, magic = _HEAD2.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        if size < 8:
            raise RecordDecodeError(f"BLANK filler with size {size}")
        return BLANK, size
    if magic != MESSAGE_MAGIC_CODE:
        raise RecordDecodeError(f"bad magic {magic:#x}")
    if size <= 0:
        raise RecordDecodeError(f"bad record size {size}")
    if end - pos < size:
        return PARTIAL, 0
    # Parse only what dispatch needs, without copying the body.  This runs for every record a
    # slave, a DLedger member or a recovery dispatches (~2.5 us of Python a record), so the
    # fixed offsets are folded into constants and the common property cases are inline.
    try:
        (_, _, crc, queue_id, _, qoff, poff, sys_flag, _) = _HEAD9.unpack_from(buf, pos)
        p = pos + (_STORE_TS_V6 if sys_flag & _BORN_V6 else _STORE_TS_V4)
        (store_ts,) = _Q.unpack_from(buf, p)
        p += _BODY_LEN_V6 if sys_flag & _STORE_V6 else _BODY_LEN_V4
        (body_len,) = _I.unpack_from(buf, p)
        p += 4
        if body_len < 0 or p + body_len + 3 > pos + size:
            raise RecordDecodeError(f"body length {body_len} overruns the record")
        if check_crc and (zlib.crc32(buf[p : p + body_len]) & 0x7FFFFFFF) != crc:
            raise RecordDecodeError("body CRC mismatch")
        p += body_len
        topic_len = buf[p]
        p += 1
        topic = str(buf[p : p + topic_len], "utf-8")
        p += topic_len
        (props_len,) = _H.unpack_from(buf, p)
        p += 2
        if props_len < 0 or p + props_len != pos + size:
            raise RecordDecodeError("field lengths disagree with TOTALSIZE")
        # no topic or property holds NUL: a zero byte ending them is a tail a lost write left
        if (topic_len and buf[p - 3] == 0) or (props_len and buf[pos + size - 1] == 0):
            raise RecordDecodeError("the record ends in zeros (a torn write)")
        props = decode_properties(str(buf[p : p + props_len], "utf-8"))
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise RecordDecodeError(str(exc)) from exc
    if topic == SCHEDULE_TOPIC:
        tags = dispatch_tags_code(topic, props, store_ts, delay_millis)
    else:
        t = props.get(_TAGS)
        tags = tags_code(t) if t else 0
    uniq = props.get(_UNIQ_KEY)
    if _KEYS in props:
        keys = index_keys(topic, props)
    else:
        keys = (topic + "#" + uniq,) if uniq else ()
    return DispatchRequest(topic, queue_id, poff, size, tags, store_ts, qoff, sys_flag, keys), size


# ------------------------------------------------------------------------------------ fast path


class UnitRun(NamedTuple):
    """Packed units for consecutive offsets of one queue, from ``first_offset``."""

    key: tuple[str, int]
    first_offset: int
    units: bytearray


def dispatch_put(
    msgs: Sequence[MessageExtBrokerInner],
    sizes: Sequence[int],
    queue_offsets: Sequence[int],
    phys: int,
    store_timestamp: int,
    delay_millis: tuple[int, ...],
    *,
    index_enabled: bool,
) -> tuple[list[UnitRun], list[tuple[int, int]]]:
    """The units and index entries ``(key hash, phys)`` of one put's records written at ``phys``.

    The same rules as a :class:`DispatchRequest` gets, in fewer steps: consecutive records of one
    queue become one run (one copy into the ConsumeQueue), keys are hashed without building the
    ``topic#key`` strings (``index.topic_key_hash``).
    """
    runs: list[UnitRun] = []
    entries: list[tuple[int, int]] = []
    run_key: tuple[str, int] | None = None
    units = bytearray()  # the current run's (a bytearray grows in place)
    next_q = 0  # the offset the current run's next unit must have to extend it
    pack_unit = CQ_UNIT.pack
    for m, size, q in zip(msgs, sizes, queue_offsets, strict=True):
        props = m.properties
        topic = m.topic
        sys_flag = m.sys_flag
        if takes_queue_unit(sys_flag):
            if q != next_q or run_key != (topic, m.queue_id):
                run_key = (topic, m.queue_id)
                units = bytearray()
                runs.append(UnitRun(run_key, q, units))
            units += pack_unit(
                phys, size, dispatch_tags_code(topic, props, store_timestamp, delay_millis)
            )
            next_q = q + 1
        if index_enabled and takes_index_entries(sys_flag):
            for k in index_key_names(props):
                entries.append((topic_key_hash(topic, k), phys))
        phys += size
    return runs, entries


__all__ = [
    "BLANK",
    "PARTIAL",
    "SKIP",
    "DispatchRequest",
    "Framing",
    "NotARecord",
    "UnitRun",
    "delay_level_of",
    "dispatch_put",
    "dispatch_tags_code",
    "index_key_names",
    "index_keys",
    "parse_record",
    "request_for_put",
    "takes_index_entries",
    "takes_queue_unit",
]
