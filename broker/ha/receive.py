"""The receive side of an HA connection, without Trio's per-call costs on a socket.

Why: both ends of classic HA receive once per send when sends go one at a time (the slave a
transfer, the master an ack).  ``SocketStream.receive_some`` costs a generator context
manager (error translation), a conflict detector, two checkpoints (a scheduler pass even when
bytes were waiting), and the caller's ``move_on_after`` a new cancel scope and deadline per
call.  :class:`Receiver` reads the socket's descriptor directly and waits with
``wait_readable``; the silence timeout is one deadline moved forward, not a scope per call.

Theory of operation: ``receive()`` returns what the kernel has, up to ``max_bytes``, and
``b""`` at EOF, like ``receive_some``.  After a short read (the peer has paused) it waits for
readability first, saving the read that would fail; after a full one it reads first (a
backlog).  Errors from the socket become ``trio.BrokenResourceError`` as ``SocketStream``'s do.
A stream that is not a socket (tests' memory streams) is read through ``receive_some``.  The
caller owns the connection: it closes the stream; the descriptor is never closed here.

Read size: ``os.read(fd, n)`` allocates ``n`` bytes before it knows how many came.  Above
glibc's mmap threshold (128 KiB) that is an mmap, a page fault and an munmap per read: 19 us
of a 4 MiB read that brought one 1 KiB transfer, on the slave's path to its ack (issue 28).
So a read asks for ``SMALL_READ`` bytes, and each read that fills its size asks for four
times more the next time, up to ``max_bytes``; a short read goes back to ``SMALL_READ``.  A
catch-up backlog reaches ``max_bytes`` within a few reads.
"""

from __future__ import annotations

import os

import trio

__all__ = ["SMALL_READ", "Receiver"]

# the read size after a short read: below glibc's mmap threshold (see "Read size")
SMALL_READ = 64 * 1024


class Receiver:
    __slots__ = ("_fd", "_size", "_stream", "_wait_first", "max_bytes")

    def __init__(self, stream: trio.abc.ReceiveStream, max_bytes: int) -> None:
        self._stream = stream
        self.max_bytes = max_bytes
        self._size = min(SMALL_READ, max_bytes)
        self._fd = -1
        if isinstance(stream, trio.SocketStream):
            try:
                self._fd = stream.socket.fileno()
            except OSError:
                self._fd = -1
        self._wait_first = False

    @property
    def fd(self) -> int:
        """The socket's descriptor, or -1 when the stream is not a socket."""
        return self._fd

    async def receive(self) -> bytes | bytearray:
        fd = self._fd
        if fd < 0:
            return await self._stream.receive_some(self.max_bytes)
        if self._wait_first:
            await trio.lowlevel.wait_readable(fd)
        while True:
            size = self._size
            try:
                data = os.read(fd, size)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"HA socket: {exc}") from exc
            self._wait_first = 0 < len(data) < size
            if len(data) == size:
                self._size = min(size * 4, self.max_bytes)
            elif size > SMALL_READ:
                self._size = SMALL_READ
            if not self._wait_first:
                # a full read (or EOF): give other tasks their turn before the next one
                await trio.lowlevel.checkpoint()
            return data
