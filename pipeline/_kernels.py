"""Compiled (numba) kernels of the CommitLog record decoder: one pass per batch, no Python per row.

Theory of operation
-------------------
``pipeline.record_batch`` turns a buffer of CommitLog records (a PULL body or a mapped segment)
into an Arrow batch.  Doing that with numpy + ``pyarrow.compute`` costs a dozen full passes and
temporary arrays per batch (most of it building the properties map); these kernels do it in two
compiled passes over the records and hand back plain numpy arrays that become Arrow arrays with
``pa.Array.from_buffers`` without a copy:

* :func:`walk` finds record starts by hopping TOTALSIZEs, stepping over BLANK filler.
* :func:`measure` checks every record like ``common.message.decode_record`` does (magic, size,
  host lengths from SYSFLAG, body/topic/properties lengths adding up to TOTALSIZE) and sums the
  sizes the output buffers need.  On the first bad record it returns its index and the caller
  lets the general decoder word the error, so both paths raise the same thing.
* :func:`fill` copies fixed-width fields, bodies, topics and msgIds into contiguous buffers with
  int32 offsets and splits each properties string the way Java's ``string2messageProperties``
  does (``common.message_properties.decode_properties``): segments end at \\x02, a segment's
  key runs to its first \\x01 and its value is the rest (it may hold more \\x01), both must be
  non-empty or the segment is skipped; a repeated name keeps the first position and the last
  value (what a Python dict built in order gives).  TAGS/KEYS/UNIQ_KEY are found as pair
  indexes; msgId is the UNIQ_KEY value, else the offset msgId (uppercase hex of the store
  host's ip + port and the PHYSICALOFFSET, 32 or 56 characters).

UTF-8 is not validated here: a row whose topic or properties hold a byte >= 0x80 is flagged and
the caller checks just those rows (ASCII, the usual case, is always valid).  Compressed bodies
are flagged too and inflated by the caller.  ``cache=True`` keeps the compiled code on disk next
to this file, so Spark's Python workers do not compile again; ``nogil=True`` lets threads decode
in parallel.  Importing this module fails without numba; ``record_batch`` then decodes with
``pipeline.numpy_decoder``.
"""

from __future__ import annotations

import numba
import numpy as np
from numpy.typing import NDArray

# What the kernels take and give, for the type checker; numba itself types every call from its
# arguments (uint8 buffers, int64 positions and layouts).
_Bytes = NDArray[np.uint8]
_Ints = NDArray[np.int64]
_I32s = NDArray[np.int32]
# fill(): qid, qoff, born, stored, recon, flags, body_off, body, topic_off, topic, map_off,
# key_off, keys, val_off, vals, look (3 x n: pair index of TAGS, KEYS, UNIQ_KEY), id_off, ids
_Columns = tuple[
    _I32s,
    _Ints,
    _Ints,
    _Ints,
    _I32s,
    _Bytes,
    _I32s,
    _Bytes,
    _I32s,
    _Bytes,
    _I32s,
    _I32s,
    _Bytes,
    _I32s,
    _Bytes,
    _Ints,
    _I32s,
    _Bytes,
]

MESSAGE_MAGIC = np.int64(-626843481)
BLANK_MAGIC = np.int64(-875286124)
MIN_SIZE = 91  # record_size(0, 0, 0, 0): IPv4 hosts, every part empty

# error codes of walk()
WALK_OK = 0
WALK_BAD = 1

_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8).copy()
# b"UNIQ_KEY" read as a big-endian int64, like _i64 reads 8 bytes of a record
_UNIQ_KEY = int.from_bytes(b"UNIQ_KEY", "big")

# byte classes of the properties scan: 1 \x01, 2 \x02, 3 non-ASCII, 0 anything else
_CLASS = np.zeros(256, dtype=np.uint8)
_CLASS[1] = 1
_CLASS[2] = 2
_CLASS[0x80:] = 3

# One decorator for every kernel.  Built once with keyword arguments (not ``njit(**opts)`` from
# a dict) so numba's own stubs can check the options and type the decorated kernels.
_jit = numba.njit(cache=True, nogil=True, boundscheck=False)


@_jit
def _i32(b: _Bytes, p: int) -> int:
    v = (np.int64(b[p]) << 24) | (np.int64(b[p + 1]) << 16) | (np.int64(b[p + 2]) << 8) | b[p + 3]
    if v >= 0x80000000:
        v -= 0x100000000
    return int(v)  # an int64 either way once compiled; int() tells the type checker


@_jit
def _i64(b: _Bytes, p: int) -> int:
    hi = np.uint64((np.int64(b[p]) << 24) | (np.int64(b[p + 1]) << 16) | (np.int64(b[p + 2]) << 8))
    hi |= np.uint64(b[p + 3])
    lo = np.uint64((np.int64(b[p + 4]) << 24) | (np.int64(b[p + 5]) << 16))
    lo |= np.uint64((np.int64(b[p + 6]) << 8) | b[p + 7])
    return int(np.int64((hi << np.uint64(32)) | lo))


@_jit
def walk(b: _Bytes) -> tuple[_Ints, int, int]:
    """Record starts of ``b``; returns (starts, status, position of the first bad thing)."""
    n = len(b)
    out = np.empty(max(n // MIN_SIZE, 1), dtype=np.int64)
    k = 0
    pos = 0
    while pos < n:
        if pos + 8 > n:
            return out[:k], WALK_BAD, pos
        size = _i32(b, pos)
        magic = _i32(b, pos + 4)
        if magic == MESSAGE_MAGIC:
            if size < MIN_SIZE or pos + size > n:
                return out[:k], WALK_BAD, pos
            out[k] = pos
            k += 1
        elif magic == BLANK_MAGIC:
            if size < 8:
                return out[:k], WALK_BAD, pos
        else:
            return out[:k], WALK_BAD, pos
        pos += size
    return out[:k], WALK_OK, pos


@_jit
def measure(b: _Bytes, s: _Ints, lay: _Ints) -> tuple[int, int, int, int, int]:
    """Check each record at ``s`` and fill ``lay`` (n x 8 int64) with its layout.

    Columns: 0 body start, 1 body end, 2 topic start, 3 topic end, 4 props start (end is the
    record end), 5 store-host position, 6 store-host length (8 or 20), 7 SYSFLAG.
    Returns (index of the first bad record or -1, body bytes, topic bytes, props bytes,
    properties segments).
    """
    nb = len(b)
    body_total = 0
    topic_total = 0
    props_total = 0
    segs = 0
    prev = -1
    for i in range(len(s)):
        p0 = s[i]
        if p0 <= prev or p0 < 0 or p0 + MIN_SIZE > nb:
            return i, 0, 0, 0, 0
        prev = p0
        size = _i32(b, p0)
        if _i32(b, p0 + 4) != MESSAGE_MAGIC or size < MIN_SIZE:
            return i, 0, 0, 0, 0
        end = p0 + size
        if end > nb:
            return i, 0, 0, 0, 0
        flag = _i32(b, p0 + 36)
        born_len = 20 if flag & 0x10 else 8
        store_len = 20 if flag & 0x20 else 8
        sh = p0 + 48 + born_len + 8
        mid = sh + store_len
        body0 = mid + 16
        if body0 + 3 > end:
            return i, 0, 0, 0, 0
        blen = _i32(b, mid + 12)
        p = body0 + blen
        if blen < 0 or p + 3 > end:
            return i, 0, 0, 0, 0
        t0 = p + 1
        t1 = t0 + b[p]
        if t1 + 2 > end:
            return i, 0, 0, 0, 0
        plen = (np.int64(b[t1]) << 8) | b[t1 + 1]
        if t1 + 2 + plen != end:
            return i, 0, 0, 0, 0
        lay[i, 0] = body0
        lay[i, 1] = p
        lay[i, 2] = t0
        lay[i, 3] = t1
        lay[i, 4] = t1 + 2
        lay[i, 5] = sh
        lay[i, 6] = store_len
        lay[i, 7] = flag
        body_total += blen
        topic_total += t1 - t0
        props_total += plen
        segs += 1
        for q in range(t1 + 2, end):
            if b[q] == 2:
                segs += 1
    return -1, body_total, topic_total, props_total, segs


@_jit
def fill(
    b: _Bytes, s: _Ints, lay: _Ints, body_total: int, topic_total: int, props_total: int, segs: int
) -> _Columns:
    """Every column of the records of ``s`` (checked by :func:`measure`) as numpy buffers."""
    n = len(s)
    qid = np.empty(n, dtype=np.int32)
    qoff = np.empty(n, dtype=np.int64)
    born = np.empty(n, dtype=np.int64)
    stored = np.empty(n, dtype=np.int64)
    recon = np.empty(n, dtype=np.int32)
    flags = np.zeros(n, dtype=np.uint8)  # 1 compressed body, 2 non-ASCII topic or properties
    body_off = np.empty(n + 1, dtype=np.int32)
    body = np.empty(body_total, dtype=np.uint8)
    topic_off = np.empty(n + 1, dtype=np.int32)
    topic = np.empty(topic_total, dtype=np.uint8)
    map_off = np.empty(n + 1, dtype=np.int32)
    key_off = np.empty(segs + 1, dtype=np.int32)
    val_off = np.empty(segs + 1, dtype=np.int32)
    keys = np.empty(props_total, dtype=np.uint8)
    vals = np.empty(props_total, dtype=np.uint8)
    look = np.full((3, n), -1, dtype=np.int64)  # pair index of TAGS, KEYS, UNIQ_KEY
    id_off = np.empty(n + 1, dtype=np.int32)
    ids = np.empty(props_total + 56 * n, dtype=np.uint8)
    bo = 0
    to = 0
    m = 0  # pairs so far
    ko = 0
    vo = 0
    io = 0
    body_off[0] = 0
    topic_off[0] = 0
    map_off[0] = 0
    key_off[0] = 0
    val_off[0] = 0
    id_off[0] = 0
    for i in range(n):
        p0 = s[i]
        body0 = lay[i, 0]
        body1 = lay[i, 1]
        t0 = lay[i, 2]
        t1 = lay[i, 3]
        pr0 = lay[i, 4]
        end = p0 + _i32(b, p0)
        sh = lay[i, 5]
        sl = lay[i, 6]
        flag = lay[i, 7]
        qid[i] = _i32(b, p0 + 12)
        qoff[i] = _i64(b, p0 + 20)
        born[i] = _i64(b, p0 + 40)
        stored[i] = _i64(b, sh - 8)
        recon[i] = _i32(b, sh + sl)
        if flag & 1:
            flags[i] |= 1
        for q in range(body0, body1):
            body[bo] = b[q]
            bo += 1
        body_off[i + 1] = bo
        for q in range(t0, t1):
            c = b[q]
            if c >= 0x80:
                flags[i] |= 2
            topic[to] = c
            to += 1
        topic_off[i + 1] = to
        # properties: segments end at \x02 or the record end; pairs go straight to the output
        # buffers, a repeated name (rare) rewrites the earlier pair's value in place
        row0 = m
        seg = pr0
        while seg <= end:
            q = seg
            one = -1
            while q < end:
                k = _CLASS[b[q]]
                if k != 0:  # one well-predicted branch per ordinary byte
                    if k == 2:
                        break
                    if k == 1:
                        if one < 0:
                            one = q
                    else:
                        flags[i] |= 2
                q += 1
            # segment [seg, q): key [seg, one), value (one, q); both must be non-empty
            if one > seg and one + 1 < q:
                klen = one - seg
                vlen = q - one - 1
                dup = -1
                for j in range(row0, m):
                    k0 = key_off[j]
                    if key_off[j + 1] - k0 == klen:
                        same = True
                        for x in range(klen):
                            if keys[k0 + x] != b[seg + x]:
                                same = False
                                break
                        if same:
                            dup = j
                            break
                if dup < 0:
                    for x in range(seg, one):
                        keys[ko] = b[x]
                        ko += 1
                    key_off[m + 1] = ko
                    for x in range(one + 1, q):
                        vals[vo] = b[x]
                        vo += 1
                    val_off[m + 1] = vo
                    m += 1
                else:
                    # last value wins, at the first position (a dict built in order)
                    v0 = val_off[dup]
                    v1 = val_off[dup + 1]
                    tail = vals[v1:vo].copy()
                    vals[v0 : v0 + vlen] = b[one + 1 : q]
                    vals[v0 + vlen : v0 + vlen + len(tail)] = tail
                    delta = v0 + vlen - v1
                    for j in range(dup + 1, m + 1):
                        val_off[j] += delta
                    vo += delta
            seg = q + 1
        map_off[i + 1] = m
        uniq = -1
        for j in range(row0, m):
            k0 = key_off[j]
            klen = key_off[j + 1] - k0
            if klen == 4:
                if keys[k0] == 84 and keys[k0 + 1] == 65 and keys[k0 + 2] == 71:
                    if keys[k0 + 3] == 83:
                        look[0, i] = j  # TAGS
                elif keys[k0] == 75 and keys[k0 + 1] == 69 and keys[k0 + 2] == 89:
                    if keys[k0 + 3] == 83:
                        look[1, i] = j  # KEYS
            elif klen == 8 and _i64(keys, k0) == _UNIQ_KEY:
                look[2, i] = j
                uniq = j
        if uniq >= 0:
            v0 = val_off[uniq]
            v1 = val_off[uniq + 1]
            for x in range(v0, v1):
                ids[io] = vals[x]
                io += 1
        else:
            # store host ip + port, then PHYSICALOFFSET, as uppercase hex
            for q in range(sh, sh + sl):
                c = b[q]
                ids[io] = _HEX[c >> 4]
                ids[io + 1] = _HEX[c & 15]
                io += 2
            for q in range(p0 + 28, p0 + 36):
                c = b[q]
                ids[io] = _HEX[c >> 4]
                ids[io + 1] = _HEX[c & 15]
                io += 2
        id_off[i + 1] = io
    return (
        qid,
        qoff,
        born,
        stored,
        recon,
        flags,
        body_off,
        body,
        topic_off,
        topic,
        map_off,
        key_off[: m + 1],
        keys[:ko],
        val_off[: m + 1],
        vals[:vo],
        look,
        id_off,
        ids[:io],
    )


@_jit
def chain(
    b: _Bytes, pos: int, limit: int, file_from_offset: int, check_phys: bool
) -> tuple[_Ints, int]:
    """Records from ``pos`` while each is a sound MESSAGE record: ``(starts, next position)``.

    A record is taken when its MAGIC is MESSAGE, its size possible and inside ``b``, and (with
    ``check_phys``) its PHYSICALOFFSET is ``file_from_offset`` + its position; the walk stops
    at the first position where that fails or at ``limit``.  What stopped it (BLANK, zeros, a
    torn record) is for the caller's careful loop to say.
    """
    n = len(b)
    out = np.empty(max((min(limit, n) - pos) // MIN_SIZE + 1, 1), dtype=np.int64)
    k = 0
    while pos < limit and pos + MIN_SIZE <= n:
        size = _i32(b, pos)
        if _i32(b, pos + 4) != MESSAGE_MAGIC or size < MIN_SIZE or pos + size > n:
            break
        if check_phys and _i64(b, pos + 28) != file_from_offset + pos:
            break
        out[k] = pos
        k += 1
        pos += size
    return out[:k], pos
