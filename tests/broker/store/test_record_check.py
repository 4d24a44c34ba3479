"""The record check of crash recovery: the compiled walk (broker/store/_record_check.c) and the
numpy path (scan_segment + first_damaged) give the same answer on any segment.

Segments are generated: intact records (IPv4 and IPv6 hosts, empty and full topics, bodies and
properties), then damage a crash or a lying disk leaves (flipped bytes, a zeroed record tail,
a torn end), ending in BLANK filler, zeros or nothing; the check runs from a record start or an
arbitrary position to an arbitrary stop.  The compiled CRC (PCLMULQDQ folding where the CPU has
it) is held to zlib's, which the numpy path uses, for every way a body's length ends.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from broker.store.commitlog_scan import check_implementation, check_records
from common.message import BLANK_MAGIC_CODE, MessageExtBrokerInner
from common.message_encoder import encode_record

FROM = 3 << 30  # the segment's first physical offset

pytestmark = pytest.mark.timeout(120)


def test_the_checkout_runs_the_compiled_check():
    # `make install` (pip install -e) builds it in place; without it recovery is ~3x slower
    assert check_implementation() == "compiled", "broker.store._record_check is not built"


def record(pos, body, topic="T", props=None, v6=(False, False)):
    m = MessageExtBrokerInner(
        topic=topic,
        queue_id=0,
        body=body,
        properties=props or {},
        born_host=("::1" if v6[0] else "10.0.0.1", 1),
        store_host=("fe80::2" if v6[1] else "127.0.0.1", 10911),
    )
    return encode_record(m, 0, FROM + pos, 1)


def build(specs, tail, file_slack):
    buf = bytearray()
    starts = []
    for spec in specs:
        starts.append(len(buf))
        buf += record(len(buf), *spec)
    if tail == "blank":
        buf += (file_slack + 8).to_bytes(4, "big")
        buf += BLANK_MAGIC_CODE.to_bytes(4, "big", signed=True) + bytes(file_slack)
    elif tail == "zeros":
        buf += bytes(file_slack)
    elif tail == "short-blank":  # a filler that does not reach the end
        buf += (8).to_bytes(4, "big") + BLANK_MAGIC_CODE.to_bytes(4, "big", signed=True)
        buf += bytes(file_slack + 8)
    return buf, starts


records = st.tuples(
    st.binary(min_size=1, max_size=300) | st.binary(max_size=4),
    st.sampled_from(["", "T", "TopicTest", "x" * 127]),
    st.sampled_from([None, {"KEYS": "k1"}, {"UNIQ_KEY": "0" * 32, "TAGS": "a"}]),
    st.tuples(st.booleans(), st.booleans()),
)
# (kind, which record (a fraction of the count), where in it (a fraction of its size), n)
damage = st.tuples(
    st.sampled_from(["flip", "phys", "size", "cut", "zero-range"])
    | st.sampled_from(["zero-tail", "flip-body"]),
    st.floats(0, 1, exclude_max=True),
    st.floats(0, 1, exclude_max=True),
    st.integers(1, 40),
)


def damaged(buf, starts, harm):
    buf = bytearray(buf)
    for kind, which, where, n in harm:
        if not starts:
            break
        i = int(which * len(starts))
        s = starts[i]
        e = starts[i + 1] if i + 1 < len(starts) else len(buf)
        at = s + int(where * (e - s))
        if kind == "flip" and at < len(buf):
            buf[at] ^= 0xFF
        elif kind == "flip-body" and s + 40 <= e:
            flag = int.from_bytes(buf[s + 36 : s + 40], "big")
            at = s + 84 + 12 * bool(flag & 0x10) + 12 * bool(flag & 0x20)  # BODYLENGTH
            length = int.from_bytes(buf[at : at + 4], "big")
            if 0 < length <= e - at - 4:
                buf[at + 4 + int(where * length)] ^= 1 << n % 8
        elif kind == "zero-tail":  # a lost write: the record's last bytes are zeros
            k = n % 6 + 1  # mostly within the properties, sometimes past their length
            buf[max(s, e - k) : e] = bytes(min(k, e - s))
        elif kind == "phys":
            buf[s + 28 : s + 36] = (FROM + s + n).to_bytes(8, "big")
        elif kind == "size":
            size = int.from_bytes(buf[s : s + 4], "big", signed=True)
            buf[s : s + 4] = ((size + n - 20) & 0xFFFFFFFF).to_bytes(4, "big")
        elif kind == "cut":
            del buf[max(s, len(buf) - n) :]
        elif kind == "zero-range" and at < len(buf):
            buf[at : at + n * 8] = bytes(len(buf[at : at + n * 8]))
    return bytes(buf)


def answers(buf, start, stop):
    numpy = check_records(buf, FROM, start, stop, compiled=False)
    compiled = check_records(buf, FROM, start, stop, compiled=True)
    return numpy, compiled


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(records, min_size=1, max_size=14) | st.just([]),
    st.sampled_from(["eof", "blank", "zeros", "short-blank"]),
    st.integers(0, 200),
    st.lists(damage, min_size=1, max_size=2) | st.just([]),
    st.data(),
)
def test_compiled_and_numpy_checks_agree(specs, tail, slack, harm, data):
    buf, starts = build(specs, tail, slack)
    buf = damaged(buf, starts, harm)
    n = len(buf)
    starts = [s for s in starts if s <= n]
    # mostly the whole segment from its start; sometimes from a later record or anywhere
    how = data.draw(st.integers(0, 9), label="how")
    start = 0
    if how >= 6:
        start = data.draw(st.sampled_from([*starts, n]), label="start")
    if how == 9:
        start = data.draw(st.integers(0, n), label="start")
    stop = n - slack if tail == "zeros" and how % 2 else n
    if how >= 8:
        stop = data.draw(st.sampled_from([n, *starts]) | st.integers(0, n + 8), label="stop")
    stop = max(stop, start)
    numpy, compiled = answers(buf, start, stop)
    event("intact" if numpy[1] is None else " ".join(numpy[1].split()[:2]))  # the spread
    assert compiled == numpy


def test_each_kind_of_damage_is_named_the_same_way():
    specs = [
        (b"body-%d" % i * 20, "TopicTest", {"KEYS": f"k{i}"}, (i % 2 == 1, False)) for i in range(6)
    ]
    buf, starts = build(specs, "zeros", 64)
    s3, s4 = starts[3], starts[4]
    cases = {
        "intact": (bytes(buf), (starts[-1] + len(record(0, *specs[-1])), None)),
        "body": (_flip(buf, s3 + 100), (s3, "body CRC mismatch")),
        "zeroed properties": (_zero(buf, s4 - 3, s4), (s3, "a zeroed tail")),
        "magic": (_flip(buf, s3 + 5), (s3, "bad magic 0xda5c20a7")),
        "offset": (_flip(buf, s3 + 35), (s3, f"record claims physical offset {FROM + s3 ^ 0xFF}")),
        "torn": (bytes(buf[: s3 + 50]), (s3, "record of")),
    }
    for name, (damaged_buf, (pos, why)) in cases.items():
        stop = len(damaged_buf) - (64 if name != "torn" else 0)
        numpy, compiled = answers(damaged_buf, 0, stop)
        assert numpy == compiled, name
        assert compiled[0] == pos, name
        if why is None:
            assert compiled[1] is None, name
        else:
            assert compiled[1] is not None and compiled[1].startswith(why), (name, compiled)


def _flip(buf, at):
    out = bytearray(buf)
    out[at] ^= 0xFF
    return bytes(out)


def _zero(buf, lo, hi):
    out = bytearray(buf)
    out[lo:hi] = bytes(hi - lo)
    return bytes(out)


@pytest.mark.parametrize("length", [0, 15, 16, 63, 64, 65, 79, 80, 127, 128, 1024, 4099, 70001])
def test_body_crc_of_every_length_class(length):
    # the compiled CRC folds bodies of 64 bytes and more 64 at a time, then 16, then byte-wise
    # (_record_check.c): every way a length ends, against zlib's (the numpy path's)
    buf = record(0, bytes(range(256)) * (length // 256) + bytes(range(length % 256)))
    buf += record(len(buf), b"x" * length) + bytes(16)
    stop = len(buf) - 16
    assert answers(buf, 0, stop) == ((stop, None),) * 2
    if length:
        bad = _flip(buf, 88 + length - 1)  # the first record's last body byte
        assert answers(bad, 0, stop) == ((0, "body CRC mismatch"),) * 2
        bad = _flip(buf, 88)  # its first
        assert answers(bad, 0, stop) == ((0, "body CRC mismatch"),) * 2
