"""The service table: what a gRPC path ("/apache.rocketmq.v2.MessagingService/SendMessage") runs.

A method is one of three kinds, by how many messages go each way: unary (one request, one
response), server streaming (one request, any number of responses: ReceiveMessage) and
bidirectional (Telemetry). Handlers are typed by their messages through the constructors
:func:`unary`, :func:`server_streaming` and :func:`bidi_streaming`; the transport only sees
protobuf messages. A handler ends its call with a status other than OK by raising
:class:`common.grpc.status.GrpcError`.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar

import attrs
from google.protobuf.message import Message

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


class MethodKind(enum.Enum):
    UNARY = "unary"
    SERVER_STREAMING = "server_streaming"
    BIDI_STREAMING = "bidi_streaming"


@attrs.define(eq=False)
class CallContext:
    """What a handler knows of its call."""

    path: str
    # request headers by lower-case name (grpc's "metadata"); values decoded as latin-1
    metadata: Mapping[str, str]
    peer: str
    # the connection the call came on (for per-connection state such as a telemetry channel)
    connection_id: int
    # seconds the client gave the call (grpc-timeout), None when it gave none
    timeout: float | None = None


class Send(Generic[Resp]):
    """Sends one response message of a streaming call (waits for the peer's window)."""

    def __init__(self, fn: Callable[[Message], Awaitable[None]]) -> None:
        self._fn = fn

    async def __call__(self, message: Resp) -> None:
        await self._fn(message)


@attrs.frozen
class Method:
    kind: MethodKind
    request_type: type[Message]
    # called as the kind says (see the constructors); typed at construction
    handler: Callable[..., Awaitable[Any]]


def unary(
    request_type: type[Req], handler: Callable[[Req, CallContext], Awaitable[Resp]]
) -> Method:
    return Method(MethodKind.UNARY, request_type, handler)


def server_streaming(
    request_type: type[Req],
    handler: Callable[[Req, CallContext, Send[Resp]], Awaitable[None]],
) -> Method:
    return Method(MethodKind.SERVER_STREAMING, request_type, handler)


def bidi_streaming(
    request_type: type[Req],
    handler: Callable[[AsyncIterator[Req], CallContext, Send[Resp]], Awaitable[None]],
) -> Method:
    return Method(MethodKind.BIDI_STREAMING, request_type, handler)


ServiceTable = Mapping[str, Method]
"""``"/<package>.<Service>/<Method>"`` -> Method."""
