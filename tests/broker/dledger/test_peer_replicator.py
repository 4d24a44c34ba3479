"""PeerReplicator: one answer or one failure per request, on both ways of waiting.

``memory`` awaits each answer in a task of its own (the in-memory network's answers have a
flight time); ``remoting`` (the remoting wire over in-memory streams) gets callbacks from the
channel's read loop and times calls out with the replicator's sweep.  Both under autojump.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import trio
import trio.testing

from broker.dledger.driver.memory_transport import MemoryDLedgerNetwork
from broker.dledger.driver.peer_replicator import PeerReplicator
from broker.dledger.driver.transport import RemotingDLedgerNetwork
from broker.dledger.raft.messages import (
    PushEntryRequest,
    PushEntryResponse,
    Request,
    Response,
)
from tests.support.memory_network import MemoryNetwork

from .test_transport import answer, heartbeat, push


@pytest.fixture(params=["memory", "remoting"])
def net(request):
    if request.param == "memory":
        return MemoryDLedgerNetwork()
    return RemotingDLedgerNetwork(network=MemoryNetwork())


class Outcomes:
    def __init__(self) -> None:
        self.answers: list[tuple[Request, Response]] = []
        self.failures: list[Request] = []

    def on_answer(self, request: Request, response: Response) -> None:
        self.answers.append((request, response))

    def on_failure(self, request: Request) -> None:
        self.failures.append(request)

    def count(self, request: Request) -> int:
        return sum(r is request for r, _ in self.answers) + sum(r is request for r in self.failures)


async def serve(nursery, net, handler):
    return await nursery.start(functools.partial(net.serve, "n1", "127.0.0.1:0", handler))


def replicator(client, addr, out, timeout=1.0):
    return PeerReplicator("n1", addr, client, out.on_answer, out.on_failure, timeout=timeout)


async def test_every_request_is_answered_once_in_order(net, autojump_clock):
    out = Outcomes()
    async with trio.open_nursery() as nursery:
        addr = await serve(nursery, net, answer)
        async with net.open_client("n0") as client:
            rep = replicator(client, addr, out)
            nursery.start_soon(rep.run)
            requests = [push(i) for i in range(200)]
            for r in requests:
                rep.send(r)
            await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert out.failures == []
    assert sorted(id(r) for r, _ in out.answers) == sorted(map(id, requests))
    if isinstance(net, RemotingDLedgerNetwork):  # callbacks come in the channel's read order
        assert [r for r, _ in out.answers] == requests
    pushes = [
        (r, resp)
        for r, resp in out.answers
        if isinstance(r, PushEntryRequest) and isinstance(resp, PushEntryResponse)
    ]
    assert len(pushes) == len(out.answers)
    assert all(resp.index == r.entries[0].index for r, resp in pushes)


async def test_answered_calls_are_not_kept_until_their_deadline(net, autojump_clock):
    """A request holds its entries' bodies: once answered, the replicator lets go of it, not a
    timeout later (the sweep sleeps until the oldest call's deadline)."""
    out = Outcomes()
    async with trio.open_nursery() as nursery:
        addr = await serve(nursery, net, answer)
        async with net.open_client("n0") as client:
            rep = replicator(client, addr, out, timeout=30.0)
            nursery.start_soon(rep.run)
            for i in range(100):
                rep.send(push(i))
            await trio.sleep(1.0)  # far less than the timeout
            assert len(out.answers) == 100
            assert len(rep._watched) == 0
        nursery.cancel_scope.cancel()


async def test_unanswered_calls_fail_once_after_the_timeout(net, autojump_clock):
    out = Outcomes()
    released = trio.Event()

    async def late(request):
        await released.wait()  # answers only after the replicator gave up
        return answer(request)

    async with trio.open_nursery() as nursery:
        addr = await serve(nursery, net, late)
        async with net.open_client("n0") as client:
            rep = replicator(client, addr, out, timeout=1.0)
            nursery.start_soon(rep.run)
            requests = [heartbeat(term=t) for t in range(5)]
            for r in requests:
                rep.send(r)
            await trio.sleep(0.99)
            assert out.failures == []  # not before the timeout
            await trio.sleep(0.5)
            assert len(out.failures) == len(requests)  # all of them, just after it
            released.set()  # the late answers arrive now: nobody may hear of them twice
            await trio.sleep(3)
        nursery.cancel_scope.cancel()
    assert out.answers == []
    assert sorted(map(id, out.failures)) == sorted(map(id, requests))
    assert all(out.count(r) == 1 for r in requests)


async def test_a_dead_peer_fails_each_request_once(net, autojump_clock):
    out = Outcomes()
    async with trio.open_nursery() as nursery:
        addr = await serve(nursery, net, answer)
        nursery.cancel_scope.cancel()  # nothing listens there any more
    async with trio.open_nursery() as nursery:
        async with net.open_client("n0") as client:
            rep = replicator(client, addr, out)
            nursery.start_soon(rep.run)
            requests = [heartbeat(term=t) for t in range(3)]
            for r in requests:
                rep.send(r)
            await trio.sleep(5)
            nursery.cancel_scope.cancel()
    assert out.answers == []
    assert sorted(map(id, out.failures)) == sorted(map(id, requests))


async def test_a_cancelled_replicator_reports_nothing_more(net, autojump_clock):
    out = Outcomes()
    released = trio.Event()

    async def late(request):
        await released.wait()
        return answer(request)

    async with trio.open_nursery() as nursery:
        addr = await serve(nursery, net, late)
        async with net.open_client("n0") as client:
            rep = replicator(client, addr, out, timeout=10.0)
            scope = trio.CancelScope()
            nursery.start_soon(_run_in, scope, rep)
            for t in range(4):
                rep.send(heartbeat(term=t))
            await trio.sleep(0.5)
            scope.cancel()
            await trio.sleep(0.5)
            released.set()  # answers for a replicator that is gone
            await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert out.answers == [] and out.failures == []


async def _run_in(scope: trio.CancelScope, rep: PeerReplicator) -> None:
    with scope:
        await rep.run()


@pytest.mark.parametrize("net", ["remoting"], indirect=True)
async def test_a_connected_peer_gets_each_push_from_send_itself(net, autojump_clock):
    """Once the connection is open, ``send`` posts the request itself: the replicator's task
    is not woken per push (one task switch per push and follower), and the order stays."""
    out = Outcomes()
    async with trio.open_nursery() as nursery:
        addr = await serve(nursery, net, answer)
        async with net.open_client("n0") as client:
            rep = replicator(client, addr, out)
            nursery.start_soon(rep.run)
            rep.send(push(0))  # no connection yet: the task connects and posts it
            await trio.sleep(0.1)
            assert len(out.answers) == 1
            requests = [push(i) for i in range(1, 50)]
            for i, r in enumerate(requests, start=2):
                rep.send(r)
                assert rep.calls == i and rep.queued == 0  # posted inside send
            await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert out.failures == []
    assert [r for r, _ in out.answers][1:] == requests


class _FailingOnSecondPost:
    """A client whose second inline post fails the first call at once (as a write that
    closes the connection fails every call waiting on it), then posts nothing or, with
    ``second_posts``, posts the second call (which is never answered)."""

    def __init__(self, second_posts: bool = False) -> None:
        self.callbacks: list = []
        self.second_posts = second_posts

    def post_nowait(self, addr, request, *, timeout):
        if len(self.callbacks) == 1:
            from broker.dledger.driver.transport import RpcUnreachable

            self.callbacks[0](RpcUnreachable("connection lost"))
            if not self.second_posts:
                return None
        client = self

        class Pending:
            def when_answered(self, fn):
                client.callbacks.append(fn)
                return True

            def cancel(self):
                pass

        return Pending()

    async def post(self, addr, request, *, timeout):
        from broker.dledger.driver.transport import RpcUnreachable

        raise RpcUnreachable("connection lost")


@pytest.mark.parametrize("second_posts", [False, True])
async def test_outcomes_set_off_inside_send_are_reported_by_the_task(second_posts, autojump_clock):
    out = Outcomes()
    inside = False

    def on_failure(request):
        assert not inside, "on_failure ran inside send"
        out.on_failure(request)

    client: Any = _FailingOnSecondPost(second_posts)
    rep = PeerReplicator("n1", "127.0.0.1:1", client, out.on_answer, on_failure, timeout=1.0)
    first, second = push(0), push(1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rep.run)
        await trio.sleep(0.01)
        inside = True
        rep.send(first)  # posted inline
        rep.send(second)  # fails the first while send runs, then is queued (or posted)
        inside = False
        await trio.sleep(0.5)
        if second_posts:
            assert out.failures == [first]  # from the task, though send had nothing queued
            await trio.sleep(1.0)  # the second was posted and never answered: the timeout
        nursery.cancel_scope.cancel()
    assert out.failures == [first, second]  # each once, from the task, in order
    assert out.answers == []
