"""The numpy record decoder: CommitLog records to a pipeline-schema batch without numba.

Theory of operation
-------------------
A batch is decoded column-wise, never one Python object per message (record starts come from
``pipeline.record_batch``):

1. Fixed-width fields are gathered with numpy: the buffer is viewed as an array of overlapping
   big-endian structs, one starting at *every* byte (``strides=(1,)``), so indexing it with the
   start positions copies each record's 48-byte head in one go.  The fields after the born host
   move by 12 bytes when a host is IPv6 (SYSFLAG bits 0x10/0x20), so their positions are computed
   per row and gathered the same way.
2. Variable-length parts (body, topic, properties) are cut out by Arrow itself: one BinaryArray
   over the whole buffer whose offsets interleave each record's part boundaries
   (body | gap | topic | gap | properties | gap to the next record) is zero-copy, and ``take`` of
   every sixth element copies body, topic and properties into contiguous columns in C++.
   Topic and properties are cast to string, which validates UTF-8.
3. Properties become a MapArray and the tags, keys and UNIQ_KEY columns
   (``pipeline.properties_map``).
4. msgId is UNIQ_KEY when present, else the offset msgId (``pipeline.arrow_columns``).
5. Compressed bodies (SYSFLAG bit 0, zlib) and IPv6 store hosts (for the offset msgId) take a
   per-row path: both are rare.

:func:`decode_general` takes any records, checks each like ``common.message.decode_record``
does (magic, sizes, field lengths adding up to TOTALSIZE, UTF-8) and raises
:class:`RecordDecodeError` naming the first bad one: it is the one author of every decode
error, the compiled path's too.  :func:`decode_fast` is the common case (IPv4 hosts, sound
records) in one gather; it returns None rather than raising, and the caller falls back to
:func:`decode_general`, so the two cannot disagree on what is an error.
"""

from __future__ import annotations

from typing import NoReturn

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from common.message import (
    MESSAGE_MAGIC_CODE,
    MessageSysFlag,
    RecordBuffer,
    RecordDecodeError,
    record_size,
)
from common.message_properties import MessageConst
from pipeline.arrow_columns import constant_string, inflate, offset_msg_ids, timestamps
from pipeline.properties_map import parse_properties
from pipeline.schema import arrow_schema

MIN_RECORD_SIZE = record_size(0, 0, 0, 0)

_HEAD = np.dtype(
    {
        "names": ["size", "magic", "queue_id", "queue_offset", "phys", "sys_flag", "born_ts"],
        "formats": [">i4", ">i4", ">i4", ">i8", ">i8", ">i4", ">i8"],
        "offsets": [0, 4, 12, 20, 28, 36, 40],
        "itemsize": 48,
    }
)
# RECONSUMETIMES PREPAREDTXOFFSET BODYLEN
_MID = np.dtype(
    {
        "names": ["reconsume", "body_len"],
        "formats": [">i4", ">i4"],
        "offsets": [0, 12],
        "itemsize": 16,
    }
)
# two uppercase hex digits per byte value, as one uint16 in memory order


def _strided(arr: np.ndarray, dtype: npt.DTypeLike) -> np.ndarray:
    """``arr`` (uint8) seen as one ``dtype`` struct starting at every byte."""
    dtype = np.dtype(dtype)
    count = len(arr) - dtype.itemsize + 1
    if count <= 0:
        return np.empty(0, dtype=dtype)
    return np.ndarray(shape=(count,), dtype=dtype, buffer=arr, offset=0, strides=(1,))


def _fail(s: np.ndarray, bad: np.ndarray, what: str) -> NoReturn:
    i = int(np.flatnonzero(bad)[0])
    raise RecordDecodeError(f"record at {int(s[i])}: {what}")


def decode_general(buf: RecordBuffer, broker_name: str, s: np.ndarray) -> pa.RecordBatch:
    """Any records (IPv6 hosts too); checks each and raises naming the first bad one."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    nbuf = len(arr)
    n = len(s)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=arrow_schema())
    if n > 1 and not bool(np.all(s[1:] > s[:-1])):
        raise ValueError("record starts must be strictly increasing")
    if int(s[0]) < 0 or int(s[-1]) + MIN_RECORD_SIZE > nbuf:
        bad = (s < 0) | (s + MIN_RECORD_SIZE > nbuf)
        _fail(s, bad, "truncated record header")

    head = _strided(arr, _HEAD)[s]
    size = head["size"].astype(np.int64)
    magic = head["magic"]
    bad = magic != MESSAGE_MAGIC_CODE
    if bad.any():
        _fail(s, bad, "not a message record (bad magic)")
    end = s + size
    bad = (size < MIN_RECORD_SIZE) | (end > nbuf)
    if bad.any():
        _fail(s, bad, "impossible size or truncated record")
    sys_flag = head["sys_flag"].astype(np.int32)
    born_len = np.where(sys_flag & MessageSysFlag.BORNHOST_V6, 20, 8)
    store_len = np.where(sys_flag & MessageSysFlag.STOREHOSTADDRESS_V6, 20, 8)
    sts_pos = s + 48 + born_len
    mid_pos = sts_pos + 8 + store_len
    body_start = mid_pos + 16
    bad = body_start + 3 > end
    if bad.any():
        _fail(s, bad, "declares a size too small for its hosts")
    store_ts = _strided(arr, ">i8")[sts_pos]
    mid = _strided(arr, _MID)[mid_pos]
    body_len = mid["body_len"].astype(np.int64)
    p = body_start + body_len
    bad = (body_len < 0) | (p + 3 > end)
    if bad.any():
        _fail(s, bad, "body length overruns record")
    topic_start = p + 1
    topic_end = topic_start + arr[p]
    bad = topic_end + 2 > end
    if bad.any():
        _fail(s, bad, "topic length overruns record")
    props_start = topic_end + 2
    props_len = _strided(arr, ">i2")[topic_end].astype(np.int64)
    bad = props_start + props_len != end
    if bad.any():
        _fail(s, bad, "field lengths disagree with TOTALSIZE")

    # body | gap | topic | gap | properties | gap: one zero-copy array, three takes
    base = int(s[0])
    bounds = np.empty((n, 6), dtype=np.int64)
    bounds[:, 0] = body_start
    bounds[:, 1] = p
    bounds[:, 2] = topic_start
    bounds[:, 3] = topic_end
    bounds[:, 4] = props_start
    bounds[:, 5] = end
    offsets = (bounds.ravel() - base).astype(np.int32)
    top = int(end[-1])
    parts = pa.Array.from_buffers(
        pa.binary(),
        6 * n - 1,
        [None, pa.py_buffer(offsets), pa.py_buffer(arr[base:top])],
    )
    idx = np.arange(0, 6 * n, 6, dtype=np.int64)
    body = parts.take(pa.array(idx))
    try:
        topic = parts.take(pa.array(idx + 2)).cast(pa.string())
        props_str = parts.take(pa.array(idx + 4)).cast(pa.string())
    except pa.ArrowInvalid as exc:
        _fail_utf8(parts, s, n, exc)
    del parts

    compressed = (sys_flag & MessageSysFlag.COMPRESSED) != 0
    if compressed.any():
        body = inflate(body, compressed, s)

    props, lookups = parse_properties(props_str, n)
    tags = lookups[MessageConst.TAGS]
    keys = lookups[MessageConst.KEYS]
    uniq = lookups[MessageConst.UNIQ_KEY]

    # offset msgId: hex(store host ip+port, PHYSICALOFFSET)
    if bool((store_len == 8).all()):
        raw = np.empty((n, 16), dtype=np.uint8)
        u8 = _strided(arr, ">u8")
        raw[:, :8] = u8[sts_pos + 8].astype(">u8").view(np.uint8).reshape(n, 8)
        raw[:, 8:] = u8[s + 28].astype(">u8").view(np.uint8).reshape(n, 8)
        offset_id = offset_msg_ids(raw)
    else:
        ids = []
        for i in range(n):
            h0 = int(sts_pos[i]) + 8
            host = bytes(arr[h0 : h0 + int(store_len[i])])
            ids.append((host + bytes(arr[int(s[i]) + 28 : int(s[i]) + 36])).hex().upper())
        offset_id = pa.array(ids, pa.string())
    msg_id = pc.coalesce(uniq, offset_id)

    return pa.RecordBatch.from_arrays(
        [
            topic,
            constant_string(broker_name.encode("utf-8"), n),
            pa.array(head["queue_id"].astype(np.int32)),
            pa.array(head["queue_offset"].astype(np.int64)),
            body,
            tags,
            keys,
            props,
            msg_id,
            timestamps(head["born_ts"]),
            timestamps(store_ts),
            pa.array(mid["reconsume"].astype(np.int32)),
        ],
        schema=arrow_schema(),
    )


def _fail_utf8(parts: pa.Array, s: np.ndarray, n: int, exc: Exception) -> NoReturn:
    for i in range(n):
        for k, what in ((2, "topic"), (4, "properties")):
            v = parts[6 * i + k].as_py()
            try:
                v.decode("utf-8")
            except UnicodeDecodeError:
                raise RecordDecodeError(f"record at {int(s[i])}: {what} is not UTF-8") from exc
    raise RecordDecodeError(f"invalid UTF-8: {exc}") from exc


# ------------------------------------------------------------------------------- fast paths
# IPv4 hosts: every field up to BODYLEN sits at a fixed position (the table in common/message.py)
_FIXED = np.dtype(
    {
        "names": [
            "size",
            "magic",
            "queue_id",
            "queue_offset",
            "phys",
            "sys_flag",
            "born_ts",
            "store_ts",
            "store_host",
            "reconsume",
            "body_len",
        ],
        "formats": [">i4", ">i4", ">i4", ">i8", ">i8", ">i4", ">i8", ">i8", ">u8", ">i4", ">i4"],
        "offsets": [0, 4, 12, 20, 28, 36, 40, 56, 64, 72, 84],
        "itemsize": 88,
    }
)
_V6 = MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOSTADDRESS_V6


def _rows(arr: np.ndarray, width: int) -> np.ndarray:
    """``arr`` seen as overlapping rows of ``width`` bytes, one starting at every byte."""
    count = max(len(arr) - width + 1, 0)
    return np.lib.stride_tricks.as_strided(arr, shape=(count, width), strides=(1, 1))


def _same_bytes(arr: np.ndarray, starts: np.ndarray, value: bytes) -> bool:
    """Whether ``arr[s : s + len(value)] == value`` for every s in ``starts``."""
    width = len(value)
    if width == 0:
        return True
    if width < 8:
        return bool((_rows(arr, width)[starts] == np.frombuffer(value, np.uint8)).all())
    u8 = _strided(arr, "<u8")
    want = np.frombuffer(value, np.uint8)
    for k in (*range(0, width - 8, 8), width - 8):
        if not bool((u8[starts + k] == want[k : k + 8].view("<u8")[0]).all()):
            return False
    return True


def decode_fast(arr: np.ndarray, broker_name: str, s: np.ndarray) -> pa.RecordBatch | None:
    """The common case: IPv4 hosts and sound records.  None means "use :func:`decode_general`".

    One row gather copies every fixed field; body, topic and properties are cut like in the
    general path, but a topic shared by all rows (the usual batch) is checked with a few 8-byte
    gathers and built once.  Any failed check hands the batch to the general path, which names
    the bad record, so the two cannot disagree on what is an error.
    """
    nbuf = len(arr)
    n = len(s)
    head = _rows(arr, _FIXED.itemsize)[s].view(_FIXED).reshape(n)
    sys_flag = head["sys_flag"].astype(np.int32)
    if bool((sys_flag & _V6).any()) or bool((head["magic"] != MESSAGE_MAGIC_CODE).any()):
        return None
    size = head["size"].astype(np.int64)
    end = s + size
    body_start = s + 88
    body_len = head["body_len"].astype(np.int64)
    p = body_start + body_len
    if (
        bool((size < MIN_RECORD_SIZE).any())
        or int(end.max()) > nbuf
        or bool((body_len < 0).any())
        or bool((p + 3 > end).any())
    ):
        return None
    topic_len = arr[p].astype(np.int64)
    topic_start = p + 1
    topic_end = topic_start + topic_len
    if bool((topic_end + 2 > end).any()):
        return None
    props_start = topic_end + 2
    if bool((props_start + _strided(arr, ">i2")[topic_end] != end).any()):
        return None

    base = int(s[0])
    bounds = np.empty((n, 6), dtype=np.int64)
    bounds[:, 0] = body_start
    bounds[:, 1] = p
    bounds[:, 2] = topic_start
    bounds[:, 3] = topic_end
    bounds[:, 4] = props_start
    bounds[:, 5] = end
    offsets = (bounds.ravel() - base).astype(np.int32)
    parts = pa.Array.from_buffers(
        pa.binary(),
        6 * n - 1,
        [None, pa.py_buffer(offsets), pa.py_buffer(arr[base : int(end[-1])])],
    )
    idx = np.arange(0, 6 * n, 6, dtype=np.int64)
    body = parts.take(pa.array(idx))
    first_topic = bytes(arr[int(topic_start[0]) : int(topic_end[0])])
    try:
        if bool((topic_len == len(first_topic)).all()) and _same_bytes(
            arr, topic_start, first_topic
        ):
            first_topic.decode("utf-8")
            topic = constant_string(first_topic, n)
        else:
            topic = parts.take(pa.array(idx + 2)).cast(pa.string())
        props_str = parts.take(pa.array(idx + 4)).cast(pa.string())
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return None
    del parts

    compressed = (sys_flag & MessageSysFlag.COMPRESSED) != 0
    if compressed.any():
        body = inflate(body, compressed, s)
    props, lookups = parse_properties(props_str, n)
    uniq = lookups[MessageConst.UNIQ_KEY]
    if uniq.null_count == 0:
        msg_id = uniq
    else:
        raw = np.empty((n, 16), dtype=np.uint8)
        raw[:, :8] = head["store_host"].astype(">u8").view(np.uint8).reshape(n, 8)
        raw[:, 8:] = head["phys"].astype(">u8").view(np.uint8).reshape(n, 8)
        offset_id = offset_msg_ids(raw)
        msg_id = pc.coalesce(uniq, offset_id)
    return pa.RecordBatch.from_arrays(
        [
            topic,
            constant_string(broker_name.encode("utf-8"), n),
            pa.array(head["queue_id"].astype(np.int32)),
            pa.array(head["queue_offset"].astype(np.int64)),
            body,
            lookups[MessageConst.TAGS],
            lookups[MessageConst.KEYS],
            props,
            msg_id,
            timestamps(head["born_ts"]),
            timestamps(head["store_ts"]),
            pa.array(head["reconsume"].astype(np.int32)),
        ],
        schema=arrow_schema(),
    )
