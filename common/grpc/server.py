"""The gRPC server: a listener whose every connection is a :class:`GrpcConnection`.

``serve_grpc`` binds, reports a :class:`GrpcServerHandle` through ``task_status`` and serves until
cancelled, like ``serve_remoting``. ``accept`` (optional) turns an accepted stream into the one to
speak HTTP/2 on: the TLS wrapper (ALPN "h2"), or ``None`` to refuse the connection.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable

import attrs
import trio

from common.grpc.connection import GrpcConnection
from common.grpc.limits import GrpcServerLimits
from common.grpc.service import ServiceTable
from common.remoting.network import TCP, Network

log = logging.getLogger(__name__)

AcceptStream = Callable[[trio.abc.Stream], Awaitable[trio.abc.Stream | None]]


@attrs.define(eq=False)
class GrpcServerLoad:
    limits: GrpcServerLimits = attrs.Factory(GrpcServerLimits)
    connections: weakref.WeakSet[GrpcConnection] = attrs.Factory(weakref.WeakSet)
    refused_connections: int = 0


@attrs.frozen
class GrpcServerHandle:
    host: str
    port: int
    load: GrpcServerLoad = attrs.field(eq=False)


async def handle_grpc_stream(
    stream: trio.abc.Stream,
    services: ServiceTable,
    load: GrpcServerLoad,
    *,
    peer: str = "memory",
    accept: AcceptStream | None = None,
) -> None:
    """Serve one connection until it ends; never raises (but Cancelled)."""
    if len(load.connections) >= load.limits.max_connections:
        load.refused_connections += 1
        if load.refused_connections % 1000 == 1:
            log.warning(
                "closing the gRPC connection from %s: %d connections is the limit",
                peer,
                load.limits.max_connections,
            )
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(stream)
        return
    if accept is not None:
        try:
            wrapped = await accept(stream)
        except Exception as exc:  # a failed handshake ends this connection only
            log.info("gRPC connection from %s refused: %s", peer, exc)
            wrapped = None
        if wrapped is None:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            return
        stream = wrapped
    connection = GrpcConnection(stream, services, load.limits, peer=peer)
    load.connections.add(connection)
    try:
        await connection.run()
    finally:
        load.connections.discard(connection)


async def serve_grpc(
    services: ServiceTable,
    host: str = "0.0.0.0",
    port: int = 0,
    *,
    network: Network = TCP,
    limits: GrpcServerLimits | None = None,
    accept: AcceptStream | None = None,
    task_status: trio.TaskStatus[GrpcServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind ``host:port`` (0 = any free port), report it, serve until cancelled."""
    bound = await network.listen(host, port)
    load = GrpcServerLoad(limits or GrpcServerLimits())

    async def on_connection(stream: trio.abc.Stream) -> None:
        await handle_grpc_stream(
            stream, services, load, peer=network.peer_addr(stream), accept=accept
        )

    task_status.started(GrpcServerHandle(host=host, port=bound.port, load=load))
    await trio.serve_listeners(on_connection, bound.listeners)
