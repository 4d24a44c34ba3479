"""The send path's fast paths give what the general ones give (issue 28).

* `decode_json_header`'s one-pass read of the usual header against
  `decode_json_header_general`, on headers of every shape: the same command, or the same error.
* A channel's frame with a small bytes body, queued as one piece (header and body joined), is
  byte for byte `encode(cmd)`, as the frame of a larger body, queued as two pieces, is.
* The request flusher (channel.py, "The request flusher"): requests in flight leave in fewer
  writes, each gets its own answer, and a failed deferred write says RemotingSendError.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import FrameDecodeError
from common.remoting.channel import FLUSH_AFTER, JOIN_MAX, Channel
from common.remoting.codec import (
    FrameDecoder,
    decode_json_header,
    decode_json_header_general,
    encode,
)
from common.remoting.command import RemotingCommand
from tests.support.wire import command_fields

pytestmark = pytest.mark.timeout(60)

# every type a JSON field can have, and the edges the fast path must leave to the general one
values = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.lists(st.integers(), max_size=2)
)
ext_values = st.text(max_size=12) | values


@st.composite
def headers(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {}
    usual = draw(st.booleans())  # half of them the shape Java and we write
    for name, usual_values in (
        ("code", st.integers(-(2**15), 2**15)),
        ("language", st.sampled_from(["JAVA", "PYTHON", "CPP"])),
        ("version", st.integers(0, 500)),
        ("opaque", st.integers(-(2**31), 2**31 - 1)),
        ("flag", st.sampled_from([0, 1, 2, 3])),
        ("remark", st.none() | st.text(max_size=8)),
    ):
        if draw(st.integers(0, 9)) == 0:
            continue  # the field missing
        out[name] = draw(usual_values if usual else values)
    ext_choice = draw(st.integers(0, 4))
    if ext_choice == 1:
        out["extFields"] = draw(st.dictionaries(st.text(max_size=6), st.text(max_size=12)))
    elif ext_choice == 2:
        out["extFields"] = draw(st.dictionaries(st.text(max_size=6), ext_values, max_size=4))
    elif ext_choice == 3:
        out["extFields"] = draw(values)
    return out


def _decoded(data: bytes, decode: Any) -> tuple[Any, ...] | str:
    try:
        return command_fields(decode(data))
    except FrameDecodeError:
        return "FrameDecodeError"


@settings(max_examples=600, deadline=None)
@given(headers())
def test_fast_decode_is_the_general_decode(header: dict[str, Any]) -> None:
    # the standard library writes what orjson refuses (integers beyond 64 bits, Infinity)
    data = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    assert _decoded(data, decode_json_header) == _decoded(data, decode_json_header_general)


def test_fast_decode_of_a_send_answer() -> None:
    data = (
        b'{"code":0,"extFields":{"msgId":"7F00","queueId":"3","queueOffset":"12"},"flag":1,'
        b'"language":"JAVA","opaque":42,"serializeTypeCurrentRPC":"JSON","version":395}'
    )
    cmd = decode_json_header(data)
    assert command_fields(cmd) == command_fields(decode_json_header_general(data))
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.version, cmd.language) == (0, 42, 1, 395, "JAVA")
    assert cmd.ext_fields == {"msgId": "7F00", "queueId": "3", "queueOffset": "12"}


@pytest.mark.parametrize(
    "body",
    [b"", b"x", b"y" * 1024, b"z" * JOIN_MAX, b"w" * (JOIN_MAX + 1), [b"ab", b"cd"]],
    ids=["empty", "one", "1KiB", "join-max", "over-join-max", "list"],
)
async def test_channel_writes_the_frame_encode_gives(body: Any) -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    cmds = [
        RemotingCommand(
            code=310,
            language="PYTHON",
            opaque=i,
            ext_fields={"a": "group", "b": "Topic", "i": "KEYS\x01k\x02"},
            body=body,
        )
        for i in range(3)
    ]
    want = b"".join(encode(c) for c in cmds)
    with trio.fail_after(10):
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(a))
        channel = Channel(stream, "peer:1")
        peer = trio.socket.from_stdlib_socket(b)
        got = bytearray()

        async def read() -> None:
            while len(got) < len(want):
                data = await peer.recv(1 << 20)
                assert data
                got.extend(data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            for c in cmds:
                await channel.send(c)
        assert bytes(got) == want
        assert [c.opaque for c in FrameDecoder().feed(got)] == [0, 1, 2]
        channel.close()
        await stream.aclose()
        peer.close()


async def _no_requests(cmd: RemotingCommand, channel: Channel) -> None:
    raise AssertionError("the peer sends no requests")


async def _answering_peer(peer: Any, answered: list[int]) -> None:
    """Answer the requests read on ``peer`` (a SocketStream), the opaque as the remark."""
    dec = FrameDecoder()
    while data := await peer.receive_some(1 << 16):
        out = []
        for req in dec.feed(data):
            answered.append(req.opaque)
            out.append(
                encode(RemotingCommand(code=0, opaque=req.opaque, flag=1, remark=str(req.opaque)))
            )
        await peer.send_all(b"".join(out))  # what one read brought, answered in one write


async def test_requests_in_flight_leave_in_fewer_writes_and_each_gets_its_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With requests in flight, invoke_at leaves its frame to the request flusher, which writes
    what the tasks of one batch queued in one go, or FLUSH_AFTER of them at a time (module doc
    of channel.py, "The request flusher")."""
    import os

    writes = [0]
    most = [0]  # the most frames one write carried (each write here holds whole frames)
    real_write, real_writev = os.write, os.writev

    def count(data: bytes) -> None:
        writes[0] += 1
        pos = frames = 0
        while pos + 4 <= len(data):
            pos += 4 + int.from_bytes(data[pos : pos + 4], "big")
            frames += 1
        most[0] = max(most[0], frames)

    def write(fd: int, data: Any) -> int:
        count(bytes(data))
        return real_write(fd, data)

    def writev(fd: int, bufs: Any) -> int:
        count(b"".join(bytes(b) for b in bufs))
        return real_writev(fd, bufs)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "writev", writev)
    a, b = socket.socketpair()
    answered: list[int] = []
    got: dict[int, str | None] = {}
    with trio.fail_after(20):
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(a))
        channel = Channel(stream, "peer:1")
        peer = trio.SocketStream(trio.socket.from_stdlib_socket(b))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(channel.run, _no_requests)
            nursery.start_soon(_answering_peer, peer, answered)

            async def one(i: int) -> None:
                for j in range(20):
                    cmd = RemotingCommand(code=1, ext_fields={"i": f"{i}.{j}"}, body=b"x" * 100)
                    resp = await channel.invoke(cmd, 10.0)
                    got[cmd.opaque] = resp.remark

            async with trio.open_nursery() as senders:
                for i in range(32):
                    senders.start_soon(one, i)
            channel.close()
            nursery.cancel_scope.cancel()
        await peer.aclose()
        await stream.aclose()
    assert len(got) == 32 * 20
    assert all(remark == str(opaque) for opaque, remark in got.items())
    assert sorted(answered) == sorted(got)
    assert writes[0] < len(got) / 2  # coalesced: each write carried several frames
    assert 1 < most[0] <= FLUSH_AFTER  # and none more than FLUSH_AFTER of them


async def test_a_deferred_request_whose_write_fails_says_send_error() -> None:
    """The request flusher's failed write fails the deferred request with RemotingSendError,
    as the request's own wait for its write does."""
    from common.errors import RemotingSendError

    a, b = socket.socketpair()
    with trio.fail_after(20):
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(a))
        channel = Channel(stream, "peer:1")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(channel.run, _no_requests)
            errors: list[BaseException] = []

            async def invoke() -> None:
                try:
                    await channel.invoke(RemotingCommand(code=1), 10.0)
                except Exception as exc:
                    errors.append(exc)

            # two unanswered requests: the second starts the flusher, which then parks
            nursery.start_soon(invoke)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(invoke)
            await trio.testing.wait_all_tasks_blocked()
            assert channel._flusher is not None
            b.close()  # the peer is gone: the next write fails (EPIPE or ECONNRESET)
            await invoke()  # deferred to the flusher, without a checkpoint in between
            assert isinstance(errors[-1], RemotingSendError)
            nursery.cancel_scope.cancel()
        await stream.aclose()


async def test_a_waiter_wakes_its_task_once_and_forgets_a_cancelled_one() -> None:
    from common.remoting.channel import _Waiter

    settled = _Waiter()
    settled.settle()
    with trio.testing.assert_checkpoints():
        await settled.wait()  # already in: returns at once, after a checkpoint

    woken = _Waiter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(woken.wait)
        await trio.testing.wait_all_tasks_blocked()
        woken.settle()
        woken.settle()  # a second settle (the channel failing late) wakes nothing twice

    gone = _Waiter()
    with trio.move_on_after(0.01) as scope:
        await gone.wait()
    assert scope.cancelled_caught
    gone.settle()  # the cancelled task is not rescheduled
    await trio.testing.wait_all_tasks_blocked()
