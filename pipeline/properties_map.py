"""The properties column: message properties strings to an Arrow ``map<string,string>``.

Theory of operation
-------------------
Properties are ``k\\x01v\\x02k\\x01v`` (``common.message_properties``).  A batch's properties
strings arrive as one Arrow string array; :func:`parse_properties` turns it into a MapArray and the
TAGS, KEYS and UNIQ_KEY columns (looked up in it) with Java's tolerance: a segment needs a non-empty
key and value, and a repeated name keeps its last value (a ``HashMap.put`` per pair).  There is no
Python per row on the usual paths:

* ``_properties_fast``: one scan finds every separator, and each pair is cut out of the
  string array's data buffer by a zero-copy binary array of the interleaved key/value bounds
  (``take`` copies them into contiguous key and value columns in C++).  Repeated names are
  found by fingerprint (length, first and last 8 bytes).  Anything Java treats specially (an
  empty key or value, a second \\x01 in one segment, a repeated name) hands over to
* ``_properties_general``: the same cut over every \\x02-delimited segment, with each of Java's
  tolerances, and
* ``_properties_slow``: a batch that really repeats a name is rare enough to be rebuilt with
  ``common.message_properties.decode_properties`` (last value wins).

The compiled kernels (``pipeline._kernels``) split properties themselves; this module is the
numpy path's and the tests' second opinion on them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.message_properties import MessageConst, decode_properties

# the properties that get a column of their own
LOOKUP_KEYS = (MessageConst.TAGS, MessageConst.KEYS, MessageConst.UNIQ_KEY)
# keep the low k bytes of a little-endian uint64, k = 0..8
_LOW_BYTES = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


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


def parse_properties(props_str: pa.Array, n: int) -> tuple[pa.Array, dict[str, pa.Array]]:
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
    for name in LOOKUP_KEYS:
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
    lookups = {name: pa.array([d.get(name) for d in dicts], pa.string()) for name in LOOKUP_KEYS}
    return props, lookups


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
    # the 8 bytes starting at every position as one little-endian uint64 (a view, no copy)
    u8 = np.ndarray(shape=(len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))
    klen = ko[1:] - ko[:-1]
    first = u8[ko[:-1] + 8] & _LOW_BYTES[np.minimum(klen, 8)]
    # the 8 bytes ending at the key's end; for short keys that is zero padding + the key
    last = np.where(klen > 8, u8[ko[1:]], 0)
    return klen, first, last


def _name_print(name: str) -> tuple[int, int]:
    raw = name.encode("utf-8")
    assert len(raw) <= 8, name  # lookups compare the first 8 bytes only
    return len(raw), int.from_bytes(raw, "little")


_LOOKUP_PRINTS = {name: _name_print(name) for name in LOOKUP_KEYS}


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


def _maybe_duplicates(
    row: np.ndarray, counts: np.ndarray, klen: np.ndarray, first: np.ndarray, last: np.ndarray
) -> bool:
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
