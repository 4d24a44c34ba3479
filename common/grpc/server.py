"""The gRPC server: a listener whose every connection is a :class:`GrpcConnection`.

``serve_grpc`` binds, reports a :class:`GrpcServerHandle` through ``task_status`` and serves until
cancelled, like ``serve_remoting``. ``tls`` is the listener's TLS policy (common/tls.py:
disabled, permissive or enforcing); its context must offer ALPN "h2", which gRPC clients
require.
"""

from __future__ import annotations

import logging
import weakref

import attrs
import trio

from common.grpc.connection import GrpcConnection
from common.grpc.limits import GrpcServerLimits
from common.grpc.service import ServiceTable
from common.remoting.network import TCP, Network
from common.tls import PLAIN, TlsPolicy, accept_stream

log = logging.getLogger(__name__)


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
    tls: TlsPolicy = PLAIN,
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
    if tls.enabled:
        # accept_stream closes what it refuses (a failed or missing handshake)
        wrapped = await accept_stream(stream, tls, peer=peer)
        if wrapped is None:
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
    tls: TlsPolicy = PLAIN,
    task_status: trio.TaskStatus[GrpcServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind ``host:port`` (0 = any free port), report it, serve until cancelled."""
    bound = await network.listen(host, port)
    load = GrpcServerLoad(limits or GrpcServerLimits())

    async def on_connection(stream: trio.abc.Stream) -> None:
        await handle_grpc_stream(stream, services, load, peer=network.peer_addr(stream), tls=tls)

    task_status.started(GrpcServerHandle(host=host, port=bound.port, load=load))
    await trio.serve_listeners(on_connection, bound.listeners)
