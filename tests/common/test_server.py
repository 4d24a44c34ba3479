import struct
from typing import cast

import pytest
import trio
import trio.testing

from common.errors import RequestError
from common.remoting.codec import FrameDecoder, encode
from common.remoting.command import ONEWAY_FLAG, RESPONSE_FLAG, Body, RemotingCommand
from common.remoting.server import Channel, RequestDispatcher, handle_stream


class Peer:
    """The test's end of a memory connection: raw frames out, decoded commands in."""

    def __init__(self, stream):
        self.stream = stream
        self.decoder = FrameDecoder()
        self.ready: list[RemotingCommand] = []
        self.next_opaque = 100

    async def send(
        self,
        code: int,
        ext: dict[str, object] | None = None,
        body: Body = b"",
        *,
        oneway: bool = False,
    ) -> int:
        cmd = RemotingCommand.request(code, ext, body, oneway=oneway)
        self.next_opaque += 1
        cmd.opaque = self.next_opaque
        await self.stream.send_all(encode(cmd))
        return cmd.opaque

    async def answer(self) -> RemotingCommand:
        """Next command; there must be one."""
        cmd = await self.receive()
        assert cmd is not None, "EOF"
        return cmd

    async def receive(self) -> RemotingCommand | None:
        """Next command, or None at EOF."""
        while not self.ready:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.ready.extend(self.decoder.feed(data))
        return self.ready.pop(0)


async def echo(cmd, channel):
    return cmd.response(ext_fields={"echo": cmd.ext_fields.get("v", "")}, body=cmd.body)


def make_dispatcher():
    d = RequestDispatcher()
    d.register(1000, echo)
    return d


async def start(nursery, dispatcher, addr="peer"):
    client_side, server_side = trio.testing.memory_stream_pair()
    nursery.start_soon(lambda: handle_stream(server_side, dispatcher, remote_addr=addr))
    return Peer(client_side)


async def test_response_has_flag_and_opaque(autojump_clock):
    async with trio.open_nursery() as nursery:
        peer = await start(nursery, make_dispatcher())
        opaque = await peer.send(1000, {"v": "x"}, b"payload")
        resp = await peer.receive()
        assert resp.flag & RESPONSE_FLAG and resp.opaque == opaque
        assert resp.code == 0 and resp.ext_fields == {"echo": "x"} and resp.body == b"payload"
        await peer.stream.aclose()


async def test_slow_handler_does_not_block_fast_one(autojump_clock):
    d = make_dispatcher()

    async def slow(cmd, channel):
        await trio.sleep(10)
        return cmd.response(remark="slow")

    d.register(1001, slow)
    async with trio.open_nursery() as nursery:
        peer = await start(nursery, d)
        slow_opaque = await peer.send(1001)
        fast_opaque = await peer.send(1000)
        first = await peer.receive()
        assert first.opaque == fast_opaque and trio.current_time() < 1
        second = await peer.receive()
        assert second.opaque == slow_opaque and second.remark == "slow"
        assert trio.current_time() >= 10
        await peer.stream.aclose()


async def test_oneway_gets_no_answer(autojump_clock):
    seen = []

    async def record(cmd, channel):
        seen.append(cmd.ext_fields["v"])
        return cmd.response()

    d = make_dispatcher()
    d.register(1002, record)
    async with trio.open_nursery() as nursery:
        peer = await start(nursery, d)
        await peer.send(1002, {"v": "a"}, oneway=True)
        opaque = await peer.send(1000)
        resp = await peer.receive()
        assert resp.opaque == opaque
        await peer.stream.send_eof()
        assert await peer.receive() is None  # nothing else was sent
    assert seen == ["a"]


async def test_unknown_code_answers_3(autojump_clock):
    async with trio.open_nursery() as nursery:
        peer = await start(nursery, make_dispatcher())
        await peer.send(999)
        resp = await peer.receive()
        assert resp.code == 3 and resp.remark == " request type 999 not supported"
        await peer.stream.aclose()


async def test_unknown_code_ignore_policy_and_default_handler(autojump_clock):
    d = make_dispatcher()
    d.unknown_code_policy = "ignore"
    async with trio.open_nursery() as nursery:
        peer = await start(nursery, d)
        await peer.send(999)
        opaque = await peer.send(1000)
        assert (await peer.receive()).opaque == opaque
        d.set_default(lambda cmd, ch: _answer(cmd, 42))
        await peer.send(998)
        assert (await peer.receive()).code == 42
        await peer.stream.aclose()


async def _answer(cmd, code):
    return cmd.response(code)


async def test_handler_errors_become_codes(autojump_clock, caplog):
    async def boom(cmd, channel):
        raise ValueError("boom")

    async def refuse(cmd, channel):
        raise RequestError(17, "No topic route info in name server for the topic: T")

    async def missing(cmd, channel):
        cmd.get_str("topic")

    async def group(cmd, channel):
        async with trio.open_nursery() as n:
            n.start_soon(refuse, cmd, channel)

    d = make_dispatcher()
    for code, fn in ((1, boom), (2, refuse), (3, missing), (4, group)):
        d.register(2000 + code, fn)
    async with trio.open_nursery() as nursery:
        peer = await start(nursery, d)
        answers = {}
        for code in (2001, 2002, 2003, 2004):
            await peer.send(code)
            resp = await peer.receive()
            answers[code] = (resp.code, resp.remark)
        # the connection survived every error
        await peer.send(1000)
        assert (await peer.receive()).code == 0
        await peer.stream.aclose()
    assert answers[2001] == (1, "boom")
    assert answers[2002] == (17, "No topic route info in name server for the topic: T")
    assert answers[2003] == (1, "the custom field topic is null")
    assert answers[2004][0] == 17
    assert "boom" in caplog.text


async def test_oversized_frame_closes_only_that_connection(autojump_clock):
    closed: list[Channel] = []
    d = make_dispatcher()
    d.add_close_listener(closed.append)
    async with trio.open_nursery() as nursery:
        bad = await start(nursery, d, "bad")
        good = await start(nursery, d, "good")
        await bad.stream.send_all(struct.pack(">i", 16 * 1024 * 1024))
        assert await bad.receive() is None  # server closed it
        assert [c.remote_addr for c in closed] == ["bad"]
        await good.send(1000, {"v": "still"})
        assert (await good.receive()).ext_fields == {"echo": "still"}
        await good.stream.aclose()
    assert sorted(c.remote_addr for c in closed) == ["bad", "good"]
    assert all(c.closed for c in closed)


async def test_garbage_closes_connection_after_answering_earlier_frames(autojump_clock):
    async with trio.open_nursery() as nursery:
        peer = await start(nursery, make_dispatcher())
        good = RemotingCommand.request(1000, {"v": "1"})
        good.opaque = 7
        await peer.stream.send_all(encode(good) + struct.pack(">iI", 9, 5) + b"{oops")
        # the good request may or may not be answered before the close; the connection must end
        while (resp := await peer.receive()) is not None:
            assert resp.opaque == 7


async def test_close_listener_on_peer_close_and_eof_grace(autojump_clock):
    closed = []
    done = []

    async def short_job(cmd, channel):
        await trio.sleep(0.5)
        done.append("short")

    async def long_job(cmd, channel):
        try:
            await trio.sleep(100)
            done.append("long")
        except trio.Cancelled:
            done.append("long cancelled")
            raise

    d = make_dispatcher()
    d.register(1003, short_job)
    d.register(1004, long_job)
    d.add_close_listener(lambda ch: closed.append(trio.current_time()))
    async with trio.open_nursery() as nursery:
        peer = await start(nursery, d)
        await peer.send(1003, oneway=True)
        await peer.send(1004, oneway=True)
        await trio.sleep(0.1)
        await peer.stream.aclose()
    assert done == ["short", "long cancelled"]
    assert len(closed) == 1 and closed[0] < 5


async def test_multi_part_body_written_back_to_back(autojump_clock):
    big = bytes(range(256)) * 1024  # 256 KiB, above the join limit
    data = bytearray(big)

    async def parts(cmd, channel):
        view = memoryview(data)
        return cmd.response(body=[view[:1000], view[1000:], b"tail"])

    async def small_parts(cmd, channel):
        return cmd.response(body=(b"ab", memoryview(b"cd")))

    d = make_dispatcher()
    d.register(1005, parts)
    d.register(1006, small_parts)
    async with trio.open_nursery() as nursery:
        peer = await start(nursery, d)
        await peer.send(1005)
        await peer.send(1006)
        first, second = await peer.receive(), await peer.receive()
        by_len = sorted([first, second], key=lambda c: len(c.body))
        assert by_len[0].body == b"abcd"
        assert by_len[1].body == big + b"tail"
        await peer.stream.aclose()


async def test_concurrent_large_responses_never_interleave(autojump_clock):
    async def blob(cmd, channel):
        size = int(cmd.ext_fields["n"])
        fill = cmd.ext_fields["c"].encode()
        await trio.lowlevel.checkpoint()
        return cmd.response(body=[fill * size, fill * size])

    d = make_dispatcher()
    d.register(1007, blob)
    async with trio.open_nursery() as nursery:
        client_side, server_side = trio.testing.lockstep_stream_pair()
        nursery.start_soon(lambda: handle_stream(server_side, d))
        peer = Peer(client_side)
        for c in "abcdef":
            await peer.send(1007, {"n": 100_000, "c": c})
        bodies = [(await peer.answer()).body_bytes() for _ in range(6)]
        assert sorted(bodies) == [c.encode() * 200_000 for c in "abcdef"]
        await peer.stream.aclose()


async def test_server_invoke_to_peer_and_oneway_push(autojump_clock):
    results = []

    async def ask_back(cmd, channel):
        reply = await channel.invoke(RemotingCommand.request(40, {"consumerGroup": "g"}), 3.0)
        results.append((reply.code, reply.remark))
        await channel.send(RemotingCommand.request(40, {"x": "push"}, oneway=True))
        return cmd.response()

    d = make_dispatcher()
    d.register(1008, ask_back)
    async with trio.open_nursery() as nursery:
        peer = await start(nursery, d)
        my_opaque = await peer.send(1008)
        server_req = await peer.receive()
        assert server_req.code == 40 and not server_req.is_response
        await peer.stream.send_all(encode(server_req.response(0, "got it")))
        push = await peer.receive()
        assert push.ext_fields == {"x": "push"} and push.flag & ONEWAY_FLAG
        final = await peer.receive()
        assert final.opaque == my_opaque and final.code == 0
        await peer.stream.aclose()
    assert results == [(0, "got it")]


async def test_server_invoke_times_out_when_peer_is_silent(autojump_clock):
    from common.errors import RemotingTimeoutError

    async def ask_back(cmd, channel):
        with pytest.raises(RemotingTimeoutError):
            await channel.invoke(RemotingCommand.request(40), 2.0)
        return cmd.response(remark=f"{trio.current_time():.0f}")

    d = make_dispatcher()
    d.register(1009, ask_back)
    async with trio.open_nursery() as nursery:
        peer = await start(nursery, d)
        await peer.send(1009)
        assert (await peer.receive()).code == 40  # ignored by us
        resp = await peer.receive()
        assert resp.code == 0 and resp.remark == "2"
        await peer.stream.aclose()


# --- inline handlers ---------------------------------------------------------------------------


async def test_inline_handlers_run_in_arrival_order(autojump_clock):
    # Trio may start a batch of new tasks in any order; inline handlers run in the read loop.
    seen = []

    def record(cmd, channel):
        seen.append(int(cmd.ext_fields["i"]))
        return cmd.response(ext_fields={"i": cmd.ext_fields["i"]})

    d = make_dispatcher()
    d.register(1010, record, inline=True)
    async with trio.open_nursery() as nursery:
        client_side, server_side = trio.testing.memory_stream_pair()
        nursery.start_soon(lambda: handle_stream(server_side, d))
        peer = Peer(client_side)
        frames = []
        for i in range(200):
            cmd = RemotingCommand.request(1010, {"i": i})
            cmd.opaque = i + 1
            frames.append(encode(cmd))
        await peer.stream.send_all(b"".join(frames))
        answers = [await peer.answer() for _ in range(200)]
        assert sorted(int(a.ext_fields["i"]) for a in answers) == list(range(200))
        assert all(a.opaque == int(a.ext_fields["i"]) + 1 for a in answers)
        await peer.stream.aclose()
    assert seen == list(range(200))


async def test_inline_handler_results(autojump_clock, caplog):
    order = []

    def inline(cmd, channel):
        kind = cmd.ext_fields["k"]
        order.append(kind)
        if kind == "now":
            return cmd.response(remark="now")
        if kind == "none":
            return None
        if kind == "refuse":
            raise RequestError(17, "no such topic")
        if kind == "bug":
            raise KeyError("bug")

        async def later():
            await trio.sleep(5)
            return cmd.response(remark=f"later at {trio.current_time():.0f}")

        return later()

    d = make_dispatcher()
    d.register(1011, inline, inline=True)
    async with trio.open_nursery() as nursery:
        peer = await start(nursery, d)
        later = await peer.send(1011, {"k": "later"})
        now = await peer.send(1011, {"k": "now"})
        await peer.send(1011, {"k": "none"})
        await peer.send(1011, {"k": "now"}, oneway=True)
        refuse = await peer.send(1011, {"k": "refuse"})
        bug = await peer.send(1011, {"k": "bug"})
        got = {}
        for _ in range(4):
            resp = await peer.receive()
            got[resp.opaque] = (resp.code, resp.remark)
        assert got == {
            now: (0, "now"),
            refuse: (17, "no such topic"),
            bug: (1, "'bug'"),
            later: (0, "later at 5"),
        }
        # the awaitable did not hold up the answers queued after it
        await peer.stream.aclose()
    assert order == ["later", "now", "none", "now", "refuse", "bug"]
    assert "bug" in caplog.text


async def test_dispatch_awaits_inline_handlers_too(autojump_clock):
    d = RequestDispatcher()

    def quick(cmd, channel):
        return cmd.response(remark="quick")

    def slow(cmd, channel):
        async def rest():
            await trio.sleep(1)
            return cmd.response(remark="slow")

        return rest()

    d.register(1, quick, inline=True)
    d.register(2, slow, inline=True)
    # these handlers never look at the channel
    no_channel = cast(Channel, None)

    async def answer(cmd: RemotingCommand) -> RemotingCommand:
        got = await d.dispatch(cmd, no_channel)
        assert got is not None
        return got

    assert (await answer(RemotingCommand.request(1))).remark == "quick"
    assert (await answer(RemotingCommand.request(2))).remark == "slow"
    # registering again as a task handler replaces the inline one
    d.register(1, echo)
    assert (await answer(RemotingCommand.request(1, {"v": "e"}))).ext_fields == {"echo": "e"}


async def test_dispatch_awaits_an_inline_deferred_answer(autojump_clock):
    """A caller outside a read loop (the gRPC service's local calls) gets the answer an inline
    handler sets later, as a SYNC_MASTER send's replica wait does."""
    from common.remoting.deferred_answer import DeferredAnswer

    deferred = DeferredAnswer()
    d = RequestDispatcher()
    d.register(7, lambda cmd, ch: deferred, inline=True)
    req = RemotingCommand.request(7)

    async def answer_later() -> None:
        await trio.sleep(1)
        deferred.set(req.response(0, "late"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_later)
        resp = await d.dispatch_guarded(req, cast(Channel, None))
    assert resp is not None and resp.remark == "late"
