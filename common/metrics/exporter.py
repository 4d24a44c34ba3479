"""The metrics port: Prometheus text over HTTP/1.1, one Trio task per connection (h11).

Theory of operation
-------------------
:class:`MetricsExchange` is the sans-I/O core: one connection's bytes in, one answer's bytes
out.  It feeds h11 until a request head is complete, then answers ``GET``/``HEAD /metrics``
with the registry's exposition (``prometheus_client.generate_latest``), anything else with 404
or 405, and a request h11 cannot parse (garbage, a head past ``max_header_bytes``) with 400.
Every answer says ``Connection: close`` and the connection ends after it: Prometheus opens one
per scrape, and a connection that serves one request holds nothing between requests.

:func:`run_metrics_server` binds the port and serves each connection in a task of the node's
nursery.  What a client of this port can make the node hold is bounded whatever it sends:

* connections: past ``max_connections`` a new one is closed at once (counted in
  ``refused_connections``);
* bytes: h11 holds at most ``max_header_bytes`` of an incomplete head (then 400), and a body
  is never read;
* time: the whole exchange (request read, answer written) must finish within
  ``exchange_timeout`` (a Trio cancel scope), so a client that sends half a request, or never
  reads the answer, lets go of its slot.

The exposition is rendered at most once per ``render_interval``: scrapes arriving together
(several Prometheus servers, a flood of requests) share one rendering, so the scrape-time
collectors (broker/broker_metrics.py) run at most that often whatever the request rate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, exposition, generate_latest

log = logging.getLogger(__name__)

PATH = "/metrics"
# the text format every Prometheus reads (2.x as Debian ships it); generate_latest writes it
CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", CONTENT_TYPE_LATEST)


@attrs.frozen
class ExporterLimits:
    max_connections: int = 64
    max_header_bytes: int = 8192
    exchange_timeout: float = 10.0
    render_interval: float = 0.2


def _answer(
    conn: h11.Connection, status: int, body: bytes, content_type: str, *, head: bool = False
) -> bytes:
    headers = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
    ]
    out = conn.send(h11.Response(status_code=status, headers=headers)) or b""
    if not head:
        out += conn.send(h11.Data(data=body)) or b""
    out += conn.send(h11.EndOfMessage()) or b""
    return out


def _plain(conn: h11.Connection, status: int, text: str, *, head: bool = False) -> bytes:
    return _answer(conn, status, text.encode(), "text/plain; charset=utf-8", head=head)


class MetricsExchange:
    """One connection's request and answer (sans-I/O: bytes in, bytes out)."""

    def __init__(self, render: Callable[[], bytes], max_header_bytes: int = 8192) -> None:
        self._render = render
        self._conn = h11.Connection(h11.SERVER, max_incomplete_event_size=max_header_bytes)

    def receive(self, data: bytes) -> bytes | None:
        """Feed bytes read (``b""``: the client closed its side).  The answer to write once
        the request head is complete or known bad; ``b""`` for a client that left without a
        request; ``None`` while more bytes are needed."""
        conn = self._conn
        try:
            conn.receive_data(data)
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            return self._bad_request(exc)
        if event is h11.NEED_DATA:
            return None
        if isinstance(event, h11.Request):
            return self._respond(event)
        # ConnectionClosed (EOF before any request) or PAUSED: nothing to answer
        return b""

    def _bad_request(self, exc: h11.RemoteProtocolError) -> bytes:
        # h11 refuses to send a response once it saw garbage; a fresh connection object
        # in the right state writes the 400 (its status hint: 400, or 431 for a huge head)
        conn = h11.Connection(h11.SERVER)
        conn.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        conn.next_event()
        return _plain(conn, exc.error_status_hint, "bad request\n")

    def _respond(self, req: h11.Request) -> bytes:
        conn = self._conn
        method = req.method.decode("ascii", "replace")
        path = req.target.decode("ascii", "replace").split("?", 1)[0]
        head = method == "HEAD"
        if method not in ("GET", "HEAD"):
            return _plain(conn, 405, "only GET and HEAD\n")
        if path != PATH:
            return _plain(conn, 404, f"metrics are at {PATH}\n", head=head)
        return _answer(conn, 200, self._render(), CONTENT_TYPE, head=head)


@attrs.define(eq=False)
class MetricsServerHandle:
    host: str
    port: int
    connections: int = 0
    refused_connections: int = 0
    # answers written (tests: a request was served)
    served: int = 0

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{PATH}"


@attrs.define(eq=False)
class _Renderer:
    registry: CollectorRegistry
    interval: float
    _body: bytes = b""
    _at: float = float("-inf")

    def __call__(self) -> bytes:
        now = trio.current_time()
        if now - self._at >= self.interval:
            self._body = generate_latest(self.registry)
            self._at = now
        return self._body


async def run_metrics_server(
    registry: CollectorRegistry,
    host: str,
    port: int,
    *,
    limits: ExporterLimits | None = None,
    task_status: trio.TaskStatus[MetricsServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``registry`` on ``host:port`` (0: any free port) until cancelled."""
    limits = limits or ExporterLimits()
    listeners = await trio.open_tcp_listeners(port, host=host or None)
    bound = listeners[0].socket.getsockname()[1]
    handle = MetricsServerHandle(host or "0.0.0.0", bound)
    render = _Renderer(registry, limits.render_interval)

    async def serve(stream: trio.SocketStream) -> None:
        if handle.connections >= limits.max_connections:
            handle.refused_connections += 1
            if handle.refused_connections % 1000 == 1:
                log.warning(
                    "metrics port %d: %d connections is the limit (%d refused)",
                    bound,
                    limits.max_connections,
                    handle.refused_connections,
                )
            await trio.aclose_forcefully(stream)
            return
        handle.connections += 1
        try:
            with trio.move_on_after(limits.exchange_timeout):
                exchange = MetricsExchange(render, limits.max_header_bytes)
                answer = None
                while answer is None:
                    answer = exchange.receive(await stream.receive_some(16384))
                if answer:
                    await stream.send_all(answer)
                    handle.served += 1
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            handle.connections -= 1
            await trio.aclose_forcefully(stream)

    log.info("metrics on %s", handle.url)
    task_status.started(handle)
    await trio.serve_listeners(serve, listeners)
