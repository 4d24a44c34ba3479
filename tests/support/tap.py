"""Fault injection for client tests that run against the real in-process servers.

There is no fake server here: client tests use the real nameserver and broker (the
``memory_cluster``, ``tcp_cluster`` and ``portal_cluster`` fixtures of ``tests/conftest.py``).
This module makes that path misbehave on purpose, and shows what crossed it.

Theory of operation: :class:`Tap` is a :class:`common.remoting.network.Network` to hand to one
client (``Producer(..., network=tap)``).  Each connection that client opens goes through a small
proxy: two tasks in the tap's nursery copy frames between the client and the real server, each
direction decoded frame by frame, so the tap can

* record every request with the address it went to (``sent``, oneway ones included);
* answer chosen request codes to a chosen address with a chosen response code instead of the
  server (:meth:`Tap.fail`: a broker answering SERVICE_NOT_AVAILABLE, MESSAGE_ILLEGAL, ...);
* swallow them, both ways, so the client meets its own timeout (:meth:`Tap.hang`: a stalled
  broker, a lost NOTIFY_CONSUMER_IDS_CHANGED);
* edit the server's answers to them (:meth:`Tap.rewrite`: e.g. a master suggesting its slave);
* refuse this client's connects to an address (``refused``), or cut its host off (:meth:`cut`).

Frames toward the client are written whole, under one lock, so an injected answer never lands
inside a server frame.  Faults of the whole network (every client) are the network's business:
``MemoryNetwork.refused`` and ``MemoryNetwork.cut``.

:meth:`Tap.deliver` sends the client a server->client request and returns its answer: our
broker never sends GET_CONSUMER_RUNNING_INFO or CONSUME_MESSAGE_DIRECTLY on its own (it forwards
no admin call to clients), yet the client must answer them as Java's does.
"""

from __future__ import annotations

import errno
import itertools
from collections.abc import Awaitable, Callable, Collection

import attrs
import trio
import trio.testing

from common.remoting.codec import FrameDecoder, encode
from common.remoting.codes import RequestCode
from common.remoting.command import RemotingCommand
from common.remoting.network import Bound, Network

__all__ = ["SENDS", "Tap"]

SENDS = frozenset({RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE})


@attrs.define(eq=False)
class _Rule:
    addr: str
    codes: Collection[int] | None  # request codes it applies to; None: every code
    answers: list[int] | None  # response codes, one per matching request; None: no answer
    forever: bool  # an answer rule that is never used up


@attrs.define(eq=False)
class _Link:
    """One proxied connection: ``client`` is our end of the client's stream."""

    addr: str
    client: trio.abc.Stream
    server: trio.abc.Stream
    lock: trio.Lock = attrs.Factory(trio.Lock)
    # opaque of a forwarded request -> its code (to find the answers `rewrite` edits)
    codes: dict[int, int] = attrs.Factory(dict)
    # opaque of a `deliver`ed request -> where its answer goes
    waiting: dict[int, trio.MemorySendChannel[RemotingCommand]] = attrs.Factory(dict)

    async def to_client(self, cmd: RemotingCommand) -> None:
        async with self.lock:
            await self.client.send_all(encode(cmd))


@attrs.define(eq=False)
class Tap:
    network: Network
    nursery: trio.Nursery
    # every request the client sent, with the address it was sent to
    sent: list[tuple[str, RemotingCommand]] = attrs.Factory(list)
    # addresses this client cannot connect to now (a broker down for it alone)
    refused: set[str] = attrs.Factory(set)
    vanished: bool = False  # set by `cut`
    _rules: list[_Rule] = attrs.Factory(list)
    _rewrites: list[tuple[str, int, Callable[[RemotingCommand], None]]] = attrs.Factory(list)
    _links: list[_Link] = attrs.Factory(list)
    # opaques of injected requests: far above the client's own counter, never reused
    _opaques: itertools.count[int] = attrs.Factory(lambda: itertools.count(1 << 30))

    # --- the rules -------------------------------------------------------------------------

    def fail(
        self, addr: str, *answers: int, requests: Collection[int] = SENDS, forever: bool = False
    ) -> None:
        """Answer the next requests of codes ``requests`` to ``addr`` with ``answers`` (one
        response code each, in order); ``forever``: answer every one with ``answers[0]``."""
        self._rules.append(_Rule(addr, requests, list(answers), forever))

    def hang(self, addr: str, requests: Collection[int] | None = None) -> None:
        """Never pass on requests to or from ``addr`` (of codes ``requests``, default all)."""
        self._rules.append(_Rule(addr, requests, None, True))

    def rewrite(self, addr: str, request: int, edit: Callable[[RemotingCommand], None]) -> None:
        """Call ``edit(response)`` on every answer from ``addr`` to a request of code
        ``request`` before the client sees it."""
        self._rewrites.append((addr, request, edit))

    def requests(self, code: int | Collection[int], addr: str | None = None) -> list:
        """The requests of ``code`` (or codes) sent (to ``addr``), in order."""
        codes = {code} if isinstance(code, int) else set(code)
        return [c for a, c in self.sent if c.code in codes and addr in (None, a)]

    def _rule_for(self, addr: str, cmd: RemotingCommand) -> _Rule | None:
        for rule in self._rules:
            if rule.addr == addr and (rule.codes is None or cmd.code in rule.codes):
                return rule
        return None

    # --- the Network -----------------------------------------------------------------------

    async def listen(self, host: str, port: int) -> Bound:
        return await self.network.listen(host, port)

    def peer_addr(self, stream: trio.abc.Stream) -> str:
        return self.network.peer_addr(stream)

    async def connect(self, addr: str) -> trio.abc.Stream:
        if self.vanished or addr in self.refused:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"connection refused: {addr}")
        server = await self.network.connect(addr)
        theirs, ours = trio.testing.memory_stream_pair()
        link = _Link(addr, ours, server)
        self._links.append(link)
        self.nursery.start_soon(self._pump, link, link.client, self._from_client)
        self.nursery.start_soon(self._pump, link, link.server, self._from_server)
        return theirs

    async def _pump(
        self,
        link: _Link,
        source: trio.abc.Stream,
        handle: Callable[[_Link, RemotingCommand], Awaitable[None]],
    ) -> None:
        """Decode the frames ``source`` sends and ``handle`` each; either end closing closes
        the link."""
        decoder = FrameDecoder()
        try:
            while data := await source.receive_some():
                for cmd in decoder.feed(data):
                    await handle(link, cmd)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await self._close(link)

    async def _from_client(self, link: _Link, cmd: RemotingCommand) -> None:
        if cmd.is_response:
            answer = link.waiting.pop(cmd.opaque, None)
            if answer is not None:
                return answer.send_nowait(cmd)  # the answer to a `deliver`
        else:
            self.sent.append((link.addr, cmd))
            rule = self._rule_for(link.addr, cmd)
            if rule is not None:
                if rule.answers is None:
                    return  # swallowed: the client times out
                code = rule.answers[0] if rule.forever else rule.answers.pop(0)
                if not rule.answers:
                    self._rules.remove(rule)
                if not cmd.is_oneway:
                    await link.to_client(cmd.response(code, f"injected: answer {code}"))
                return
            link.codes[cmd.opaque] = cmd.code
        await link.server.send_all(encode(cmd))

    async def _from_server(self, link: _Link, cmd: RemotingCommand) -> None:
        if cmd.is_response:
            code = link.codes.pop(cmd.opaque, None)
            for addr, request, edit in self._rewrites:
                if addr == link.addr and request == code:
                    edit(cmd)
        elif (rule := self._rule_for(link.addr, cmd)) and rule.answers is None:
            return  # a hung code is dropped toward the client too (a lost notify)
        await link.to_client(cmd)

    async def _close(self, link: _Link) -> None:
        if link in self._links:
            self._links.remove(link)
        for stream in (link.client, link.server):
            await trio.aclose_forcefully(stream)

    async def cut(self) -> None:
        """The client's host vanishes: every connection it made through this tap closes (the
        servers see the channels close) and it cannot connect again."""
        self.vanished = True
        for link in list(self._links):
            await self._close(link)

    # --- server->client requests -----------------------------------------------------------

    async def deliver(self, addr: str, cmd: RemotingCommand) -> RemotingCommand:
        """Send ``cmd`` to the client over its connection to ``addr``; its answer."""
        link = next(link for link in self._links if link.addr == addr)
        cmd.opaque = next(self._opaques)
        send, recv = trio.open_memory_channel[RemotingCommand](1)
        link.waiting[cmd.opaque] = send
        await link.to_client(cmd)
        return await recv.receive()
