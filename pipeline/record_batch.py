"""Vectorized CommitLog record decoding into Arrow record batches of the pipeline schema.

Theory of operation
-------------------
A PULL response body and a CommitLog segment hold the same records (facts §4.1), and Spark wants
Arrow batches, so a batch is decoded column-wise, never one Python object per message:

1. Record starts come from the caller (``starts``: a segment scan, ``broker.store.commitlog_scan``)
   or from one tight walk over the 4-byte TOTALSIZEs (BLANK filler is stepped over).
2. Fixed-width fields are gathered with numpy: the buffer is viewed as an array of overlapping
   big-endian structs, one starting at *every* byte (``strides=(1,)``), so indexing it with the
   start positions copies each record's 48-byte head in one go.  The fields after the born host
   move by 12 bytes when a host is IPv6 (SYSFLAG bits 0x10/0x20), so their positions are computed
   per row and gathered the same way.
3. Variable-length parts (body, topic, properties) are cut out by Arrow itself: one BinaryArray
   over the whole buffer whose offsets interleave each record's part boundaries
   (body | gap | topic | gap | properties | gap to the next record) is zero-copy, and ``take`` of
   every sixth element copies body, topic and properties into contiguous columns in C++.
   Topic and properties are cast to string, which validates UTF-8.
4. Properties ``k\\x01v\\x02k\\x01v`` (facts §4.5) are split with ``pyarrow.compute`` into a
   MapArray with Java's tolerance (a segment needs a non-empty key and value), and tags, keys and
   UNIQ_KEY are looked up in it.  A record that repeats a property name is rare enough to be
   rebuilt with ``common.message.decode_properties`` (last value wins, like a Java HashMap).
5. msgId is UNIQ_KEY when present, else the offset msgId: uppercase hex of the store host
   (ip + port) and the PHYSICALOFFSET, made with a 256-entry hex table.
6. Compressed bodies (SYSFLAG bit 0, zlib) and IPv6 store hosts (for the offset msgId) take a
   per-row path: both are rare.

With numba installed (the "spark" extra) the work is done by the compiled kernels of
``pipeline._kernels`` instead (:func:`_decode_compiled`: two passes, ~2x the numpy path per
core); anything they find wrong is handed to the numpy general path below so every error has one
wording.  The numpy paths stay as the fallback without numba and as a second oracle in the
tests: keeping them costs no duplication of semantics the tests do not hold equal.

Every record is checked like ``common.message.decode_record`` checks it (magic, sizes, field
lengths adding up to TOTALSIZE, UTF-8) and a bad one raises :class:`RecordDecodeError` naming its
offset; the result agrees with ``decode_record`` on every field (tests hold it with hypothesis).
Timestamps are milliseconds in the record and microseconds in Arrow; a value outside Spark's
range (years 1-9999) becomes null rather than wrapping.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker.store import commitlog_scan
from common.message import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    MessageSysFlag,
    RecordDecodeError,
    record_size,
)
from common.message_properties import MessageConst, decode_properties
from pipeline.schema import arrow_schema

try:
    from pipeline import _kernels
except ImportError:  # numba is in the "spark" extra; without it the numpy path below decodes
    _kernels = None
else:
    commitlog_scan.use_compiled_chain(_kernels.chain)

__all__ = ["RecordDecodeError", "decode_records", "walk_records"]

MIN_RECORD_SIZE = record_size(0, 0, 0, 0)
_HEAD2 = struct.Struct(">ii")
# offsets of 32-bit Arrow arrays: one batch must span less than 2 GiB
_MAX_SPAN = (1 << 31) - 1

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
_HEX16 = np.frombuffer(b"".join(f"{i:02X}".encode() for i in range(256)), dtype=np.uint16)
# Spark's TimestampType covers 0001-01-01 .. 9999-12-31 (UTC), in milliseconds here
_MIN_MS = -62135596800000
_MAX_MS = 253402300799999


def _strided(arr: np.ndarray, dtype) -> np.ndarray:
    """``arr`` (uint8) seen as one ``dtype`` struct starting at every byte."""
    dtype = np.dtype(dtype)
    count = len(arr) - dtype.itemsize + 1
    if count <= 0:
        return np.empty(0, dtype=dtype)
    return np.ndarray(shape=(count,), dtype=dtype, buffer=arr, offset=0, strides=(1,))


def walk_records(buf) -> np.ndarray:
    """Start positions of the records of ``buf`` (a PULL body or a whole segment).

    BLANK filler is stepped over; anything else that is not a complete record raises.
    """
    if _kernels is not None and len(buf):
        starts, status, _ = _kernels.walk(np.frombuffer(buf, dtype=np.uint8))
        if status == _kernels.WALK_OK:
            return starts
    return _walk_python(buf)


def _walk_python(buf) -> np.ndarray:
    """The plain walk: the fallback without numba, and the wording of every walk error."""
    n = len(buf)
    unpack = _HEAD2.unpack_from
    starts: list[int] = []
    add = starts.append
    pos = 0
    while pos < n:
        if pos + 8 > n:
            raise RecordDecodeError(f"truncated record header at {pos} (buffer {n} bytes)")
        size, magic = unpack(buf, pos)
        if magic == MESSAGE_MAGIC_CODE:
            if size < MIN_RECORD_SIZE:
                raise RecordDecodeError(f"record at {pos} declares impossible size {size}")
            if pos + size > n:
                raise RecordDecodeError(
                    f"truncated record at {pos}: needs {size} bytes, has {n - pos}"
                )
            add(pos)
        elif magic == BLANK_MAGIC_CODE:
            if size < 8:
                raise RecordDecodeError(f"BLANK filler at {pos} with size {size}")
        else:
            raise RecordDecodeError(f"not a message record at {pos}: bad magic {magic:#x}")
        pos += size
    return np.fromiter(starts, dtype=np.int64, count=len(starts))


def decode_records(buf, *, broker_name: str, starts=None) -> pa.RecordBatch:
    """Decode every record of ``buf`` (or those at ``starts``) into one pipeline-schema batch."""
    if starts is None:
        starts = walk_records(buf)
    else:
        starts = np.asarray(starts, dtype=np.int64)
    if len(starts) and int(starts[-1]) - int(starts[0]) >= _MAX_SPAN - (1 << 20):
        half = len(starts) // 2
        first = decode_records(buf, broker_name=broker_name, starts=starts[:half])
        second = decode_records(buf, broker_name=broker_name, starts=starts[half:])
        return pa.Table.from_batches([first, second]).combine_chunks().to_batches()[0]
    return _decode(buf, broker_name, starts)


def _decode(buf, broker_name: str, s: np.ndarray) -> pa.RecordBatch:
    arr = np.frombuffer(buf, dtype=np.uint8)
    n = len(s)
    if _kernels is not None and n:
        batch = _decode_compiled(arr, broker_name, s)
        if batch is not None:
            return batch
        return _decode_general(buf, broker_name, s)
    if n and int(s[0]) >= 0 and int(s[-1]) + MIN_RECORD_SIZE <= len(arr):
        if n == 1 or bool(np.all(s[1:] > s[:-1])):
            batch = _decode_fast(arr, broker_name, s)
            if batch is not None:
                return batch
    return _decode_general(buf, broker_name, s)


def _fail(s: np.ndarray, bad: np.ndarray, what: str):
    i = int(np.flatnonzero(bad)[0])
    raise RecordDecodeError(f"record at {int(s[i])}: {what}")


def _decode_general(buf, broker_name: str, s: np.ndarray) -> pa.RecordBatch:
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
        body = _inflate(body, compressed, s)

    props, lookups = _properties(props_str, n)
    tags = lookups[MessageConst.TAGS]
    keys = lookups[MessageConst.KEYS]
    uniq = lookups[MessageConst.UNIQ_KEY]

    # offset msgId: hex(store host ip+port, PHYSICALOFFSET)
    if bool((store_len == 8).all()):
        raw = np.empty((n, 16), dtype=np.uint8)
        u8 = _strided(arr, ">u8")
        raw[:, :8] = u8[sts_pos + 8].astype(">u8").view(np.uint8).reshape(n, 8)
        raw[:, 8:] = u8[s + 28].astype(">u8").view(np.uint8).reshape(n, 8)
        hexed = _HEX16[raw].view(np.uint8).reshape(-1)
        offset_id = pa.Array.from_buffers(
            pa.string(),
            n,
            [None, pa.py_buffer(np.arange(0, 32 * n + 1, 32, dtype=np.int32)), pa.py_buffer(hexed)],
        )
    else:
        ids = []
        for i in range(n):
            h0 = int(sts_pos[i]) + 8
            host = bytes(arr[h0 : h0 + int(store_len[i])])
            ids.append((host + bytes(arr[int(s[i]) + 28 : int(s[i]) + 36])).hex().upper())
        offset_id = pa.array(ids, pa.string())
    msg_id = pc.coalesce(uniq, offset_id)

    name_b = broker_name.encode("utf-8")
    broker = pa.Array.from_buffers(
        pa.string(),
        n,
        [
            None,
            pa.py_buffer(
                np.arange(0, len(name_b) * n + 1, max(len(name_b), 1), dtype=np.int32)
                if name_b
                else np.zeros(n + 1, dtype=np.int32)
            ),
            pa.py_buffer(name_b * n),
        ],
    )
    return pa.RecordBatch.from_arrays(
        [
            topic,
            broker,
            pa.array(head["queue_id"].astype(np.int32)),
            pa.array(head["queue_offset"].astype(np.int64)),
            body,
            tags,
            keys,
            props,
            msg_id,
            _timestamps(head["born_ts"]),
            _timestamps(store_ts),
            pa.array(mid["reconsume"].astype(np.int32)),
        ],
        schema=arrow_schema(),
    )


def _timestamps(ms) -> pa.Array:
    ms = ms.astype(np.int64)
    ok = (ms >= _MIN_MS) & (ms <= _MAX_MS)
    us = np.where(ok, ms, 0) * 1000
    ts = pa.timestamp("us", tz="UTC")
    if ok.all():
        return pa.array(us, ts)
    return pa.array(us, ts, mask=~ok)


def _fail_utf8(parts: pa.Array, s: np.ndarray, n: int, exc: Exception):
    for i in range(n):
        for k, what in ((2, "topic"), (4, "properties")):
            v = parts[6 * i + k].as_py()
            try:
                v.decode("utf-8")
            except UnicodeDecodeError:
                raise RecordDecodeError(f"record at {int(s[i])}: {what} is not UTF-8") from exc
    raise RecordDecodeError(f"invalid UTF-8: {exc}") from exc


def _inflate(body: pa.Array, compressed: np.ndarray, s: np.ndarray) -> pa.Array:
    values = body.to_pylist()
    for i in np.flatnonzero(compressed):
        try:
            values[i] = zlib.decompress(values[i])
        except zlib.error as exc:
            raise RecordDecodeError(
                f"record at {int(s[i])}: compressed body does not inflate: {exc}"
            ) from exc
    return pa.array(values, pa.binary())


_LOOKUP_KEYS = (MessageConst.TAGS, MessageConst.KEYS, MessageConst.UNIQ_KEY)


def _cut(data: pa.Buffer, starts: np.ndarray, ends: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """Two string arrays ``data[starts[i]:ends[i]]`` for i even/odd of sorted, disjoint ranges.

    ``starts``/``ends`` alternate key, value, key, value...; the gaps between ranges become
    elements of a zero-copy array too, and ``take`` copies the wanted ones out.
    """
    m = len(starts)
    bounds = np.empty((m, 2), dtype=np.int32)
    bounds[:, 0] = starts
    bounds[:, 1] = ends
    arr = pa.Array.from_buffers(
        pa.binary(), max(2 * m - 1, 0), [None, pa.py_buffer(bounds.ravel()), data]
    )
    keys = arr.take(pa.array(np.arange(0, 2 * m, 4, dtype=np.int32))).view(pa.string())
    values = arr.take(pa.array(np.arange(2, 2 * m, 4, dtype=np.int32))).view(pa.string())
    return keys, values


def _properties(props_str: pa.Array, n: int) -> tuple[pa.Array, dict[str, pa.Array]]:
    """MapArray of the properties strings and the TAGS/KEYS/UNIQ_KEY columns."""
    done = _properties_fast(props_str, n)
    if done is not None:
        return done
    return _properties_general(props_str, n)


def _properties_general(props_str: pa.Array, n: int) -> tuple[pa.Array, dict[str, pa.Array]]:
    """Any properties strings, with every tolerance of Java's parser.

    Works on the raw bytes: segments end at each \x02 and at each row end; a segment's key ends
    at its first \x01.  The strings are valid UTF-8 already and \x01/\x02 are ASCII, so the
    pieces are too.
    """
    _, off_buf, data_buf = props_str.buffers()
    offs = np.frombuffer(off_buf, dtype=np.int32)[props_str.offset : props_str.offset + n + 1]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    )
    lo, hi = int(offs[0]), int(offs[-1])
    region = data[lo:hi]
    sep2 = np.flatnonzero(region == 2) + lo
    sep1 = np.flatnonzero(region == 1) + lo
    row_of_sep = np.searchsorted(offs[1:], sep2, side="right")
    per_row = np.bincount(row_of_sep, minlength=n) + 1
    seg_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(per_row, out=seg_off[1:])
    nseg = int(seg_off[-1])
    seg_start = np.empty(nseg, dtype=np.int64)
    seg_end = np.empty(nseg, dtype=np.int64)
    seg_start[seg_off[:-1]] = offs[:-1]
    seg_end[seg_off[1:] - 1] = offs[1:]
    first_sep_of_row = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(per_row - 1, out=first_sep_of_row[1:])
    slot = seg_off[row_of_sep] + (np.arange(len(sep2)) - first_sep_of_row[row_of_sep])
    seg_end[slot] = sep2
    seg_start[slot + 1] = sep2 + 1
    seg_row = np.repeat(np.arange(n, dtype=np.int64), per_row)
    k = np.searchsorted(sep1, seg_start)
    pos1 = np.append(sep1, hi + 1)[k]
    valid = (pos1 > seg_start) & (pos1 + 1 < seg_end)
    sel = np.flatnonzero(valid)
    ks, ke, ve = seg_start[sel], pos1[sel], seg_end[sel]
    pf = seg_row[sel]
    bounds_s = np.empty(2 * len(sel), dtype=np.int64)
    bounds_e = np.empty(2 * len(sel), dtype=np.int64)
    bounds_s[0::2], bounds_e[0::2] = ks, ke
    bounds_s[1::2], bounds_e[1::2] = ke + 1, ve
    kf, vf = _cut(data_buf, bounds_s, bounds_e)
    if _has_duplicate_keys(kf, pf, n):
        return _properties_slow(props_str)
    counts = np.bincount(pf, minlength=n)
    map_off = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=map_off[1:])
    props = pa.MapArray.from_arrays(pa.array(map_off), kf, vf)
    lookups = {}
    for name in _LOOKUP_KEYS:
        hit = np.asarray(pc.equal(kf, name))
        rows = pf[hit]
        idx = np.full(n, -1, dtype=np.int64)
        idx[rows] = np.arange(len(rows))
        vals = vf.filter(pa.array(hit))
        lookups[name] = vals.take(pa.array(idx, mask=idx < 0))
    return props, lookups


def _has_duplicate_keys(kf: pa.Array, pf: np.ndarray, n: int) -> bool:
    if len(kf) < 2:
        return False
    enc = pc.dictionary_encode(kf)
    codes = np.asarray(enc.indices).astype(np.int64)
    nd = len(enc.dictionary)
    combined = pf.astype(np.int64) * nd + codes
    if n * nd <= (1 << 23):
        return bool((np.bincount(combined, minlength=n * nd) > 1).any())
    return len(np.unique(combined)) != len(combined)


def _properties_slow(props_str: pa.Array) -> tuple[pa.Array, dict[str, pa.Array]]:
    dicts = [decode_properties(x) for x in props_str.to_pylist()]
    props = pa.array([list(d.items()) for d in dicts], pa.map_(pa.string(), pa.string()))
    lookups = {name: pa.array([d.get(name) for d in dicts], pa.string()) for name in _LOOKUP_KEYS}
    return props, lookups


# ------------------------------------------------------------------------------- fast paths
# IPv4 hosts: every field up to BODYLEN sits at a fixed position (facts §4.1)
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
# keep the low k bytes of a little-endian uint64, k = 0..8
_LOW_BYTES = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


def _rows(arr: np.ndarray, width: int) -> np.ndarray:
    """``arr`` seen as overlapping rows of ``width`` bytes, one starting at every byte."""
    count = max(len(arr) - width + 1, 0)
    return np.lib.stride_tricks.as_strided(arr, shape=(count, width), strides=(1, 1))


def _constant_string(value: bytes, n: int) -> pa.Array:
    """A string column holding ``value`` ``n`` times, built from raw buffers."""
    width = len(value)
    offsets = np.arange(0, width * n + 1, width or 1, dtype=np.int32)
    if not width:
        offsets = np.zeros(n + 1, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(value * n)]
    )


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


def _decode_fast(arr: np.ndarray, broker_name: str, s: np.ndarray) -> pa.RecordBatch | None:
    """The common case: IPv4 hosts and sound records.  None means "use ``_decode_general``".

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
            topic = _constant_string(first_topic, n)
        else:
            topic = parts.take(pa.array(idx + 2)).cast(pa.string())
        props_str = parts.take(pa.array(idx + 4)).cast(pa.string())
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return None
    del parts

    compressed = (sys_flag & MessageSysFlag.COMPRESSED) != 0
    if compressed.any():
        body = _inflate(body, compressed, s)
    props, lookups = _properties(props_str, n)
    uniq = lookups[MessageConst.UNIQ_KEY]
    if uniq.null_count == 0:
        msg_id = uniq
    else:
        raw = np.empty((n, 16), dtype=np.uint8)
        raw[:, :8] = head["store_host"].astype(">u8").view(np.uint8).reshape(n, 8)
        raw[:, 8:] = head["phys"].astype(">u8").view(np.uint8).reshape(n, 8)
        hexed = _HEX16[raw].view(np.uint8).reshape(-1)
        offset_id = pa.Array.from_buffers(
            pa.string(),
            n,
            [None, pa.py_buffer(np.arange(0, 32 * n + 1, 32, dtype=np.int32)), pa.py_buffer(hexed)],
        )
        msg_id = pc.coalesce(uniq, offset_id)
    return pa.RecordBatch.from_arrays(
        [
            topic,
            _constant_string(broker_name.encode("utf-8"), n),
            pa.array(head["queue_id"].astype(np.int32)),
            pa.array(head["queue_offset"].astype(np.int64)),
            body,
            lookups[MessageConst.TAGS],
            lookups[MessageConst.KEYS],
            props,
            msg_id,
            _timestamps(head["born_ts"]),
            _timestamps(head["store_ts"]),
            pa.array(head["reconsume"].astype(np.int32)),
        ],
        schema=arrow_schema(),
    )


def _fingerprints(keys: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per key: byte length, first 8 bytes and last 8 bytes (little-endian uint64, zero-padded).

    Equal keys have equal fingerprints; keys of at most 16 bytes are equal exactly when their
    fingerprints are.
    """
    m = len(keys)
    _, off_buf, data_buf = keys.buffers()
    ko = np.frombuffer(off_buf, dtype=np.int32)[keys.offset : keys.offset + m + 1].astype(np.int64)
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    )
    padded = np.zeros(len(data) + 16, dtype=np.uint8)
    padded[8 : 8 + len(data)] = data
    u8 = _strided(padded, "<u8")
    klen = ko[1:] - ko[:-1]
    first = u8[ko[:-1] + 8] & _LOW_BYTES[np.minimum(klen, 8)]
    # the 8 bytes ending at the key's end; for short keys that is zero padding + the key
    last = np.where(klen > 8, u8[ko[1:]], 0)
    return klen, first, last


def _name_print(name: str) -> tuple[int, int]:
    raw = name.encode("utf-8")
    assert len(raw) <= 8, name  # lookups compare the first 8 bytes only
    return len(raw), int.from_bytes(raw, "little")


_LOOKUP_PRINTS = {name: _name_print(name) for name in _LOOKUP_KEYS}


def _properties_fast(props_str: pa.Array, n: int) -> tuple[pa.Array, dict[str, pa.Array]] | None:
    """Properties whose every pair is ``key\x01value`` with both non-empty; else None.

    One scan finds every separator; a pair is its \x01 with the key back to the previous
    separator (or the row start) and the value up to the next \x02 (or the row end).  Rows with
    or without Java's trailing \x02 both fit.  What Java would treat specially (an empty key or
    value, a second \x01 in one segment) returns None for the general path; a segment with no
    \x01 holds no pair and is skipped, as in Java.  Repeated names are found by fingerprint.
    """
    _, off_buf, data_buf = props_str.buffers()
    offs = np.frombuffer(off_buf, dtype=np.int32)[props_str.offset : props_str.offset + n + 1]
    offs = offs.astype(np.int64)
    if data_buf is None:
        return None
    data = np.frombuffer(data_buf, dtype=np.uint8)
    lo, hi = int(offs[0]), int(offs[-1])
    sep = np.flatnonzero(data[lo:hi] < 3)
    sep += lo
    ty = data[sep]
    if len(ty) and int(ty.min()) == 0:
        keep = ty != 0
        sep, ty = sep[keep], ty[keep]
    i1 = np.flatnonzero(ty == 1)
    m = len(i1)
    p1 = sep[i1]
    # pairs per row from where each row starts among the sorted \x01 positions
    before = np.searchsorted(p1, offs)
    counts = np.diff(before)
    row = np.repeat(np.arange(n, dtype=np.int64), counts)
    row_end = np.repeat(offs[1:], counts)
    prev = np.empty(m, dtype=np.int64)
    if m:
        prev[1:] = sep[i1[1:] - 1] + 1
        prev[0] = sep[i1[0] - 1] + 1 if i1[0] > 0 else lo
    kstart = np.maximum(prev, np.repeat(offs[:-1], counts))
    nxt_i = i1 + 1
    has_next = nxt_i < len(sep)
    nxt = np.full(m, hi, dtype=np.int64)
    nxt[has_next] = sep[nxt_i[has_next]]
    in_row = nxt < row_end
    if bool((in_row & (ty[np.minimum(nxt_i, max(len(ty) - 1, 0))] == 1)).any()):
        return None  # a value holding \x01: Java keeps it whole, the general path does too
    vend = np.minimum(nxt, row_end)
    if bool((kstart >= p1).any()) or bool((vend <= p1 + 1).any()):
        return None
    bounds_s = np.empty(2 * m, dtype=np.int64)
    bounds_e = np.empty(2 * m, dtype=np.int64)
    bounds_s[0::2], bounds_e[0::2] = kstart, p1
    bounds_s[1::2], bounds_e[1::2] = p1 + 1, vend
    kf, vf = _cut(data_buf, bounds_s, bounds_e)
    klen, first, last = _fingerprints(kf)
    if m > 1 and _maybe_duplicates(row, counts, klen, first, last):
        if _has_duplicate_keys(kf, row, n):
            return None
    map_off = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=map_off[1:])
    props = pa.MapArray.from_arrays(pa.array(map_off), kf, vf)
    lookups = {}
    for name, (length, fp) in _LOOKUP_PRINTS.items():
        hit = np.flatnonzero((klen == length) & (first == np.uint64(fp)))
        if len(hit) == n and bool((row[hit] == np.arange(n)).all()):
            lookups[name] = vf.take(pa.array(hit))
            continue
        idx = np.full(n, -1, dtype=np.int64)
        idx[row[hit]] = hit
        lookups[name] = vf.take(pa.array(idx, mask=idx < 0))
    return props, lookups


def _maybe_duplicates(row, counts, klen, first, last) -> bool:
    """Whether two pairs of one row might share a name (equal fingerprints); exact for <= 16."""
    widest = int(counts.max())
    if widest > 16:
        return True
    for d in range(1, widest):
        same = (
            (row[d:] == row[:-d])
            & (klen[d:] == klen[:-d])
            & (first[d:] == first[:-d])
            & (last[d:] == last[:-d])
        )
        if bool(same.any()):
            return True
    return False


# --------------------------------------------------------------------------- compiled path


def _binary(kind, offsets: np.ndarray, data: np.ndarray, n: int) -> pa.Array:
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _decode_compiled(arr: np.ndarray, broker_name: str, s: np.ndarray) -> pa.RecordBatch | None:
    """``pipeline._kernels`` decodes; None means "let ``_decode_general`` raise the error".

    The kernels check every record like the general path and return the index of the first bad
    one instead of raising, so the error text has one author.  Rows flagged non-ASCII get their
    topic and properties checked for UTF-8 here; compressed bodies are inflated here.
    """
    n = len(s)
    lay = np.empty((n, 8), dtype=np.int64)
    bad, body_total, topic_total, props_total, segs = _kernels.measure(arr, s, lay)
    if bad >= 0:
        return None
    (
        qid,
        qoff,
        born,
        stored,
        recon,
        flags,
        body_off,
        body_data,
        topic_off,
        topic_data,
        map_off,
        key_off,
        keys,
        val_off,
        vals,
        look,
        id_off,
        ids,
    ) = _kernels.fill(arr, s, lay, body_total, topic_total, props_total, segs)
    if flags.any():
        for i in np.flatnonzero(flags & 2):
            t0, t1, p0 = int(lay[i, 2]), int(lay[i, 3]), int(lay[i, 4])
            try:
                bytes(arr[t0:t1]).decode("utf-8")
                end = int(s[i]) + _size_at(arr, int(s[i]))
                bytes(arr[p0:end]).decode("utf-8")
            except UnicodeDecodeError:
                return None
    m = len(key_off) - 1
    kf = _binary(pa.string(), key_off, keys, m)
    vf = _binary(pa.string(), val_off, vals, m)
    props = pa.MapArray.from_arrays(pa.array(map_off), kf, vf)
    body = _binary(pa.binary(), body_off, body_data, n)
    compressed = (flags & 1) != 0
    if compressed.any():
        body = _inflate(body, compressed, s)
    lookups = []
    for k in range(3):
        idx = look[k]
        if bool((idx >= 0).all()):
            lookups.append(vf.take(pa.array(idx)))
        else:
            lookups.append(vf.take(pa.array(idx, mask=idx < 0)))
    return pa.RecordBatch.from_arrays(
        [
            _binary(pa.string(), topic_off, topic_data, n),
            _constant_string(broker_name.encode("utf-8"), n),
            pa.array(qid),
            pa.array(qoff),
            body,
            lookups[0],
            lookups[1],
            props,
            _binary(pa.string(), id_off, ids, n),
            _timestamps(born),
            _timestamps(stored),
            pa.array(recon),
        ],
        schema=arrow_schema(),
    )


def _size_at(arr: np.ndarray, pos: int) -> int:
    return int.from_bytes(bytes(arr[pos : pos + 4]), "big", signed=True)
