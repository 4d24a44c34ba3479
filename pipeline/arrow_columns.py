"""Arrow columns of the pipeline schema, built from raw decoded parts without Python per row.

Both record decoders (``pipeline.numpy_decoder`` and the compiled path of
``pipeline.record_batch``) end with numpy arrays of fixed fields and contiguous byte buffers;
these functions turn them into the Arrow arrays of ``pipeline.schema`` the way Spark reads
them:

* timestamps are milliseconds in a record and microseconds (UTC) in Spark; a value outside
  Spark's range (years 1-9999) becomes null rather than wrapping;
* string and binary columns are made straight from an offsets buffer and a data buffer
  (``pa.Array.from_buffers``, no copy), and a value shared by every row (the brokerName, the
  usual single topic of a batch) is laid out once per row without a per-row Python string;
* the offset msgId (``common.message_id``: uppercase hex of the store host's ip + port and the
  PHYSICALOFFSET) is made for a whole batch of IPv4 store hosts through a 256-entry hex table;
* compressed bodies (SYSFLAG bit 0, zlib) are inflated one by one: they are rare.
"""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa

from common.message import RecordDecodeError

# Spark's TimestampType covers 0001-01-01 .. 9999-12-31 (UTC), in milliseconds here
_MIN_MS = -62135596800000
_MAX_MS = 253402300799999
# two uppercase hex digits per byte value, as one uint16 in memory order
_HEX16 = np.frombuffer(b"".join(f"{i:02X}".encode() for i in range(256)), dtype=np.uint16)


def timestamps(ms: np.ndarray) -> pa.Array:
    """Record milliseconds as Spark timestamps; null where Spark cannot hold the value."""
    ms = ms.astype(np.int64)
    ok = (ms >= _MIN_MS) & (ms <= _MAX_MS)
    us = np.where(ok, ms, 0) * 1000
    ts = pa.timestamp("us", tz="UTC")
    if ok.all():
        return pa.array(us, ts)
    return pa.array(us, ts, mask=~ok)


def binary_array(kind: pa.DataType, offsets: np.ndarray, data: np.ndarray, n: int) -> pa.Array:
    """An ``n``-row string or binary array over int32 ``offsets`` into ``data`` (no copy)."""
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def constant_string(value: bytes, n: int) -> pa.Array:
    """A string column holding ``value`` ``n`` times, built from raw buffers."""
    width = len(value)
    offsets = np.arange(0, width * n + 1, width or 1, dtype=np.int32)
    if not width:
        offsets = np.zeros(n + 1, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(value * n)]
    )


def offset_msg_ids(raw: np.ndarray) -> pa.Array:
    """Offset msgIds of ``raw``: one row of 16 bytes (IPv4 store host ip + port, PHYSICALOFFSET,
    big-endian) per message, as 32 uppercase hex characters each."""
    n = len(raw)
    hexed = _HEX16[raw].view(np.uint8).reshape(-1)
    return binary_array(pa.string(), np.arange(0, 32 * n + 1, 32, dtype=np.int32), hexed, n)


def inflate(body: pa.Array, compressed: np.ndarray, s: np.ndarray) -> pa.Array:
    """``body`` with the rows flagged ``compressed`` inflated (zlib, like the Java client)."""
    values = body.to_pylist()
    for i in np.flatnonzero(compressed):
        try:
            values[i] = zlib.decompress(values[i])
        except zlib.error as exc:
            raise RecordDecodeError(
                f"record at {int(s[i])}: compressed body does not inflate: {exc}"
            ) from exc
    return pa.array(values, pa.binary())
