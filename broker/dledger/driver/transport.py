"""How DLedger members reach each other: the network seam, its remoting (TCP) implementation.

Theory of operation
-------------------
A :class:`DLedgerNetwork` does two things for a member:

* ``serve`` binds the member's DLedger address (its entry of ``dLegerPeers``), reports the bound
  ``host:port`` through ``task_status`` and hands every request, *in arrival order*, to a plain
  (synchronous) handler.  The handler answers with a response, or with an awaitable of one when
  the answer must wait (the node answers a vote only once the vote is durable).  Arrival order
  matters: one leader's pushes to a follower must reach its log in the order they were sent.
* ``open_client`` gives a :class:`DLedgerClient`.  ``post`` queues one request and returns a
  :class:`PendingCall` whose ``answer()`` is the response, or raises an :class:`RpcError`
  (unreachable, no answer within the RPC timeout, an answer we cannot read).  Many calls run at
  once (pipelining) and the *write* order is explicit: a request's place on its connection is
  fixed when ``post`` returns, and ``post`` returns without a checkpoint while the connection
  is up, so requests posted one after another by one task leave in that order (Trio starts
  tasks in no particular order: spawning a task per request would not keep it).  ``call`` is
  ``post`` then ``answer``.

:class:`RemotingDLedgerNetwork` is DLedger's own wire (``DLedgerRpcNettyService.java`` in
openmessaging/dledger 0.3.1.2): a remoting command with ``code`` = the DLedgerRequestCode, no
extFields, and the JSON body of wire.py; the answer is a command with code 200 (DLedger writes
``DLedgerResponseCode.SUCCESS`` there; the DLedger result is the body's ``code``) and the JSON
response as body.  It runs over any ``common.remoting.network.Network``: TCP in production,
``tests.support.memory_network.MemoryNetwork`` in tests. Connections come from one
``RemotingClient`` per member, which reconnects on the next call after a connection failed.
Requests are served inline by the connection's read loop (arrival order); an undecodable body is
answered SYSTEM_ERROR, as a handler exception is.

Ordering rests on ``Channel.request_nowait``, which queues the frame before it returns; the
conformance test ``test_posted_calls_arrive_in_post_order`` holds every network to it.

The in-memory network with fault injection is in memory_transport.py.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

import attrs
import trio

from broker.dledger.driver.wire import (
    AnyRequest,
    AnyResponse,
    WireError,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    request_code,
)
from broker.dledger.raft.messages import (
    HeartBeatResponse,
    LeadershipTransferResponse,
    MetadataResponse,
    PushEntryResponse,
    VoteResponse,
)
from common.errors import RemotingError, RequestError
from common.remoting.channel import Channel, PendingResponse
from common.remoting.client import RemotingClient, open_remoting_client
from common.remoting.codes import DLedgerRequestCode, DLedgerResponseCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.network import TCP, Network, parse_addr
from common.remoting.server import RemotingServerHandle, RequestDispatcher, serve_remoting

__all__ = [
    "RESPONSE_TYPES",
    "RPC_TIMEOUT",
    "DLedgerClient",
    "DLedgerNetwork",
    "PendingCall",
    "RemotingDLedgerNetwork",
    "Reply",
    "RequestHandler",
    "RpcBadAnswer",
    "RpcError",
    "RpcTimeout",
    "RpcUnreachable",
    "SERVED_CODES",
]

log = logging.getLogger(__name__)

# DLedgerRpcNettyService: every invokeAsync waits 3 s
RPC_TIMEOUT = 3.0

# The requests a member answers (APPEND, GET and PULL are DLedger's client API: not served).
SERVED_CODES = (
    DLedgerRequestCode.METADATA,
    DLedgerRequestCode.VOTE,
    DLedgerRequestCode.HEART_BEAT,
    DLedgerRequestCode.PUSH,
    DLedgerRequestCode.LEADERSHIP_TRANSFER,
)

# What a handler's answer is when it is not an awaitable (isinstance narrows a Reply with it).
RESPONSE_TYPES = (
    VoteResponse,
    HeartBeatResponse,
    PushEntryResponse,
    LeadershipTransferResponse,
    MetadataResponse,
)

Reply = AnyResponse | Awaitable[AnyResponse]
#: Called in arrival order with each request; answers now, or with an awaitable of the answer.
RequestHandler = Callable[[AnyRequest], Reply]


class RpcError(RemotingError):
    """A DLedger call got no usable answer; the peer may or may not have handled it."""

    retriable = True


class RpcUnreachable(RpcError):
    """No connection to the peer (refused, closed under the call, or the member is down)."""


class RpcTimeout(RpcError):
    """No answer within the RPC timeout."""


class RpcBadAnswer(RpcError):
    """An answer that is not a DLedger response (undecodable, or a remoting error)."""


class PendingCall(Protocol):
    async def answer(self) -> AnyResponse:
        """The response; RpcError when there is none within the timeout given to ``post``."""
        ...

    def when_answered(self, fn: Callable[[AnyResponse | RpcError], None]) -> bool:
        """Arrange ``fn(response or RpcError)`` from the transport itself, with no task waiting,
        and return True; or return False (the caller awaits :meth:`answer`).  With a callback
        the *caller* bounds the time: it calls :meth:`cancel` once the timeout has passed."""
        ...

    def cancel(self) -> None:
        """Give up on the answer: ``fn`` will not be called."""
        ...


class DLedgerClient(Protocol):
    async def post(
        self, addr: str, request: AnyRequest, *, timeout: float = RPC_TIMEOUT
    ) -> PendingCall:
        """Queue ``request`` to the member at ``addr``; its place on the connection is fixed on
        return, with no checkpoint while connected.  RpcUnreachable without a connection."""
        ...

    async def call(
        self, addr: str, request: AnyRequest, *, timeout: float = RPC_TIMEOUT
    ) -> AnyResponse:
        """``post`` then ``answer``."""
        ...

    def post_nowait(
        self, addr: str, request: AnyRequest, *, timeout: float = RPC_TIMEOUT
    ) -> PendingCall | None:
        """``post`` without waiting, from synchronous code: the call, its place on the
        connection fixed, whose answer comes by ``when_answered`` only; or None (nothing sent)
        when that cannot be done at once (no open connection, or a transport that cannot).
        Never raises RpcError and never runs a callback of another call."""
        ...


class DLedgerNetwork(Protocol):
    async def serve(
        self,
        member_id: str,
        addr: str,
        handler: RequestHandler,
        *,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Bind ``addr`` (port 0: any free port), report the bound ``host:port``, answer every
        request with ``handler`` in arrival order until cancelled."""
        ...

    def open_client(self, member_id: str) -> AbstractAsyncContextManager[DLedgerClient]:
        """The client of ``member_id``'s calls; its connections end with the ``async with``."""
        ...


# --- remoting --------------------------------------------------------------------------------


def _answer(response: AnyResponse, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(DLedgerResponseCode.SUCCESS, body=encode_response(response))


async def _answer_later(reply: Awaitable[AnyResponse], cmd: RemotingCommand) -> RemotingCommand:
    return _answer(await reply, cmd)


def _serve_inline(
    handler: RequestHandler, cmd: RemotingCommand, channel: Channel
) -> RemotingCommand | Awaitable[RemotingCommand]:
    try:
        request = decode_request(cmd.code, cmd.body_bytes())
    except WireError as exc:
        log.warning(
            "undecodable DLedger request %d from %s: %s", cmd.code, channel.remote_addr, exc
        )
        raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
    reply = handler(request)
    if isinstance(reply, RESPONSE_TYPES):
        return _answer(reply, cmd)
    return _answer_later(reply, cmd)


@attrs.frozen
class _RemotingPending:
    addr: str
    code: DLedgerRequestCode
    pending: PendingResponse
    deadline: float

    async def answer(self) -> AnyResponse:
        name, addr = self.code.name, self.addr
        try:
            with trio.fail_at(self.deadline):
                answer = await self.pending.wait()
        except trio.TooSlowError:
            raise RpcTimeout(f"no answer from {addr} in time ({name})") from None
        except RemotingError as exc:
            raise RpcUnreachable(f"{name} to {addr}: {exc}") from exc
        return self._decode(answer)

    def _decode(self, answer: RemotingCommand) -> AnyResponse:
        name, addr = self.code.name, self.addr
        body = answer.body_bytes()
        if not body:
            raise RpcBadAnswer(f"{name} to {addr} answered {answer.code}: {answer.remark}")
        try:
            return decode_response(self.code, body)
        except WireError as exc:
            raise RpcBadAnswer(f"{name} to {addr}: {exc}") from exc

    def when_answered(self, fn: Callable[[AnyResponse | RpcError], None]) -> bool:
        def settled(answer: RemotingCommand | BaseException) -> None:
            outcome: AnyResponse | RpcError
            if isinstance(answer, BaseException):
                outcome = RpcUnreachable(f"{self.code.name} to {self.addr}: {answer}")
            else:
                try:
                    outcome = self._decode(answer)
                except RpcError as exc:
                    outcome = exc
            fn(outcome)

        self.pending.when_done(settled)
        return True

    def cancel(self) -> None:
        self.pending.cancel()


@attrs.define(eq=False)
class _RemotingClient:
    client: RemotingClient
    # addr -> the channel last used for it (the client replaces closed ones; so do we)
    _channels: dict[str, Channel] = attrs.field(factory=dict)

    async def post(
        self, addr: str, request: AnyRequest, *, timeout: float = RPC_TIMEOUT
    ) -> PendingCall:
        deadline = trio.current_time() + timeout
        code = request_code(request)
        cmd = RemotingCommand(code=int(code), body=encode_request(request))
        try:
            channel = self._channels.get(addr)
            if channel is None or channel.closed:
                with trio.fail_at(deadline):
                    channel = await self.client.get_channel(addr)
                self._channels[addr] = channel
            # no checkpoint since the check above: the frame's place is fixed right here
            pending = channel.request_nowait(cmd)
        except trio.TooSlowError:
            raise RpcTimeout(f"no connection to {addr} in time ({code.name})") from None
        except RemotingError as exc:
            raise RpcUnreachable(f"{code.name} to {addr}: {exc}") from exc
        return _RemotingPending(addr, code, pending, deadline)

    async def call(
        self, addr: str, request: AnyRequest, *, timeout: float = RPC_TIMEOUT
    ) -> AnyResponse:
        return await (await self.post(addr, request, timeout=timeout)).answer()

    def post_nowait(
        self, addr: str, request: AnyRequest, *, timeout: float = RPC_TIMEOUT
    ) -> PendingCall | None:
        channel = self._channels.get(addr)
        if channel is None or channel.closed:
            return None
        code = request_code(request)
        cmd = RemotingCommand(code=int(code), body=encode_request(request))
        try:
            # the write is attempted at once; one that fails closes the channel and fails
            # the calls waiting on it, whose callbacks then run here (the caller defers them)
            pending = channel.request_nowait(cmd)
        except RemotingError:
            return None
        return _RemotingPending(addr, code, pending, trio.current_time() + timeout)


@attrs.frozen
class RemotingDLedgerNetwork:
    """DLedger RPCs over remoting commands on ``network`` (TCP unless told otherwise)."""

    network: Network = TCP
    connect_timeout: float = RPC_TIMEOUT

    async def serve(
        self,
        member_id: str,
        addr: str,
        handler: RequestHandler,
        *,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        host, port = parse_addr(addr)
        dispatcher = RequestDispatcher()
        serve_one = functools.partial(_serve_inline, handler)
        for code in SERVED_CODES:
            dispatcher.register(code, serve_one, inline=True)
        async with trio.open_nursery() as nursery:
            handle: RemotingServerHandle = await nursery.start(
                functools.partial(serve_remoting, network=self.network), dispatcher, host, port
            )
            log.info("DLedger member %s serving on %s:%d", member_id, host, handle.port)
            task_status.started(f"{host}:{handle.port}")

    def open_client(self, member_id: str) -> AbstractAsyncContextManager[DLedgerClient]:
        return self._client()

    @asynccontextmanager
    async def _client(self) -> AsyncIterator[DLedgerClient]:
        async with open_remoting_client(
            connect_timeout=self.connect_timeout, network=self.network
        ) as client:
            yield _RemotingClient(client)
