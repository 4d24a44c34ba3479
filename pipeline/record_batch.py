"""Vectorized CommitLog record decoding into Arrow record batches of the pipeline schema.

Theory of operation
-------------------
A PULL response body and a CommitLog segment hold the same records (``common.message``), and Spark
wants Arrow batches, so a batch is decoded column-wise, never one Python object per message.  Record
starts come from the caller (``starts``: a segment scan, ``broker.store.commitlog_scan``) or from
one tight walk over the 4-byte TOTALSIZEs (:func:`walk_records`; BLANK filler is stepped over).
Then one of two decoders runs:

* With numba installed (the "spark" extra) the compiled kernels of ``pipeline._kernels`` do the
  work (:func:`_decode_compiled`: two passes, ~2x the numpy path per core), and this module
  makes their output Arrow columns (``pipeline.arrow_columns``).
* Without numba, ``pipeline.numpy_decoder`` decodes with numpy and ``pyarrow.compute``
  (properties through ``pipeline.properties_map``).  It stays as a second oracle in the tests,
  and its general path words every decode error: whatever the kernels find wrong is handed to
  it, so an error reads the same whichever decoder met it.

Every record is checked like ``common.message.decode_record`` checks it (magic, sizes, field
lengths adding up to TOTALSIZE, UTF-8) and a bad one raises :class:`RecordDecodeError` naming its
offset; the result agrees with ``decode_record`` on every field (tests hold it with hypothesis).
Timestamps are milliseconds in the record and microseconds in Arrow; a value outside Spark's
range (years 1-9999) becomes null rather than wrapping.
"""

from __future__ import annotations

import struct

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from broker.store import commitlog_scan
from common.message import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE, RecordBuffer, RecordDecodeError
from pipeline.arrow_columns import binary_array, constant_string, inflate, timestamps
from pipeline.numpy_decoder import MIN_RECORD_SIZE, decode_fast, decode_general
from pipeline.schema import arrow_schema

try:
    from pipeline import _kernels
except ImportError:  # numba is in the "spark" extra; without it the numpy path decodes
    _kernels = None  # type: ignore[assignment]  # the module or None: tested before each use
else:
    commitlog_scan.use_compiled_chain(_kernels.chain)

__all__ = ["RecordDecodeError", "decode_records", "walk_records"]

_HEAD2 = struct.Struct(">ii")
# offsets of 32-bit Arrow arrays: one batch must span less than 2 GiB
_MAX_SPAN = (1 << 31) - 1


def walk_records(buf: RecordBuffer) -> np.ndarray:
    """Start positions of the records of ``buf`` (a PULL body or a whole segment).

    BLANK filler is stepped over; anything else that is not a complete record raises.
    """
    if _kernels is not None and len(buf):
        starts, status, _ = _kernels.walk(np.frombuffer(buf, dtype=np.uint8))
        if status == _kernels.WALK_OK:
            return starts
    return _walk_python(buf)


def _walk_python(buf: RecordBuffer) -> np.ndarray:
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


def decode_records(
    buf: RecordBuffer, *, broker_name: str, starts: npt.ArrayLike | None = None
) -> pa.RecordBatch:
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


def _decode(buf: RecordBuffer, broker_name: str, s: np.ndarray) -> pa.RecordBatch:
    arr = np.frombuffer(buf, dtype=np.uint8)
    n = len(s)
    if _kernels is not None and n:
        batch = _decode_compiled(arr, broker_name, s)
        if batch is not None:
            return batch
        return decode_general(buf, broker_name, s)
    if n and int(s[0]) >= 0 and int(s[-1]) + MIN_RECORD_SIZE <= len(arr):
        if n == 1 or bool(np.all(s[1:] > s[:-1])):
            batch = decode_fast(arr, broker_name, s)
            if batch is not None:
                return batch
    return decode_general(buf, broker_name, s)


# --------------------------------------------------------------------------- compiled path


def _decode_compiled(arr: np.ndarray, broker_name: str, s: np.ndarray) -> pa.RecordBatch | None:
    """``pipeline._kernels`` decodes; None means "let ``decode_general`` raise the error".

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
    kf = binary_array(pa.string(), key_off, keys, m)
    vf = binary_array(pa.string(), val_off, vals, m)
    props = pa.MapArray.from_arrays(pa.array(map_off), kf, vf)
    body = binary_array(pa.binary(), body_off, body_data, n)
    compressed = (flags & 1) != 0
    if compressed.any():
        body = inflate(body, compressed, s)
    lookups = []
    for k in range(3):
        idx = look[k]
        if bool((idx >= 0).all()):
            lookups.append(vf.take(pa.array(idx)))
        else:
            lookups.append(vf.take(pa.array(idx, mask=idx < 0)))
    return pa.RecordBatch.from_arrays(
        [
            binary_array(pa.string(), topic_off, topic_data, n),
            constant_string(broker_name.encode("utf-8"), n),
            pa.array(qid),
            pa.array(qoff),
            body,
            lookups[0],
            lookups[1],
            props,
            binary_array(pa.string(), id_off, ids, n),
            timestamps(born),
            timestamps(stored),
            pa.array(recon),
        ],
        schema=arrow_schema(),
    )


def _size_at(arr: np.ndarray, pos: int) -> int:
    return int.from_bytes(bytes(arr[pos : pos + 4]), "big", signed=True)
