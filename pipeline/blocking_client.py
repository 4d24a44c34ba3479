"""A small blocking remoting client, for the Spark source's plain threads.

Spark calls the reader from plain threads of the driver and of Python workers, with no event
loop to run ``rmq`` on, so the live source speaks the remoting protocol over blocking sockets:
one request, one response per connection at a time, with the sans-I/O codec of
``common.remoting.codec``.  One connection per address is cached and dropped on any transport
error (the stream is out of sync then); a request that fails to connect on a cached connection
is tried once more on a fresh one, which is safe because every request the source sends
(route and offset queries, pulls, offset commits) can be repeated.
"""

from __future__ import annotations

import itertools
import socket
import struct

from common.errors import RemotingConnectError, RemotingTimeoutError, error_for_response
from common.remoting.codec import decode_frame, encode
from common.remoting.codes import ResponseCode
from common.remoting.command import RemotingCommand

_LEN = struct.Struct(">i")


class BlockingClient:
    """Request/response over blocking sockets, one cached connection per address."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        # addr -> connected socket; dropped on any transport error (the stream is out of sync)
        self._socks: dict[str, socket.socket] = {}
        self._opaque = itertools.count(1)

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self, addr: str) -> socket.socket:
        sock = self._socks.get(addr)
        if sock is None:
            host, _, port = addr.rpartition(":")
            try:
                sock = socket.create_connection((host, int(port)), timeout=self.timeout)
            except OSError as exc:
                raise RemotingConnectError(f"connect to {addr} failed: {exc}") from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks[addr] = sock
        return sock

    def call(
        self, addr: str, code: int, ext: dict | None = None, *, timeout: float | None = None
    ) -> RemotingCommand:
        try:
            return self._call_once(addr, code, ext, timeout)
        except RemotingConnectError:
            # A cached connection may have died since its last use (the node restarted): every
            # request sent here is safe to repeat, so try once more on a fresh connection.
            return self._call_once(addr, code, ext, timeout)

    def _call_once(
        self, addr: str, code: int, ext: dict | None, timeout: float | None
    ) -> RemotingCommand:
        cmd = RemotingCommand.request(code, ext)
        cmd.opaque = next(self._opaque)
        sock = self._connect(addr)
        sock.settimeout(self.timeout if timeout is None else timeout)
        try:
            sock.sendall(encode(cmd))
            while True:
                (length,) = _LEN.unpack(_recv_exact(sock, 4))
                resp = decode_frame(_recv_exact(sock, length))
                if resp.is_response and resp.opaque == cmd.opaque:
                    return resp
        except TimeoutError:
            self._drop(addr)
            raise RemotingTimeoutError(f"no answer from {addr} to request {code}") from None
        except OSError as exc:
            self._drop(addr)
            raise RemotingConnectError(f"connection to {addr} failed: {exc}") from None

    def call_ok(self, addr: str, code: int, ext: dict | None = None) -> RemotingCommand:
        resp = self.call(addr, code, ext)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for_response(resp.code, resp.remark)
        return resp

    def _drop(self, addr: str) -> None:
        sock = self._socks.pop(addr, None)
        if sock is not None:
            sock.close()


def _recv_exact(sock: socket.socket, n: int) -> memoryview:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionResetError("connection closed by the peer")
        got += k
    return view
