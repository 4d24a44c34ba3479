"""A Trio in-memory :class:`~broker.dledger.driver.transport.DLedgerNetwork` that can lose, delay,
reorder and partition messages, and kill a member's endpoint.  For tests; runs under
``autojump_clock`` (every wait is an Event or a deadline on Trio's clock).

Theory of operation
-------------------
Members are known by id: ``serve(member_id, addr, handler)`` registers an endpoint for the
address (port 0 gets a made-up free one), and a client opened for ``member_id`` sends as that
member, so faults can be stated per pair of members.

A call is one :class:`_Call`.  Posting it (synchronous, so calls posted one after another
keep that order) decides its fate from the seeded RNG and the fault settings:

* to an address nobody serves, to a killed member, or from one: ``post`` raises RpcUnreachable
  after ``refuse_delay`` (a refused connection is quick but not instant; a zero delay would let
  a caller that retries at once spin without the clock moving);
* across a partition, or with probability ``drop``: it is lost, and the caller's timeout fires;
* otherwise it is queued at the endpoint for ``now + delay`` where the delay is drawn from
  ``[min_delay, max_delay]``.  Requests of one link (sender, receiver) keep their order (a later
  one never arrives before an earlier one, like one TCP connection) unless, with probability
  ``reorder``, a request skips that rule and arrives when its own delay says.

Each endpoint has one delivery task that hands due requests to the handler in arrival order,
inline (as the remoting server's read loop does).  The answer travels back under the same rules
(lost with probability ``drop`` or when the pair is partitioned by then, else delayed).
Killing a member fails every call in flight from or to it at once (its connections reset), and
the requests queued at its endpoint are never handled; ``revive`` lets it talk again.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import attrs
import trio

from broker.dledger.driver.transport import (
    RESPONSE_TYPES,
    RPC_TIMEOUT,
    DLedgerClient,
    PendingCall,
    RequestHandler,
    RpcBadAnswer,
    RpcError,
    RpcTimeout,
    RpcUnreachable,
)
from broker.dledger.driver.wire import AnyRequest, AnyResponse
from common.remoting.network import parse_addr

__all__ = ["MemoryDLedgerNetwork"]

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class _Call:
    src: str
    dst: str
    request: AnyRequest
    # set once the call's outcome is known (answer, or error); the caller wakes on it
    done: trio.Event = attrs.field(factory=trio.Event)
    response: AnyResponse | None = None
    error: RpcError | None = None
    # when the outcome reaches the caller (the answer's flight time, or the refusal delay)
    arrive: float = 0.0


@attrs.define(eq=False)
class _Endpoint:
    member_id: str
    addr: str
    handler: RequestHandler
    # requests not yet handled: (arrival time, post sequence, call), a heap
    queue: list[tuple[float, int, _Call]] = attrs.field(factory=list)
    # set when the queue's head may have changed; replaced after each wake
    wake: trio.Event = attrs.field(factory=trio.Event)


@attrs.define(eq=False)
class MemoryDLedgerNetwork:
    seed: int = 0
    # probability that a request, and independently its answer, is lost
    drop: float = 0.0
    # one-way delay bounds, seconds
    min_delay: float = 0.0
    max_delay: float = 0.0
    # probability that a request ignores its link's FIFO order
    reorder: float = 0.0
    refuse_delay: float = 0.001
    # every fault decision draws from it, in post/answer order: one seed, one run
    _rng: random.Random = attrs.field(init=False)
    # member id -> its endpoint, while its serve() runs
    _endpoints: dict[str, _Endpoint] = attrs.field(factory=dict)
    # addr -> member id of the endpoint bound there
    _members: dict[str, str] = attrs.field(factory=dict)
    # (sender, receiver) pairs whose messages are lost
    _blocked: set[tuple[str, str]] = attrs.field(factory=set)
    _killed: set[str] = attrs.field(factory=set)
    # per link: arrival time of its latest in-order request (arrivals never go below it)
    _last_arrival: dict[tuple[str, str], float] = attrs.field(factory=dict)
    # calls whose outcome is not known yet
    _in_flight: set[_Call] = attrs.field(factory=set)
    # tie-breaker of equal arrival times: post order
    _seq: itertools.count[int] = attrs.field(factory=itertools.count)
    # made-up ports for serve() on port 0
    _ports: itertools.count[int] = attrs.field(factory=lambda: itertools.count(41000))
    # counters, for tests
    posted: int = 0
    lost: int = 0
    handled: int = 0

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    # --- faults --------------------------------------------------------------------------------

    def partition(self, side_a: Iterable[str], side_b: Iterable[str]) -> None:
        """Lose every message between a member of ``side_a`` and one of ``side_b``."""
        b = list(side_b)
        for x in side_a:
            for y in b:
                self._blocked.add((x, y))
                self._blocked.add((y, x))

    def heal(self) -> None:
        self._blocked.clear()

    def kill(self, member_id: str) -> None:
        """Cut ``member_id`` off: its calls and calls to it fail at once, until revived."""
        self._killed.add(member_id)
        for call in list(self._in_flight):
            if member_id in (call.src, call.dst):
                self._finish(call, error=RpcUnreachable(f"{call.dst} connection reset"))
        endpoint = self._endpoints.get(member_id)
        if endpoint is not None:
            endpoint.queue.clear()

    def revive(self, member_id: str) -> None:
        self._killed.discard(member_id)

    def can_talk(self, src: str, dst: str) -> bool:
        """Whether a message from ``src`` to ``dst`` would get through now (drops aside)."""
        return (
            src not in self._killed and dst not in self._killed and (src, dst) not in self._blocked
        )

    # --- calls ---------------------------------------------------------------------------------

    def _delay(self) -> float:
        if self.max_delay <= 0:
            return 0.0
        return self._rng.uniform(self.min_delay, self.max_delay)

    def _finish(
        self,
        call: _Call,
        *,
        response: AnyResponse | None = None,
        error: RpcError | None = None,
        after: float = 0.0,
    ) -> None:
        if call.done.is_set():
            return
        call.response, call.error = response, error
        call.arrive = trio.current_time() + after
        self._in_flight.discard(call)
        call.done.set()

    def _lose(self, call: _Call) -> None:
        self.lost += 1
        self._in_flight.discard(call)  # the caller's timeout ends it

    def _post(self, src: str, addr: str, request: AnyRequest) -> _Call:
        dst = self._members.get(addr, "")
        call = _Call(src, dst, request)
        self.posted += 1
        endpoint = self._endpoints.get(dst)
        if endpoint is None or src in self._killed or dst in self._killed:
            self._finish(
                call, error=RpcUnreachable(f"connect to {addr} refused"), after=self.refuse_delay
            )
            return call
        self._in_flight.add(call)
        if (src, dst) in self._blocked or self._rng.random() < self.drop:
            self._lose(call)
            return call
        at = trio.current_time() + self._delay()
        if self.reorder <= 0 or self._rng.random() >= self.reorder:
            link = (src, dst)
            at = max(at, self._last_arrival.get(link, at))
            self._last_arrival[link] = at
        heapq.heappush(endpoint.queue, (at, next(self._seq), call))
        endpoint.wake.set()
        return call

    def _answer(self, call: _Call, response: AnyResponse) -> None:
        if call.done.is_set():
            return  # failed meanwhile (a kill)
        if not self.can_talk(call.dst, call.src) or self._rng.random() < self.drop:
            self._lose(call)
            return
        self._finish(call, response=response, after=self._delay())

    async def _answer_later(self, call: _Call, reply: Awaitable[AnyResponse]) -> None:
        try:
            response = await reply
        except Exception as exc:
            log.exception("handler of %s failed", call.dst)
            self._finish(call, error=RpcBadAnswer(f"{call.dst} failed: {exc!r}"))
            return
        self._answer(call, response)

    async def _answer_of(self, call: _Call, addr: str, deadline: float) -> AnyResponse:
        try:
            with trio.move_on_at(deadline):
                await call.done.wait()
                await trio.sleep_until(call.arrive)
        finally:
            self._in_flight.discard(call)
        if not call.done.is_set() or trio.current_time() < call.arrive:
            raise RpcTimeout(f"no answer from {addr} in time")
        if call.error is not None:
            raise call.error
        assert call.response is not None
        return call.response

    # --- serving -------------------------------------------------------------------------------

    async def serve(
        self,
        member_id: str,
        addr: str,
        handler: RequestHandler,
        *,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        host, port = parse_addr(addr)
        if port == 0:
            port = next(self._ports)
        bound = f"{host}:{port}"
        if bound in self._members or member_id in self._endpoints:
            raise OSError(f"{bound} ({member_id}) is already served")
        endpoint = _Endpoint(member_id, bound, handler)
        self._endpoints[member_id] = endpoint
        self._members[bound] = member_id
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(bound)
                await self._deliver(endpoint, nursery)
        finally:
            del self._endpoints[member_id]
            del self._members[bound]
            for _, _, call in endpoint.queue:
                self._finish(call, error=RpcUnreachable(f"{bound} closed"))

    async def _deliver(self, endpoint: _Endpoint, nursery: trio.Nursery) -> None:
        queue = endpoint.queue
        while True:
            if not queue or queue[0][0] > trio.current_time():
                endpoint.wake = trio.Event()
                with trio.move_on_at(queue[0][0] if queue else float("inf")):
                    await endpoint.wake.wait()
                continue
            _, _, call = heapq.heappop(queue)
            if call.done.is_set():
                continue
            if not self.can_talk(call.src, call.dst):
                self._lose(call)  # partitioned or killed while in flight
                continue
            self.handled += 1
            try:
                reply = endpoint.handler(call.request)
            except Exception as exc:
                log.exception("handler of %s failed", endpoint.member_id)
                self._finish(call, error=RpcBadAnswer(f"{endpoint.member_id} failed: {exc!r}"))
                continue
            if isinstance(reply, RESPONSE_TYPES):
                self._answer(call, reply)
            else:
                nursery.start_soon(self._answer_later, call, reply)

    def open_client(self, member_id: str) -> AbstractAsyncContextManager[DLedgerClient]:
        return self._client(member_id)

    @asynccontextmanager
    async def _client(self, member_id: str) -> AsyncIterator[DLedgerClient]:
        yield _MemoryClient(self, member_id)
        await trio.lowlevel.checkpoint()


@attrs.frozen
class _MemoryPending:
    network: MemoryDLedgerNetwork
    call: _Call
    addr: str
    deadline: float

    async def answer(self) -> AnyResponse:
        return await self.network._answer_of(self.call, self.addr, self.deadline)

    def when_answered(self, fn: Callable[[AnyResponse | RpcError], None]) -> bool:
        return False  # answers have a flight time here: the caller waits with answer()

    def cancel(self) -> None:
        pass


@attrs.frozen
class _MemoryClient:
    network: MemoryDLedgerNetwork
    member_id: str

    async def post(
        self, addr: str, request: AnyRequest, *, timeout: float = RPC_TIMEOUT
    ) -> PendingCall:
        deadline = trio.current_time() + timeout
        call = self.network._post(self.member_id, addr, request)
        if call.error is not None:  # refused: as quick as a refused connect, not instant
            await trio.sleep_until(call.arrive)
            raise call.error
        return _MemoryPending(self.network, call, addr, deadline)

    async def call(
        self, addr: str, request: AnyRequest, *, timeout: float = RPC_TIMEOUT
    ) -> AnyResponse:
        return await (await self.post(addr, request, timeout=timeout)).answer()

    def post_nowait(
        self, addr: str, request: AnyRequest, *, timeout: float = RPC_TIMEOUT
    ) -> PendingCall | None:
        return None  # answers have a flight time here: the replicator's task awaits them
