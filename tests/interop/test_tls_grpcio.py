"""What a RocketMQ 5.x client built on grpcio needs from our TLS: the official Python client
(`rocketmq-python-client` 5.1.2, `rocketmq/v5/client/connection/rpc_channel.py`) opens
`aio.secure_channel(endpoint, grpc.ssl_channel_credentials())` when `tls_enable=True`: grpcio's
default roots, which `GRPC_DEFAULT_SSL_ROOTS_FILE_PATH` replaces, the certificate checked
against the endpoint's host, and ALPN "h2".

A grpcio client in a subprocess (so the environment variable is read at its start) dials a
port served through `accept_stream` with the gRPC listener's policy (`alpn=("h2",)`); the
server checks the handshake finished with h2 and reads the HTTP/2 client preface over TLS.
"""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path

import pytest
import trio

from cli.local.certificates import LocalTls, ensure_local_tls
from common.tls import TlsMode, TlsServerConfig, accept_stream, server_policy

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

CLIENT = """
import sys, grpc
channel = grpc.secure_channel(sys.argv[1], grpc.ssl_channel_credentials())
call = channel.unary_unary("/apache.rocketmq.v2.MessagingService/QueryRoute")
try:
    call(b"", timeout=3)
except grpc.RpcError as exc:
    print(exc.code(), exc.details())
"""


async def _serve_once(certs: LocalTls, env: dict[str, str]) -> tuple[object, bytes]:
    policy = server_policy(
        TlsServerConfig(
            mode=TlsMode.PERMISSIVE,
            cert_path=str(certs.server_cert),
            key_path=str(certs.server_key),
        ),
        alpn=("h2",),
    )
    result: list[tuple[object, bytes]] = []
    served_one = trio.Event()

    async def handle(stream: trio.SocketStream) -> None:
        served = await accept_stream(stream, policy)
        if served is None:
            result.append((None, b""))
            served_one.set()
            return
        assert isinstance(served, trio.SSLStream)
        data = b""
        with trio.move_on_after(5):
            while len(data) < len(H2_PREFACE):
                chunk = await served.receive_some()
                if not chunk:
                    break
                data += chunk
        result.append((served.selected_alpn_protocol(), data[: len(H2_PREFACE)]))
        served_one.set()
        await trio.aclose_forcefully(served)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            await trio.run_process(
                [sys.executable, "-c", CLIENT, f"127.0.0.1:{port}"],
                env={**os.environ, **env},
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            await served_one.wait()
            nursery.cancel_scope.cancel()
    return result[0]


async def test_grpcio_trusts_the_local_ca_through_its_roots_variable(tmp_path: Path) -> None:
    certs = ensure_local_tls(tmp_path)
    alpn, preface = await _serve_once(
        certs, {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(certs.ca_cert)}
    )
    assert (alpn, preface) == ("h2", H2_PREFACE)


async def test_grpcio_without_the_ca_refuses_the_server(tmp_path: Path) -> None:
    certs = ensure_local_tls(tmp_path)
    env = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(ensure_local_tls(tmp_path / "other").ca_cert)}
    alpn, preface = await _serve_once(certs, env)
    assert (alpn, preface) == (None, b"")  # the handshake failed: no stream was served
