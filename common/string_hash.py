"""Java's ``String.hashCode``, which RocketMQ writes to disk and routes by.

The ConsumeQueue's tags code is the tags' hash (``common.message.tags_code``), an IndexFile
slot is chosen by the hash of ``topic#key``, and ``SelectMessageQueueByHash`` picks a queue by
the hash of its argument: each must be Java's value bit for bit, or a Java broker, client or
store reading our data disagrees with us.  The hash is a signed 32-bit polynomial over UTF-16
code units; the fast paths here use that polynomial form (see :func:`java_string_hash_concat`).
"""

from __future__ import annotations

import functools
import operator
import struct

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
