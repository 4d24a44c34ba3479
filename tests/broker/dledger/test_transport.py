"""One conformance suite for the DLedger networks, then the in-memory network's faults.

Kinds: ``memory`` (MemoryDLedgerNetwork), ``remoting`` (the remoting wire over the in-memory
stream network of tests.support.memory_network) and ``tcp`` (the remoting wire on loopback).  The first two run
under the autojump clock, the last one in real time.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import trio
import trio.testing

from broker.dledger.driver.memory_transport import MemoryDLedgerNetwork
from broker.dledger.driver.transport import (
    RemotingDLedgerNetwork,
    RpcBadAnswer,
    RpcError,
    RpcTimeout,
    RpcUnreachable,
)
from broker.dledger.raft.messages import (
    Entry,
    HeartBeatRequest,
    HeartBeatResponse,
    MetadataRequest,
    MetadataResponse,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    Request,
    VoteRequest,
)
from common.remoting.codes import DLedgerResponseCode as RC
from tests.support.memory_network import MemoryNetwork

KINDS = ["memory", "remoting", "tcp"]


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


@pytest.fixture
def clock(kind):
    # pytest-trio runs the test on any Clock fixture it finds; TCP runs in real time
    return None if kind == "tcp" else trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture
def net(kind):
    if kind == "memory":
        return MemoryDLedgerNetwork()
    if kind == "remoting":
        return RemotingDLedgerNetwork(network=MemoryNetwork())
    return RemotingDLedgerNetwork()


def heartbeat(term=1, src="n0", dst="n1"):
    return HeartBeatRequest(group="g", remote_id=dst, local_id=src, leader_id=src, term=term)


def push(index, src="n0", dst="n1"):
    entry = Entry(index=index, term=1, pos=index * 100, body=b"x" * 52)
    return PushEntryRequest(
        group="g", remote_id=dst, local_id=src, term=1, type=PushType.APPEND, entries=(entry,)
    )


def answer(request):
    if isinstance(request, PushEntryRequest):
        return PushEntryResponse(
            group=request.group,
            remote_id=request.local_id,
            local_id=request.remote_id,
            term=request.term,
            index=request.entries[0].index,
            count=1,
        )
    if isinstance(request, MetadataRequest):
        return MetadataResponse(
            group="g", remote_id=request.local_id, local_id="n1", peers={"n1": "a:1"}
        )
    return HeartBeatResponse(
        group=request.group,
        remote_id=request.local_id,
        local_id=request.remote_id,
        term=request.term,
        code=RC.SUCCESS if request.term >= 0 else RC.EXPIRED_TERM,
    )


async def post_all(client, addr, requests, results):
    """What a replicator does: post in order, collect each outcome in a task of its own."""

    async def collect(request, pending):
        try:
            results.append((request, await pending.answer()))
        except RpcError as exc:
            results.append((request, exc))

    async with trio.open_nursery() as waits:
        for request in requests:
            try:
                pending = await client.post(addr, request)
            except RpcError as exc:
                results.append((request, exc))
            else:
                waits.start_soon(collect, request, pending)


async def test_call_and_answer(net, clock):
    seen = []

    def handler(request):
        seen.append(request)
        return answer(request)

    async with trio.open_nursery() as nursery:
        addr = await nursery.start(functools.partial(net.serve, "n1", "127.0.0.1:0", handler))
        async with net.open_client("n0") as client:
            got = await client.call(addr, heartbeat(term=7))
            assert got == HeartBeatResponse(group="g", remote_id="n0", local_id="n1", term=7)
            got = await client.call(addr, heartbeat(term=-5))
            assert got.code == RC.EXPIRED_TERM
            meta = await client.call(addr, MetadataRequest(group="g", remote_id="n1", local_id="x"))
            assert meta.peers == {"n1": "a:1"}
        assert seen[0] == heartbeat(term=7)
        nursery.cancel_scope.cancel()


async def test_posted_calls_arrive_in_post_order(net, clock):
    arrived = []

    def handler(request):
        if isinstance(request, PushEntryRequest):
            arrived.append(request.entries[0].index)
        return answer(request)

    results: list[tuple[Request, Any]] = []  # (request, its answer or the error)
    async with trio.open_nursery() as nursery:
        addr = await nursery.start(functools.partial(net.serve, "n1", "127.0.0.1:0", handler))
        async with net.open_client("n0") as client:
            await client.call(addr, heartbeat())  # connected: posts do not wait
            await post_all(client, addr, [push(i) for i in range(300)], results)
        nursery.cancel_scope.cancel()
    assert arrived == list(range(300))
    assert sorted(r.index for _, r in results) == list(range(300))


async def test_posts_do_not_yield_while_connected(net, clock):
    """The ordering guarantee: nothing else runs between two posts of one task."""
    async with trio.open_nursery() as nursery:
        addr = await nursery.start(functools.partial(net.serve, "n1", "127.0.0.1:0", answer))
        async with net.open_client("n0") as client:
            await client.call(addr, heartbeat())
            ran = []

            async def other():
                ran.append("other")

            nursery.start_soon(other)
            pendings = [await client.post(addr, push(i)) for i in range(20)]
            assert ran == []
            assert [(await p.answer()).index for p in pendings] == list(range(20))
            assert ran == ["other"]
        nursery.cancel_scope.cancel()


async def test_deferred_answer_does_not_hold_later_requests(net, clock):
    release = trio.Event()
    order = []

    async def later(request):
        await release.wait()
        order.append(("answered", request.term))
        return answer(request)

    def handler(request):
        order.append(("handled", request.term))
        if request.term == 1:
            return later(request)
        return answer(request)

    async with trio.open_nursery() as nursery:
        addr = await nursery.start(functools.partial(net.serve, "n1", "127.0.0.1:0", handler))
        async with net.open_client("n0") as client:
            first = await client.post(addr, heartbeat(term=1))
            assert (await client.call(addr, heartbeat(term=2))).term == 2
            release.set()
            assert (await first.answer()).term == 1
        nursery.cancel_scope.cancel()
    assert order == [("handled", 1), ("handled", 2), ("answered", 1)]


async def test_nobody_there_is_unreachable(net, clock, kind):
    async with trio.open_nursery() as nursery:
        # bind and stop, so the address is known to be free
        addr = await nursery.start(functools.partial(net.serve, "n1", "127.0.0.1:0", answer))
        nursery.cancel_scope.cancel()
    async with net.open_client("n0") as client:
        with trio.fail_after(2):
            with pytest.raises(RpcUnreachable):
                await client.call(addr, heartbeat())


async def test_no_answer_times_out(net, clock):
    async def never(request):
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        addr = await nursery.start(functools.partial(net.serve, "n1", "127.0.0.1:0", never))
        async with net.open_client("n0") as client:
            start = trio.current_time()
            with pytest.raises(RpcTimeout):
                await client.call(addr, heartbeat(), timeout=0.5)
            assert 0.5 <= trio.current_time() - start < 1.5
        nursery.cancel_scope.cancel()


async def test_handler_failure_is_a_bad_answer(net, clock):
    def broken(request):
        raise RuntimeError("boom")

    async with trio.open_nursery() as nursery:
        addr = await nursery.start(functools.partial(net.serve, "n1", "127.0.0.1:0", broken))
        async with net.open_client("n0") as client:
            with pytest.raises(RpcBadAnswer):
                await client.call(addr, heartbeat())
        nursery.cancel_scope.cancel()


async def test_server_restart_reconnects(net, clock):
    async with net.open_client("n0") as client:
        async with trio.open_nursery() as nursery:
            addr = await nursery.start(functools.partial(net.serve, "n1", "127.0.0.1:0", answer))
            assert (await client.call(addr, heartbeat(term=1))).term == 1
            nursery.cancel_scope.cancel()
        with pytest.raises(RpcError):
            await client.call(addr, heartbeat(term=2))
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(net.serve, "n1", addr, answer))
            assert (await client.call(addr, heartbeat(term=3))).term == 3
            nursery.cancel_scope.cancel()


# --- the remoting wire itself --------------------------------------------------------------------


async def test_remoting_frames_are_dledger_commands(autojump_clock):
    """A raw remoting client sees DLedger's framing: code 51002, no extFields, JSON body; the
    answer has command code 200 and the JSON response body."""
    from common.remoting.client import open_remoting_client
    from common.remoting.command import RemotingCommand

    streams = MemoryNetwork()
    net = RemotingDLedgerNetwork(network=streams)
    async with trio.open_nursery() as nursery:
        addr = await nursery.start(functools.partial(net.serve, "n1", "127.0.0.1:0", answer))
        async with open_remoting_client(network=streams) as raw:
            body = (
                b'{"code":200,"group":"g","leaderId":"n0","localId":"n0","remoteId":"n1","term":4}'
            )
            got = await raw.invoke(addr, RemotingCommand(code=51002, body=body))
            assert got.code == 200
            assert got.ext_fields == {}
            assert got.body == (b'{"code":200,"group":"g","localId":"n1","remoteId":"n0","term":4}')
            bad = await raw.invoke(addr, RemotingCommand(code=51002, body=b"{nope"))
            assert bad.code == 1 and "not JSON" in (bad.remark or "")
            unknown = await raw.invoke(addr, RemotingCommand(code=50002, body=b"{}"))
            assert unknown.code == 3
        nursery.cancel_scope.cancel()


# --- faults of the in-memory network -------------------------------------------------------------


async def serve_members(nursery, net, members, handler=answer):
    return {
        m: await nursery.start(functools.partial(net.serve, m, "127.0.0.1:0", handler))
        for m in members
    }


async def test_partition_loses_messages_until_heal(autojump_clock):
    net = MemoryDLedgerNetwork()
    async with trio.open_nursery() as nursery:
        addrs = await serve_members(nursery, net, ["n1", "n2"])
        async with net.open_client("n0") as client:
            net.partition(["n0"], ["n1"])
            with pytest.raises(RpcTimeout):
                await client.call(addrs["n1"], heartbeat(), timeout=1)
            assert (await client.call(addrs["n2"], heartbeat(dst="n2"))).term == 1
            net.heal()
            assert (await client.call(addrs["n1"], heartbeat())).term == 1
        nursery.cancel_scope.cancel()


async def test_kill_fails_calls_in_flight_and_revive_restores(autojump_clock):
    net = MemoryDLedgerNetwork(min_delay=0.5, max_delay=0.5)
    async with trio.open_nursery() as nursery:
        addrs = await serve_members(nursery, net, ["n1"])
        async with net.open_client("n0") as client:
            pending = await client.post(addrs["n1"], heartbeat())
            await trio.sleep(0.1)
            net.kill("n1")
            start = trio.current_time()
            with pytest.raises(RpcUnreachable):
                await pending.answer()
            assert trio.current_time() == start  # at once: the connection was reset
            with pytest.raises(RpcUnreachable):
                await client.call(addrs["n1"], heartbeat())
            net.revive("n1")
            start = trio.current_time()
            assert (await client.call(addrs["n1"], heartbeat())).term == 1
            assert trio.current_time() - start == pytest.approx(1.0)  # two one-way delays
        nursery.cancel_scope.cancel()


async def test_drop_is_seeded_and_loses_about_its_share(autojump_clock):
    async def run(seed):
        net = MemoryDLedgerNetwork(seed=seed, drop=0.3)
        outcomes: list[tuple[Request, Any]] = []  # (request, its answer or the error)
        async with trio.open_nursery() as nursery:
            addrs = await serve_members(nursery, net, ["n1"])
            async with net.open_client("n0") as client:
                await post_all(client, addrs["n1"], [push(i) for i in range(200)], outcomes)
            nursery.cancel_scope.cancel()
        return sorted(r.index for _, r in outcomes if not isinstance(r, RpcError))

    first, again, other = await run(1), await run(1), await run(2)
    assert first == again != other
    # a call survives when both its request and its answer do: 0.7 ** 2 = 0.49
    assert 70 < len(first) < 130


async def test_reorder_lets_requests_overtake(autojump_clock):
    async def arrival_order(reorder):
        net = MemoryDLedgerNetwork(seed=3, min_delay=0.01, max_delay=0.2, reorder=reorder)
        arrived = []

        def handler(request):
            arrived.append(request.entries[0].index)
            return answer(request)

        async with trio.open_nursery() as nursery:
            addrs = await serve_members(nursery, net, ["n1"], handler)
            async with net.open_client("n0") as client:
                await post_all(client, addrs["n1"], [push(i) for i in range(100)], [])
            nursery.cancel_scope.cancel()
        return arrived

    assert await arrival_order(0.0) == list(range(100))
    shuffled = await arrival_order(0.5)
    assert sorted(shuffled) == list(range(100)) and shuffled != list(range(100))


async def test_killed_member_cannot_call_out(autojump_clock):
    net = MemoryDLedgerNetwork()
    async with trio.open_nursery() as nursery:
        addrs = await serve_members(nursery, net, ["n1"])
        net.kill("n0")
        async with net.open_client("n0") as client:
            with pytest.raises(RpcUnreachable):
                await client.call(addrs["n1"], heartbeat())
        nursery.cancel_scope.cancel()


async def test_vote_request_travels(autojump_clock):
    net = MemoryDLedgerNetwork()
    got = []

    def handler(request):
        got.append(request)
        return answer(request)

    async with trio.open_nursery() as nursery:
        addrs = await serve_members(nursery, net, ["n1"], handler)
        async with net.open_client("n0") as client:
            vote = VoteRequest(group="g", remote_id="n1", local_id="n0", term=2, leader_id="n0")
            await client.call(addrs["n1"], vote)
        nursery.cancel_scope.cancel()
    assert got == [vote]
