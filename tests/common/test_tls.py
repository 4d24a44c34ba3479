"""TLS on the remoting port (common/tls.py): the config keys, the accept seam in each mode, and
the real server and client with it, in memory (autojump clock) and over loopback TCP.

Certificates come from `rmq up --tls`'s own local CA (cli/local/certificates.py), made once per
test session.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trio
import trio.testing

from cli.local.certificates import LocalTls, ensure_local_tls
from common.errors import RemotingError
from common.remoting.client import open_remoting_client
from common.remoting.command import RemotingCommand
from common.remoting.network import TCP
from common.remoting.server import RequestDispatcher, serve_remoting
from common.tls import (
    PLAIN,
    ClientAuth,
    ReplayStream,
    TlsClientConfig,
    TlsConfigError,
    TlsMode,
    TlsNetwork,
    TlsPolicy,
    TlsServerConfig,
    accept_stream,
    client_ssl_context,
    server_policy,
    tls_properties,
)
from namesrv.config import parse_properties
from tests.support.memory_network import MemoryNetwork

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> LocalTls:
    return ensure_local_tls(tmp_path_factory.mktemp("tls"))


def server_cfg(certs: LocalTls, mode: TlsMode) -> TlsServerConfig:
    return TlsServerConfig(
        mode=mode, cert_path=str(certs.server_cert), key_path=str(certs.server_key)
    )


def client_ctx(certs: LocalTls) -> ssl.SSLContext:
    return client_ssl_context(TlsClientConfig(enable=True, trust_cert_path=str(certs.ca_cert)))


# --- configuration -----------------------------------------------------------------------------


def test_server_keys_as_rocketmq_names_them() -> None:
    cfg = TlsServerConfig.from_properties(
        {
            "tls.server.mode": "Enforcing",
            "tls.server.certPath": "/c.pem",
            "tls.server.keyPath": "/k.pem",
            "tls.server.need.client.auth": "optional",
            "tls.server.trustCertPath": "/ca.pem",
            "tls.server.handshakeTimeoutMillis": "2500",
            "brokerName": "ignored",
        }
    )
    assert cfg == TlsServerConfig(
        mode=TlsMode.ENFORCING,
        cert_path="/c.pem",
        key_path="/k.pem",
        need_client_auth=ClientAuth.OPTIONAL,
        trust_cert_path="/ca.pem",
        handshake_timeout=2.5,
    )
    # RocketMQ's default mode
    assert TlsServerConfig.from_properties({}).mode is TlsMode.PERMISSIVE
    with pytest.raises(TlsConfigError, match="tls.server.mode"):
        TlsServerConfig.from_properties({"tls.server.mode": "sometimes"})
    client = TlsClientConfig.from_properties(
        {"tls.enable": "true", "tls.client.trustCertPath": "/ca.pem", "tls.client.authServer": "x"}
    )
    assert client == TlsClientConfig(enable=True, trust_cert_path="/ca.pem", auth_server=False)


def test_tls_config_file_is_read_and_the_nodes_own_keys_win(tmp_path: Path) -> None:
    f = tmp_path / "tls.properties"
    f.write_text("tls.server.mode=enforcing\ntls.server.certPath=/from-file.pem\nother=1\n")
    props = {"tls.config.file": str(f), "tls.server.mode": "permissive", "listenPort": "1"}
    merged = tls_properties(props, parse_properties)
    assert merged == {
        "tls.config.file": str(f),
        "tls.server.mode": "permissive",
        "tls.server.certPath": "/from-file.pem",
    }
    with pytest.raises(TlsConfigError, match="missing"):
        tls_properties({"tls.config.file": str(tmp_path / "missing")}, parse_properties)


def test_policy_without_a_certificate(certs: LocalTls) -> None:
    # permissive without a certificate serves plain (module docstring); enforcing cannot work
    assert server_policy(TlsServerConfig()) is PLAIN
    assert server_policy(TlsServerConfig(mode=TlsMode.DISABLED)) is PLAIN
    with pytest.raises(TlsConfigError, match="enforcing"):
        server_policy(TlsServerConfig(mode=TlsMode.ENFORCING))
    with pytest.raises(TlsConfigError, match="/nope.pem, /nope.key"):
        server_policy(TlsServerConfig(cert_path="/nope.pem", key_path="/nope.key"))
    policy = server_policy(server_cfg(certs, TlsMode.PERMISSIVE), alpn=("h2",))
    assert policy.enabled and policy.context is not None


def test_broker_conf_carries_the_tls_keys(certs: LocalTls) -> None:
    from broker.config import BrokerConfig

    cfg = BrokerConfig.from_properties(
        f"brokerName=b\ntls.config.file={certs.properties}\ntls.server.mode=enforcing\n"
    )
    assert cfg.broker_name == "b"
    assert cfg.tls == server_cfg(certs, TlsMode.ENFORCING)
    assert cfg.tls_client == TlsClientConfig(enable=True, trust_cert_path=str(certs.ca_cert))


# --- the accept seam, in memory (autojump clock) -----------------------------------------------


async def _tls_client(stream: trio.abc.Stream, certs: LocalTls) -> trio.SSLStream[trio.abc.Stream]:
    tls = trio.SSLStream(stream, client_ctx(certs), server_hostname="127.0.0.1")
    await tls.do_handshake()
    return tls


@pytest.mark.parametrize("mode", [TlsMode.PERMISSIVE, TlsMode.ENFORCING])
async def test_tls_client_is_served_over_tls(
    certs: LocalTls, mode: TlsMode, autojump_clock: trio.testing.MockClock
) -> None:
    policy = server_policy(server_cfg(certs, mode), alpn=("h2",))
    client_end, server_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        got: list[trio.abc.Stream | None] = []

        async def server() -> None:
            served = await accept_stream(server_end, policy)
            got.append(served)
            assert served is not None
            await served.send_all(b"pong:" + await served.receive_some())

        nursery.start_soon(server)
        ctx = client_ssl_context(
            TlsClientConfig(enable=True, trust_cert_path=str(certs.ca_cert)), alpn=("h2",)
        )
        tls = trio.SSLStream(client_end, ctx, server_hostname="127.0.0.1")
        await tls.send_all(b"ping")
        assert await tls.receive_some() == b"pong:ping"
        assert tls.selected_alpn_protocol() == "h2"
    assert isinstance(got[0], trio.SSLStream)


async def test_permissive_serves_plain_bytes_unchanged(
    certs: LocalTls, autojump_clock: trio.testing.MockClock
) -> None:
    policy = server_policy(server_cfg(certs, TlsMode.PERMISSIVE))
    client_end, server_end = trio.testing.memory_stream_pair()
    await client_end.send_all(b"\x00\x00\x00\x10rest")
    served = await accept_stream(server_end, policy)
    assert isinstance(served, ReplayStream)
    # the peeked byte is not lost, and reads of any size see the bytes in order
    assert await served.receive_some(2) == b"\x00\x00"
    assert await served.receive_some() == b"\x00\x10rest"
    await client_end.send_all(b"more")
    assert await served.receive_some() == b"more"


async def test_enforcing_closes_a_plain_client(
    certs: LocalTls, autojump_clock: trio.testing.MockClock
) -> None:
    policy = server_policy(server_cfg(certs, TlsMode.ENFORCING))
    client_end, server_end = trio.testing.memory_stream_pair()
    await client_end.send_all(b"\x00\x00\x00\x10" + b"x" * 16)  # a remoting frame
    assert await accept_stream(server_end, policy) is None
    with trio.fail_after(1):  # closed: the client sees the end (an alert, then EOF)
        while await client_end.receive_some():
            pass


@pytest.mark.parametrize(
    "hello",
    [
        b"\x16\x03\x01\x00\x05hello" + b"\x00" * 64,  # a handshake record holding garbage
        b"\x16" + bytes(range(256)) * 4,
        b"\x16",  # then EOF
    ],
    ids=["bad-record", "noise", "one-byte"],
)
@pytest.mark.parametrize("mode", [TlsMode.PERMISSIVE, TlsMode.ENFORCING])
async def test_garbage_instead_of_a_client_hello_closes_only_that_connection(
    certs: LocalTls, hello: bytes, mode: TlsMode, autojump_clock: trio.testing.MockClock
) -> None:
    policy = server_policy(server_cfg(certs, mode))
    client_end, server_end = trio.testing.memory_stream_pair()
    await client_end.send_all(hello)
    if hello == b"\x16":
        await client_end.send_eof()
    start = trio.current_time()
    assert await accept_stream(server_end, policy) is None
    assert trio.current_time() - start < policy.handshake_timeout


@pytest.mark.parametrize("sends", [b"", b"\x16\x03\x01"], ids=["silent", "half-a-hello"])
@pytest.mark.parametrize("mode", [TlsMode.PERMISSIVE, TlsMode.ENFORCING])
async def test_a_client_that_never_finishes_is_closed_after_the_handshake_timeout(
    certs: LocalTls, sends: bytes, mode: TlsMode, autojump_clock: trio.testing.MockClock
) -> None:
    policy = TlsPolicy(mode, server_policy(server_cfg(certs, mode)).context, 3.0)
    client_end, server_end = trio.testing.memory_stream_pair()
    if sends:
        await client_end.send_all(sends)
    start = trio.current_time()
    assert await accept_stream(server_end, policy) is None
    assert trio.current_time() - start == pytest.approx(3.0)


async def test_eof_before_any_byte(certs: LocalTls, autojump_clock: trio.testing.MockClock) -> None:
    policy = server_policy(server_cfg(certs, TlsMode.PERMISSIVE))
    client_end, server_end = trio.testing.memory_stream_pair()
    await client_end.aclose()
    assert await accept_stream(server_end, policy) is None


async def test_a_client_that_does_not_trust_the_server_fails_and_the_server_closes(
    certs: LocalTls, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    other = ensure_local_tls(tmp_path / "other")  # another CA
    policy = server_policy(server_cfg(certs, TlsMode.ENFORCING))
    client_end, server_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        got: list[object] = []

        async def server() -> None:
            got.append(await accept_stream(server_end, policy))

        nursery.start_soon(server)
        with pytest.raises(trio.BrokenResourceError) as info:
            await _tls_client(client_end, other)
        assert isinstance(info.value.__cause__, ssl.SSLCertVerificationError)
    assert got == [None]


# --- the real server and client ----------------------------------------------------------------


def _echo_dispatcher() -> RequestDispatcher:
    d = RequestDispatcher()

    async def echo(cmd: RemotingCommand, channel: object) -> RemotingCommand:
        return cmd.response(body=cmd.body)

    d.register(1000, echo)
    return d


async def test_memory_network_server_with_tls_and_plain_clients(
    certs: LocalTls, autojump_clock: trio.testing.MockClock
) -> None:
    net = MemoryNetwork()
    tls_net = TlsNetwork(net, client_ctx(certs))
    policy = server_policy(server_cfg(certs, TlsMode.PERMISSIVE))
    async with trio.open_nursery() as nursery:
        h = await nursery.start(
            lambda task_status: serve_remoting(
                _echo_dispatcher(), "127.0.0.1", 0, network=net, tls=policy, task_status=task_status
            )
        )
        addr = f"127.0.0.1:{h.port}"
        async with open_remoting_client(network=tls_net) as secure:
            r = await secure.invoke(addr, RemotingCommand.request(1000, body=b"tls"))
            assert r.body == b"tls"
            [channel] = h.load.channels
            assert isinstance(channel._stream, trio.SSLStream)
        async with open_remoting_client(network=net) as plain:
            r = await plain.invoke(addr, RemotingCommand.request(1000, body=b"plain"))
            assert r.body == b"plain"
        nursery.cancel_scope.cancel()


async def test_tcp_enforcing_refuses_plain_and_stays_up_for_tls(certs: LocalTls) -> None:
    policy = TlsPolicy(
        TlsMode.ENFORCING, server_policy(server_cfg(certs, TlsMode.ENFORCING)).context, 2.0
    )
    tls_net = TlsNetwork(TCP, client_ctx(certs))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            h = await nursery.start(
                lambda task_status: serve_remoting(
                    _echo_dispatcher(), "127.0.0.1", 0, tls=policy, task_status=task_status
                )
            )
            addr = f"127.0.0.1:{h.port}"
            # plain remoting: the server closes the connection
            async with open_remoting_client() as plain:
                with pytest.raises(RemotingError, match="closed"):
                    await plain.invoke(addr, RemotingCommand.request(1000, body=b"x"), 5)
            # clients that never finish, garbage, and one that hangs up mid-handshake
            idle = [await trio.open_tcp_stream("127.0.0.1", h.port) for _ in range(5)]
            junk = await trio.open_tcp_stream("127.0.0.1", h.port)
            await junk.send_all(b"\x16\x03\x01\xff\xff" + b"\xee" * 100)
            quitter = await trio.open_tcp_stream("127.0.0.1", h.port)
            await quitter.send_all(b"\x16\x03\x01")
            await quitter.aclose()
            # ... while a TLS client is served at once
            async with open_remoting_client(network=tls_net) as secure:
                for i in range(3):
                    r = await secure.invoke(addr, RemotingCommand.request(1000, body=b"%d" % i))
                    assert r.body == b"%d" % i
            # the idle ones are closed after the handshake timeout (2 s)
            for s in idle:
                with trio.fail_after(5):
                    while await s.receive_some():
                        pass
            for s in (*idle, junk):
                await s.aclose()
            nursery.cancel_scope.cancel()


async def test_tcp_permissive_serves_tls_and_plain_on_one_port(certs: LocalTls) -> None:
    policy = server_policy(server_cfg(certs, TlsMode.PERMISSIVE))
    tls_net = TlsNetwork(TCP, client_ctx(certs))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            h = await nursery.start(
                lambda task_status: serve_remoting(
                    _echo_dispatcher(), "127.0.0.1", 0, tls=policy, task_status=task_status
                )
            )
            addr = f"127.0.0.1:{h.port}"
            async with (
                open_remoting_client() as plain,
                open_remoting_client(network=tls_net) as secure,
            ):
                big = bytes(range(256)) * 4096  # 1 MiB each way, over many TLS records
                for client in (plain, secure, plain):
                    r = await client.invoke(addr, RemotingCommand.request(1000, body=big), 10)
                    assert r.body == big
                streams = sorted(type(c._stream).__name__ for c in h.load.channels)
                # the plain connection keeps its bare socket stream (MSG_PEEK, no wrapper)
                assert streams == ["SSLStream", "SocketStream"]
            nursery.cancel_scope.cancel()


async def test_enforcing_cluster_in_memory_serves_tls_clients_only(
    certs: LocalTls, tmp_path: Path, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """A nameserver and a broker both enforcing: the broker registers over TLS (tls.enable),
    rmq clients on a TlsNetwork produce and pull, a plain client is refused."""
    import functools

    from broker.config import BrokerConfig
    from broker.service import run_broker
    from broker.store import MessageStoreConfig, run_memory_store
    from namesrv.config import NamesrvConfig
    from namesrv.service import run_namesrv
    from rmq import Admin, Message, Producer, PullConsumer
    from rmq.pull_consumer import PullStatus

    net = MemoryNetwork()
    enforcing = server_cfg(certs, TlsMode.ENFORCING)
    ns = await nursery.start(
        functools.partial(
            run_namesrv,
            NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kv.json"), tls=enforcing),
            network=net,
        )
    )
    namesrv = f"127.0.0.1:{ns.port}"
    broker_cfg = BrokerConfig(
        listen_port=0,
        namesrv_addr=namesrv,
        store=MessageStoreConfig(store_path_root_dir=str(tmp_path / "b")),
        tls=enforcing,
        tls_client=TlsClientConfig(enable=True, trust_cert_path=str(certs.ca_cert)),
    )
    broker = await nursery.start(
        functools.partial(
            run_broker, broker_cfg, store_factory=run_memory_store, network=net, io_threads=False
        )
    )
    tls_net = TlsNetwork(net, client_ctx(certs))
    async with Admin(namesrv, network=tls_net) as admin:
        await admin.create_topic("Secure", broker_addr=f"127.0.0.1:{broker.port}", queues=1)
    async with Producer("pg", namesrv, network=tls_net) as producer:
        for i in range(5):
            await producer.send(Message("Secure", b"m%d" % i))
    got: list[bytes] = []
    async with PullConsumer("cg", namesrv, network=tls_net) as consumer:
        [mq] = await consumer.fetch_queues("Secure")
        result = await consumer.pull(mq, 0, max_nums=32)
        assert result.status is PullStatus.FOUND
        got = [m.body for m in result.messages]
    assert got == [b"m%d" % i for i in range(5)]
    async with Admin(namesrv, network=net, timeout=2) as plain:
        with pytest.raises(RemotingError, match="closed"):
            await plain.cluster_info()
    nursery.cancel_scope.cancel()


async def test_connections_in_their_handshake_count_against_max_connections(
    certs: LocalTls, autojump_clock: trio.testing.MockClock
) -> None:
    from common.remoting.server_limits import ServerLimits

    net = MemoryNetwork()
    policy = TlsPolicy(
        TlsMode.PERMISSIVE, server_policy(server_cfg(certs, TlsMode.PERMISSIVE)).context, 5.0
    )
    async with trio.open_nursery() as nursery:
        h = await nursery.start(
            lambda task_status: serve_remoting(
                _echo_dispatcher(),
                "127.0.0.1",
                0,
                network=net,
                tls=policy,
                limits=ServerLimits(max_connections=3),
                task_status=task_status,
            )
        )
        addr = f"127.0.0.1:{h.port}"
        silent = [await net.connect(addr) for _ in range(3)]
        await trio.sleep(0.1)
        assert h.load.handshaking == 3
        async with open_remoting_client(network=net) as plain:
            # closed at once: the request fails to send or finds the connection closed
            with pytest.raises(RemotingError, match="closed"):
                await plain.invoke(addr, RemotingCommand.request(1000, body=b"x"), 2)
            assert h.load.refused_connections == 1
            await trio.sleep(5)  # the silent ones reach the handshake timeout
            assert h.load.handshaking == 0
            r = await plain.invoke(addr, RemotingCommand.request(1000, body=b"y"), 2)
            assert r.body == b"y"
        for s in silent:
            await s.aclose()
        nursery.cancel_scope.cancel()


async def test_need_client_auth_require(
    certs: LocalTls, autojump_clock: trio.testing.MockClock
) -> None:
    """tls.server.need.client.auth=require: a client without a certificate from the trusted CA
    is closed; one with it (here the server's own, made for both uses) is served."""
    cfg = TlsServerConfig(
        mode=TlsMode.ENFORCING,
        cert_path=str(certs.server_cert),
        key_path=str(certs.server_key),
        need_client_auth=ClientAuth.REQUIRE,
        trust_cert_path=str(certs.ca_cert),
    )
    policy = server_policy(cfg)
    with_cert = TlsClientConfig(
        enable=True,
        trust_cert_path=str(certs.ca_cert),
        cert_path=str(certs.server_cert),
        key_path=str(certs.server_key),
    )
    for client_cfg, served in (
        (with_cert, True),
        (TlsClientConfig(enable=True, trust_cert_path=str(certs.ca_cert)), False),
    ):
        client_end, server_end = trio.testing.memory_stream_pair()
        got: list[trio.abc.Stream | None] = []
        async with trio.open_nursery() as nursery:

            async def server(
                server_end: trio.abc.Stream, got: list[trio.abc.Stream | None]
            ) -> None:
                s = await accept_stream(server_end, policy)
                got.append(s)
                if s is not None:
                    await s.send_all(b"hi")

            nursery.start_soon(server, server_end, got)
            tls = trio.SSLStream(
                client_end, client_ssl_context(client_cfg), server_hostname="127.0.0.1"
            )
            try:
                await tls.do_handshake()
                reply = await tls.receive_some()
            except trio.BrokenResourceError:
                reply = b""
        assert (got[0] is not None, reply) == (served, b"hi" if served else b"")
