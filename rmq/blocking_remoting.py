"""A blocking remoting connection: one request, one answer, on the calling thread.

Theory of operation
-------------------
`rmq.sync` runs its clients on the portal's Trio thread, so every blocking call crosses
threads twice: on this project's 2-core machine that hop cost a one-at-a-time send ~95 us of
CPU and ~80 us of latency (a third of the sync client's whole cost). For the calls that are one
request and one answer to a broker whose address is already known (the plain send), the sync
client speaks the remoting protocol itself over a blocking socket, through the same sans-I/O
codec (`common.remoting.codec`) the Trio channel uses. Everything else, and every failure of
this path, goes the portal way, which has the whole retry policy.

A `BlockingChannel` is one TCP connection that carries one request at a time (its lock; a
thread that finds it busy takes the portal path instead of queueing behind it). An answer is
matched by opaque; answers to other opaques (late ones of a request that timed out before the
connection was closed) cannot arrive, because a timeout, a transport error or a corrupt stream
closes the connection: the next call connects again.

Errors are the Trio client's: `RemotingConnectError`, `RemotingTimeoutError`,
`RemotingSendError` (the connection broke), `ProtocolError` (the stream is corrupt).
"""

from __future__ import annotations

import itertools
import socket
import threading
import time

from common.errors import (
    ProtocolError,
    RemotingConnectError,
    RemotingSendError,
    RemotingTimeoutError,
)
from common.remoting.codec import FrameDecoder, encode
from common.remoting.command import RemotingCommand

__all__ = ["BlockingChannel"]

_READ_SIZE = 256 * 1024


class BlockingChannel:
    """One blocking connection to `addr` ("host:port"); see the module docstring."""

    def __init__(self, addr: str, *, connect_timeout: float = 3.0) -> None:
        self.addr = addr
        self.connect_timeout = connect_timeout
        self.lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder()
        self._opaques = itertools.count(1)

    def _connect(self, deadline: float) -> socket.socket:
        host, _, port = self.addr.rpartition(":")
        timeout = min(self.connect_timeout, deadline - time.monotonic())
        if timeout <= 0:
            raise RemotingTimeoutError(f"no time left to connect to {self.addr}")
        try:
            sock = socket.create_connection((host, int(port)), timeout=timeout)
        except TimeoutError:
            raise RemotingTimeoutError(f"connect to {self.addr} timed out") from None
        except (OSError, ValueError) as exc:
            raise RemotingConnectError(f"cannot connect to {self.addr}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock, self._decoder = sock, FrameDecoder()
        return sock

    def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send `cmd` (its opaque is set here) and return the answer; call with `lock` held."""
        deadline = time.monotonic() + timeout
        sock = self._sock or self._connect(deadline)
        opaque = next(self._opaques) & 0x7FFFFFFF or 1
        cmd.opaque = opaque
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.sendall(encode(cmd))
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                data = sock.recv(_READ_SIZE)
                if not data:
                    raise RemotingSendError(f"{self.addr} closed the connection")
                for answer in self._decoder.feed(data):
                    if answer.is_response and answer.opaque == opaque:
                        return answer
                    # a request from the broker (it asks clients things over their
                    # connections) is not answered here: this connection only sends
        except TimeoutError:
            self.close()
            raise RemotingTimeoutError(
                f"no response from {self.addr} within {timeout}s (code {cmd.code})"
            ) from None
        except OSError as exc:
            self.close()
            raise RemotingSendError(f"connection to {self.addr} failed: {exc}") from None
        except (RemotingSendError, ProtocolError):
            self.close()
            raise

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
