"""The network side of one peer: the core's requests to it, pipelined in the order they were sent.

Theory of operation
-------------------
The core decides what to send to whom (its per-follower dispatchers, DLedger's
``DLedgerEntryPusher``, are in broker/dledger/raft/entry_pusher.py); a :class:`PeerReplicator`
only carries it.  ``send`` (synchronous, called while the node runs
the core's actions in order) appends the request to a queue; ``run`` posts queued requests in
queue order (``DLedgerClient.post`` fixes each one's place on the connection without a
checkpoint while connected, transport.py), so many wait at once while the writes keep the
core's order.  Each answer goes to ``on_answer``, each failure (no connection, no answer within
the RPC timeout, an unreadable answer) to ``on_failure``; the core decides what a failure means
(DLedger turns it into a NETWORK_ERROR answer).  After at most :data:`POST_BATCH` posts the task
lets others run.

Waiting for answers: a transport that can (remoting: ``PendingCall.when_answered``) calls back
from its read loop, and the replicator keeps the posted calls in post order with their
deadlines; one *sweep* task sleeps until the oldest deadline and fails (and cancels) every call
still unanswered by then.  Post order is deadline order (one timeout for all), so the sweep
only ever looks at the head.  A transport that cannot (the in-memory network, whose answers
have a flight time) gets one small task per call awaiting ``answer()``.  Remoting avoids that: a
task and a cancel scope per call cost a quarter of a leader's CPU with 32 single sends in flight.

Posting inline: when nothing is queued and the connection is open, ``send`` posts the request
itself (``DLedgerClient.post_nowait``), so a push leaves in the same turn as the core decided it,
without waking the replicator's task (one task switch per push and follower: with one send at a
time that is one per message and follower).  What that post sets off synchronously (a write that
fails closes the connection and fails the calls waiting on it) is not reported from inside
``send``: outcomes that arrive while ``send`` runs wait in ``_deferred`` for the task.

The queue is bounded (the core's in-flight limit plus slack): a request that finds it full is
not sent and comes back through ``on_failure``, from the replicator's task, never from inside
``send`` (the node may be in the middle of running the core's actions).  After a refused
connection the next call waits :data:`UNREACHABLE_BACKOFF`, so a core that resends at once to a
dead peer cannot spin.

Invariant: requests leave in the order ``send`` received them; every request sent gets exactly
one ``on_answer`` or ``on_failure`` (unless the replicator is cancelled first): a watched call
is settled once, by its callback or by the sweep, whichever comes first (``_Watched.settled``).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable

import attrs
import trio

from broker.dledger.driver.transport import (
    DLedgerClient,
    PendingCall,
    RpcError,
    RpcTimeout,
    RpcUnreachable,
)
from broker.dledger.driver.wire import AnyResponse
from broker.dledger.raft.messages import MetadataResponse, Request, Response

__all__ = ["UNREACHABLE_BACKOFF", "PeerReplicator"]

log = logging.getLogger(__name__)

# a refused connection takes microseconds; the next call to that peer waits this long
UNREACHABLE_BACKOFF = 0.05
# posts between two checkpoints of the replicator task
POST_BATCH = 64


@attrs.define(eq=False)
class _Watched:
    """A posted call whose answer comes by callback (see the module docstring)."""

    request: Request
    pending: PendingCall
    deadline: float
    settled: bool = False


@attrs.define(eq=False)
class PeerReplicator:
    peer: str
    addr: str
    client: DLedgerClient
    on_answer: Callable[[Request, Response], None]
    on_failure: Callable[[Request], None]
    limit: int = 1064
    timeout: float = 3.0
    # requests not yet started, in send order
    _pending: deque[Request] = attrs.field(factory=deque)
    # requests that found _pending full; reported failed by run()
    _overflow: list[Request] = attrs.field(factory=list)
    # set when either list gained a request; replaced before each wait
    _wake: trio.Event = attrs.field(factory=trio.Event)
    # no call starts before this time (after a refused connection)
    _retry_at: float = -math.inf
    # posted calls answered by callback, in post (= deadline) order; a settled one leaves when
    # every call before it has settled too (see _settle)
    _watched: deque[_Watched] = attrs.field(factory=deque)
    # set when _watched gained a call while the sweep had nothing to watch
    _sweep_wake: trio.Event = attrs.field(factory=trio.Event)
    # counters, for status and tests
    calls: int = 0
    failures: int = 0
    # True while send() posts inline: outcomes go to _deferred instead of the callbacks
    _in_send: bool = False
    # (watched call, outcome) settled while send() ran; reported by run()
    _deferred: list[tuple[_Watched, AnyResponse | RpcError]] = attrs.field(factory=list)

    def send(self, request: Request) -> None:
        if (
            not self._pending
            and not self._overflow
            and not self._deferred
            and trio.current_time() >= self._retry_at
        ):
            self._in_send = True
            try:
                pending = self.client.post_nowait(self.addr, request, timeout=self.timeout)
                posted = pending is not None and self._watch_inline(request, pending)
            finally:
                self._in_send = False
            if self._deferred:
                self._wake.set()
            if posted:
                return
        if len(self._pending) >= self.limit:
            self._overflow.append(request)
        else:
            self._pending.append(request)
        self._wake.set()

    def _watch_inline(self, request: Request, pending: PendingCall) -> bool:
        self.calls += 1
        watched = _Watched(request, pending, trio.current_time() + self.timeout)
        if not pending.when_answered(lambda outcome: self._settle(watched, outcome)):
            # not a transport that posts inline (post_nowait returns None there): fail it
            # from the task rather than leave it unwatched
            pending.cancel()
            self._deferred.append((watched, RpcUnreachable("no callback for an inline post")))
            self._wake.set()
            return True
        if not watched.settled:
            self._watched.append(watched)
            self._sweep_wake.set()
        return True

    @property
    def queued(self) -> int:
        return len(self._pending)

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            # cancelled: answers that still come must not reach a core that moved on
            for watched in self._watched:
                watched.settled = True
                watched.pending.cancel()
            self._watched.clear()

    async def _run(self) -> None:
        async with trio.open_nursery() as waits:
            waits.start_soon(self._sweep)
            while True:
                while not self._pending and not self._overflow and not self._deferred:
                    self._wake = trio.Event()
                    await self._wake.wait()
                if self._deferred:
                    deferred, self._deferred = self._deferred, []
                    for watched, outcome in deferred:
                        self._report(watched, outcome)
                if self._overflow:
                    refused, self._overflow = self._overflow, []
                    for request in refused:
                        self.failures += 1
                        self.on_failure(request)
                if self._pending and trio.current_time() < self._retry_at:
                    await trio.sleep_until(self._retry_at)
                    continue
                for _ in range(POST_BATCH):
                    if not self._pending:
                        break
                    request = self._pending.popleft()
                    self.calls += 1
                    try:
                        pending = await self.client.post(self.addr, request, timeout=self.timeout)
                    except RpcError as exc:
                        self._failed(request, exc)
                        break
                    self._watch(request, pending, waits)
                await trio.lowlevel.checkpoint()

    def _watch(self, request: Request, pending: PendingCall, waits: trio.Nursery) -> None:
        watched = _Watched(request, pending, trio.current_time() + self.timeout)
        if not pending.when_answered(lambda outcome: self._settle(watched, outcome)):
            waits.start_soon(self._await, request, pending)
            return
        if not watched.settled:
            self._watched.append(watched)
            self._sweep_wake.set()

    def _settle(self, watched: _Watched, outcome: AnyResponse | RpcError) -> None:
        if watched.settled:
            return
        watched.settled = True
        # drop the settled front now rather than at the sweep's next wake, which is the head's
        # deadline: each request holds its entries, and under load that would keep `timeout`
        # seconds of pushes alive per follower (50 MiB at 16k msg/s of 1 KiB)
        queue = self._watched
        while queue and queue[0].settled:
            queue.popleft()
        if self._in_send:
            self._deferred.append((watched, outcome))
            return
        self._report(watched, outcome)

    def _report(self, watched: _Watched, outcome: AnyResponse | RpcError) -> None:
        if isinstance(outcome, RpcError):
            self._failed(watched.request, outcome)
        elif isinstance(outcome, MetadataResponse):  # not an answer the core asked for
            self._failed(watched.request, None)
        else:
            self.on_answer(watched.request, outcome)

    async def _sweep(self) -> None:
        watched = self._watched
        while True:
            while watched and watched[0].settled:
                watched.popleft()
            if not watched:
                self._sweep_wake = trio.Event()
                await self._sweep_wake.wait()
                continue
            head = watched[0]
            if trio.current_time() < head.deadline:
                await trio.sleep_until(head.deadline)
                continue
            watched.popleft()
            if not head.settled:
                head.settled = True
                head.pending.cancel()
                self._failed(head.request, RpcTimeout(f"no answer from {self.peer} in time"))

    async def _await(self, request: Request, pending: PendingCall) -> None:
        try:
            response = await pending.answer()
        except RpcError as exc:
            self._failed(request, exc)
            return
        if isinstance(response, MetadataResponse):  # not an answer the core asked for
            self._failed(request, None)
            return
        self.on_answer(request, response)

    def _failed(self, request: Request, exc: RpcError | None) -> None:
        if isinstance(exc, RpcUnreachable):
            self._retry_at = trio.current_time() + UNREACHABLE_BACKOFF
        log.debug("%s to %s failed: %s", type(request).__name__, self.peer, exc)
        self.failures += 1
        self.on_failure(request)
