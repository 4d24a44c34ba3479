"""Header values a server cannot echo or store get an answer with a code, never a dropped link.

Each bad request is pipelined with a good one on the same connection: both must be answered
(the good one proves the connection lived), and nothing is logged at ERROR, since bad input is
not a server failure.  The values: a lone surrogate (``\\ud800`` in the JSON text) in a field
the answer echoes, and integers outside the Java int/long a header field is declared as.
"""

from __future__ import annotations

import json
import logging
import struct

import pytest
import trio

from common.remoting.codes import RequestCode, ResponseCode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _frame(code: int, opaque: int, ext: dict[str, str], body: bytes = b"") -> bytes:
    """A request frame whose extFields values are raw JSON text (to carry what json.dumps
    would never write)."""
    fields = ",".join(f'"{k}":{v}' for k, v in ext.items())
    header = (
        f'{{"code":{code},"flag":0,"language":"JAVA","opaque":{opaque},"version":0,'
        f'"extFields":{{{fields}}}}}'
    ).encode()
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


async def _answers(port: int, frames: list[bytes]) -> dict[int, dict]:
    """Send the frames at once; the answers by opaque (fails if the server closes first)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    got: dict[int, dict] = {}
    async with stream:
        await stream.send_all(b"".join(frames))
        buf = b""
        with trio.fail_after(10):
            while len(got) < len(frames):
                chunk = await stream.receive_some(65536)
                assert chunk, f"server closed the connection after {len(got)} answers"
                buf += chunk
                while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
                    n = struct.unpack_from(">i", buf)[0]
                    header_len = struct.unpack_from(">i", buf, 4)[0] & 0xFFFFFF
                    answer = json.loads(buf[8 : 8 + header_len])
                    got[answer["opaque"]] = answer
                    buf = buf[4 + n :]
    return got


def _send(opaque: int, **over: str) -> bytes:
    ext = {"a": '"pg"', "b": '"BadValues"', "c": '"TBW102"', "d": "4", "e": "0"}
    ext |= {"f": "0", "g": "0", "h": "0", "i": '""'}
    ext |= over
    return _frame(RequestCode.SEND_MESSAGE_V2, opaque, ext, b"body")


async def test_unencodable_and_out_of_range_values_are_answered(ns_and_broker, caplog):
    caplog.set_level(logging.WARNING)
    ns, broker = ns_and_broker
    good_ns = _frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, 2, {"topic": '"TBW102"'})
    route = await _answers(
        ns.port, [_frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, 1, {"topic": '"a\\ud800b"'}), good_ns]
    )
    assert route[1]["code"] == ResponseCode.TOPIC_NOT_EXIST
    assert "a\ud800b" in route[1]["remark"]  # echoed as the same (escaped) char
    assert route[2]["code"] == ResponseCode.SUCCESS

    good = _send(2)
    assert (await _answers(broker.port, [_send(1)]))[1]["code"] == ResponseCode.SUCCESS
    for field, value in [
        ("e", str(2**70)),  # queueId
        ("f", str(2**40)),  # sysFlag
        ("g", str(10**30)),  # bornTimestamp, a long
        ("h", str(2**31)),  # flag
        ("j", str(2**40)),  # reconsumeTimes
        ("e", "9" * 100),
    ]:
        got = await _answers(broker.port, [_send(1, **{field: value}), good])
        assert got[1]["code"] == ResponseCode.SYSTEM_ERROR, (field, got[1])
        assert "is not a Java" in got[1]["remark"]
        assert got[2]["code"] == ResponseCode.SUCCESS
    # a group with a lone surrogate is stored and answered like any other
    got = await _answers(broker.port, [_send(1, a='"pg\\udc00"'), good])
    assert got[1]["code"] == ResponseCode.SUCCESS and got[2]["code"] == ResponseCode.SUCCESS

    records = caplog.get_records("setup") + caplog.records  # the servers start in setup
    errors = [r for r in records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
