"""TLS on the remoting port and the gRPC endpoint, configured as RocketMQ configures it.

Configuration. RocketMQ reads ``tls.server.mode`` (``disabled`` / ``permissive`` /
``enforcing``, default ``permissive``) and ``tls.enable`` from JVM system properties, and the
rest (``tls.server.certPath``, ``tls.server.keyPath``, ``tls.server.need.client.auth``,
``tls.client.*`` ...) from ``tls.config.file`` (``remoting/.../netty/TlsSystemConfig.java`` in
apache/rocketmq).  Our nodes have no JVM: every one of those keys may be written in the node's
own config file (broker.conf, the nameserver's properties), and ``tls.config.file`` names a
RocketMQ tls.properties whose keys are read too (the node's own file wins).  RocketMQ's default
path ``/etc/rocketmq/tls.properties`` is not read unless named.

Modes (``TlsMode``), as RocketMQ's ``NettyRemotingServer.TlsModeHandler``:

* ``disabled``: plain only; a ClientHello is just bytes the protocol rejects;
* ``permissive``: the first byte of a connection decides: 0x16 (a TLS handshake record) means
  TLS, anything else plain.  A remoting frame starts with its 4-byte length, whose first byte is
  0 for any frame under 16 MiB, and an HTTP/2 preface starts with ``P``, so nothing plain is
  taken for TLS;
* ``enforcing``: TLS only; a plain client's bytes fail the handshake and it is closed.

RocketMQ's default is ``permissive`` and, with no certificate configured, its "test mode"
(``tls.test.mode.enable``, on by default) makes up a self-signed one.  We keep ``permissive`` as
the default but, with no certificate and key configured, a permissive node serves plain only
(:func:`server_policy` turns it into ``disabled``): a self-signed certificate nobody can verify
buys nothing.  ``enforcing`` without a certificate is a configuration error.

The accept seam. Every listener (the remoting server, the gRPC endpoint) hands each accepted
stream to :func:`accept_stream` with its :class:`TlsPolicy` and speaks on what it returns: the
stream itself, a :class:`trio.SSLStream` over it after a finished handshake, or ``None`` when
the connection was refused and is already closed.  The decision and the handshake together run
under one ``handshake_timeout`` (Netty's SslHandler default, 10 s), inside the connection's own
task, so a client that never finishes its handshake (or never sends a byte) costs one task for
at most that long and the listener keeps accepting.  Every failure closes only that connection.

Peeking the first byte: on a TCP socket with ``MSG_PEEK``, so the bytes stay in the kernel and
a plain connection keeps its bare :class:`trio.SocketStream` (the remoting channel writes those
with ``os.writev``); on any other stream (the in-memory network of tests) by reading a chunk
and replaying it through :class:`ReplayStream`.

Clients: :func:`client_ssl_context` and :class:`TlsNetwork`, a :class:`Network` whose
connections do a TLS handshake before they are handed out, so every client that takes a
``network`` (the remoting client, the ``rmq`` SDK) speaks TLS by being given one.
"""

from __future__ import annotations

import enum
import logging
import socket
import ssl
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
import trio

from common.remoting.network import Bound, Network, parse_addr

__all__ = [
    "PLAIN",
    "ClientAuth",
    "ReplayStream",
    "TlsClientConfig",
    "TlsConfigError",
    "TlsMode",
    "TlsNetwork",
    "TlsPolicy",
    "TlsServerConfig",
    "accept_stream",
    "client_network",
    "client_ssl_context",
    "open_tls_stream",
    "server_policy",
    "server_ssl_context",
    "tls_properties",
]

log = logging.getLogger(__name__)

# the content type of a TLS handshake record: the first byte of every ClientHello
TLS_HANDSHAKE_RECORD = 0x16
# Netty's SslHandler handshake timeout
DEFAULT_HANDSHAKE_TIMEOUT = 10.0


class TlsConfigError(ValueError):
    """A TLS setting that cannot work (unknown mode, enforcing without a certificate ...)."""


class TlsMode(enum.Enum):
    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"

    @classmethod
    def parse(cls, text: str) -> TlsMode:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise TlsConfigError(
                f"tls.server.mode: expected disabled, permissive or enforcing, got {text!r}"
            ) from None


class ClientAuth(enum.Enum):
    """``tls.server.need.client.auth``: whether the server asks clients for a certificate."""

    NONE = "none"
    OPTIONAL = "optional"
    REQUIRE = "require"

    @classmethod
    def parse(cls, text: str) -> ClientAuth:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise TlsConfigError(
                f"tls.server.need.client.auth: expected none, optional or require, got {text!r}"
            ) from None


def _bool(text: str) -> bool:
    # Java's Boolean.parseBoolean
    return text.strip().lower() == "true"


def _path(text: str) -> str | None:
    return text.strip() or None


@attrs.frozen
class TlsServerConfig:
    """The server half of RocketMQ's TLS settings (module docstring)."""

    mode: TlsMode = TlsMode.PERMISSIVE
    cert_path: str | None = None
    key_path: str | None = None
    key_password: str | None = None
    need_client_auth: ClientAuth = ClientAuth.NONE
    # the CAs client certificates must chain to (when client auth is asked for)
    trust_cert_path: str | None = None
    # seconds from accept to a finished handshake (or to the first byte of a plain client)
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> TlsServerConfig:
        """From RocketMQ's keys in ``props`` (other keys ignored); see :func:`tls_properties`."""
        cfg = cls()
        if "tls.server.mode" in props:
            cfg = attrs.evolve(cfg, mode=TlsMode.parse(props["tls.server.mode"]))
        if "tls.server.certPath" in props:
            cfg = attrs.evolve(cfg, cert_path=_path(props["tls.server.certPath"]))
        if "tls.server.keyPath" in props:
            cfg = attrs.evolve(cfg, key_path=_path(props["tls.server.keyPath"]))
        if "tls.server.keyPassword" in props:
            cfg = attrs.evolve(cfg, key_password=props["tls.server.keyPassword"] or None)
        if "tls.server.need.client.auth" in props:
            auth = ClientAuth.parse(props["tls.server.need.client.auth"])
            cfg = attrs.evolve(cfg, need_client_auth=auth)
        if "tls.server.trustCertPath" in props:
            cfg = attrs.evolve(cfg, trust_cert_path=_path(props["tls.server.trustCertPath"]))
        if "tls.server.handshakeTimeoutMillis" in props:  # ours
            raw = props["tls.server.handshakeTimeoutMillis"].strip()
            try:
                ms = int(raw)
            except ValueError:
                raise TlsConfigError(f"tls.server.handshakeTimeoutMillis: {raw!r}") from None
            if ms <= 0:
                raise TlsConfigError("tls.server.handshakeTimeoutMillis must be positive")
            cfg = attrs.evolve(cfg, handshake_timeout=ms / 1000.0)
        return cfg

    @property
    def has_certificate(self) -> bool:
        return bool(self.cert_path and self.key_path)


@attrs.frozen
class TlsClientConfig:
    """The client half: whether to speak TLS and how to check the server.

    RocketMQ's client trusts any server unless ``tls.client.authServer=true``; ours checks the
    server's certificate (and that it names the host dialled) against ``trust_cert_path``, or
    the system's CAs when none is given, unless ``auth_server`` is turned off explicitly.
    """

    enable: bool = False
    trust_cert_path: str | None = None
    auth_server: bool = True
    # a client certificate, for servers with tls.server.need.client.auth
    cert_path: str | None = None
    key_path: str | None = None
    key_password: str | None = None

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> TlsClientConfig:
        cfg = cls()
        if "tls.enable" in props:
            cfg = attrs.evolve(cfg, enable=_bool(props["tls.enable"]))
        if "tls.client.trustCertPath" in props:
            cfg = attrs.evolve(cfg, trust_cert_path=_path(props["tls.client.trustCertPath"]))
        if "tls.client.authServer" in props:
            cfg = attrs.evolve(cfg, auth_server=_bool(props["tls.client.authServer"]))
        if "tls.client.certPath" in props:
            cfg = attrs.evolve(cfg, cert_path=_path(props["tls.client.certPath"]))
        if "tls.client.keyPath" in props:
            cfg = attrs.evolve(cfg, key_path=_path(props["tls.client.keyPath"]))
        if "tls.client.keyPassword" in props:
            cfg = attrs.evolve(cfg, key_password=props["tls.client.keyPassword"] or None)
        return cfg


def tls_properties(
    props: Mapping[str, str], parse_properties: Callable[[str], Mapping[str, str]]
) -> dict[str, str]:
    """The ``tls.*`` keys of a node's config, merged over the file ``tls.config.file`` names
    (a RocketMQ tls.properties, read with the node's own ``parse_properties``; the node's own
    keys win). Raises TlsConfigError when the named file cannot be read."""
    own = {k: v for k, v in props.items() if k.startswith("tls.")}
    path = own.get("tls.config.file", "").strip()
    if not path:
        return own
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TlsConfigError(f"tls.config.file {path}: {exc}") from exc
    merged = {k: v for k, v in parse_properties(text).items() if k.startswith("tls.")}
    merged.update(own)
    return merged


# --- contexts ----------------------------------------------------------------------------------


def server_ssl_context(cfg: TlsServerConfig, *, alpn: Sequence[str] = ()) -> ssl.SSLContext:
    """A server context with ``cfg``'s certificate; ``alpn`` the protocols offered (the gRPC
    endpoint needs ``("h2",)``). Raises TlsConfigError when a file is missing or unusable."""
    if not cfg.has_certificate:
        raise TlsConfigError("TLS needs tls.server.certPath and tls.server.keyPath")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cfg.cert_path or "", cfg.key_path, password=cfg.key_password)
        if cfg.need_client_auth is not ClientAuth.NONE:
            if cfg.trust_cert_path:
                ctx.load_verify_locations(cafile=cfg.trust_cert_path)
            else:
                ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
            ctx.verify_mode = (
                ssl.CERT_REQUIRED
                if cfg.need_client_auth is ClientAuth.REQUIRE
                else ssl.CERT_OPTIONAL
            )
    except (OSError, ssl.SSLError) as exc:
        files = ", ".join(f for f in (cfg.cert_path, cfg.key_path, cfg.trust_cert_path) if f)
        raise TlsConfigError(f"TLS server files ({files}): {exc}") from exc
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


def client_ssl_context(cfg: TlsClientConfig, *, alpn: Sequence[str] = ()) -> ssl.SSLContext:
    """A client context checking the server as ``cfg`` says (see :class:`TlsClientConfig`)."""
    try:
        if cfg.trust_cert_path:
            ctx = ssl.create_default_context(cafile=cfg.trust_cert_path)
        else:
            ctx = ssl.create_default_context()
        if not cfg.auth_server:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cfg.cert_path:
            ctx.load_cert_chain(cfg.cert_path, cfg.key_path, password=cfg.key_password)
    except (OSError, ssl.SSLError) as exc:
        files = ", ".join(f for f in (cfg.trust_cert_path, cfg.cert_path, cfg.key_path) if f)
        raise TlsConfigError(f"TLS client files ({files or 'system CAs'}): {exc}") from exc
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


# --- the accept seam ---------------------------------------------------------------------------


@attrs.frozen
class TlsPolicy:
    """What a listener does with each accepted connection (module docstring)."""

    mode: TlsMode = TlsMode.DISABLED
    # None exactly when mode is DISABLED
    context: ssl.SSLContext | None = attrs.field(default=None, eq=False)
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT

    def __attrs_post_init__(self) -> None:
        if (self.context is None) != (self.mode is TlsMode.DISABLED):
            raise TlsConfigError(f"TLS mode {self.mode.value} with context {self.context!r}")

    @property
    def enabled(self) -> bool:
        return self.mode is not TlsMode.DISABLED


PLAIN = TlsPolicy()
"""No TLS: every connection is served as accepted."""


def server_policy(cfg: TlsServerConfig, *, alpn: Sequence[str] = ()) -> TlsPolicy:
    """The policy of ``cfg`` (a permissive config without a certificate serves plain only;
    an enforcing one without a certificate raises TlsConfigError)."""
    if cfg.mode is TlsMode.DISABLED:
        return PLAIN
    if not cfg.has_certificate:
        if cfg.mode is TlsMode.ENFORCING:
            raise TlsConfigError(
                "tls.server.mode=enforcing needs tls.server.certPath and tls.server.keyPath"
            )
        return PLAIN
    ctx = server_ssl_context(cfg, alpn=alpn)
    return TlsPolicy(cfg.mode, ctx, cfg.handshake_timeout)


class ReplayStream(trio.abc.Stream):
    """A stream whose first reads return bytes already read from ``inner`` (the peeked ones)."""

    def __init__(self, inner: trio.abc.Stream, prefix: bytes) -> None:
        self.inner = inner
        # bytes read from inner that the reader has not been given yet
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            if max_bytes is None or max_bytes >= len(self._prefix):
                data, self._prefix = self._prefix, b""
            else:
                data, self._prefix = self._prefix[:max_bytes], self._prefix[max_bytes:]
            await trio.lowlevel.checkpoint()
            return data
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _first_byte(stream: trio.abc.Stream) -> tuple[int | None, trio.abc.Stream]:
    """The connection's first byte (None at EOF) and the stream to go on with, which still
    yields that byte."""
    if isinstance(stream, trio.SocketStream):
        data = await stream.socket.recv(1, socket.MSG_PEEK)
        return (data[0] if data else None), stream
    data = bytes(await stream.receive_some())
    return (data[0] if data else None), ReplayStream(stream, data)


async def _handshake(
    stream: trio.abc.Stream, ctx: ssl.SSLContext
) -> trio.SSLStream[trio.abc.Stream]:
    # https_compatible: a peer that hangs up without close_notify ends the stream as EOF, and
    # our own aclose does not wait for the peer's close_notify
    tls = trio.SSLStream(stream, ctx, server_side=True, https_compatible=True)
    await tls.do_handshake()
    return tls


async def accept_stream(
    stream: trio.abc.Stream, policy: TlsPolicy, *, peer: str = "?"
) -> trio.abc.Stream | None:
    """The stream to serve an accepted connection on, or None if it was refused (and closed).

    Never raises except Cancelled; see the module docstring for what each mode does.
    """
    if policy.context is None:
        return stream
    ctx = policy.context
    failure: str
    with trio.move_on_after(policy.handshake_timeout) as scope:
        try:
            if policy.mode is TlsMode.ENFORCING:
                return await _handshake(stream, ctx)
            first, replay = await _first_byte(stream)
            if first is None:
                failure = "closed before sending anything"
            elif first == TLS_HANDSHAKE_RECORD:
                return await _handshake(replay, ctx)
            else:
                return replay
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            cause = exc.__cause__ or exc
            failure = f"TLS handshake failed: {cause}"
    if scope.cancelled_caught:
        failure = f"no TLS handshake within {policy.handshake_timeout:g} s"
    log.info("closing the connection from %s: %s", peer, failure)
    with trio.CancelScope(shield=True):
        await trio.aclose_forcefully(stream)
    return None


# --- the client side ---------------------------------------------------------------------------


async def open_tls_stream(
    stream: trio.abc.Stream, ctx: ssl.SSLContext, server_hostname: str | None
) -> trio.SSLStream[trio.abc.Stream]:
    """``stream`` after a finished client handshake; trio.BrokenResourceError if it failed
    (the caller bounds the time)."""
    tls = trio.SSLStream(stream, ctx, server_hostname=server_hostname, https_compatible=True)
    try:
        await tls.do_handshake()
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(stream)
        raise
    return tls


@attrs.frozen
class TlsNetwork:
    """``inner`` with a TLS handshake on every connection it makes (listening is unchanged:
    servers decide per connection with :func:`accept_stream`)."""

    inner: Network
    context: ssl.SSLContext = attrs.field(eq=False)

    async def listen(self, host: str, port: int) -> Bound:
        return await self.inner.listen(host, port)

    async def connect(self, addr: str) -> trio.abc.Stream:
        stream = await self.inner.connect(addr)
        host, _ = parse_addr(addr)
        try:
            return await open_tls_stream(stream, self.context, host or None)
        except trio.BrokenResourceError as exc:
            # an OSError is what a Network's connect raises for a peer that cannot be reached
            raise ConnectionError(
                f"TLS handshake with {addr} failed: {exc.__cause__ or exc}"
            ) from exc

    def peer_addr(self, stream: trio.abc.Stream) -> str:
        if isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        return self.inner.peer_addr(stream)


def client_network(cfg: TlsClientConfig, inner: Network) -> Network:
    """``inner`` itself when ``cfg`` does not enable TLS, else a :class:`TlsNetwork` over it."""
    if not cfg.enable:
        return inner
    return TlsNetwork(inner, client_ssl_context(cfg))
