"""DeferredAnswer: a response decided later by a synchronous event, with no task waiting on it.

Theory of operation
-------------------
An inline handler (see ``channel.py``) answers at once with a ``RemotingCommand``, or hands the
channel an awaitable, which costs a task per request.  A SYNC_MASTER send waits for a replica
watermark that is raised synchronously when a slave's ack is read; a task per waiting send only
sleeps on an event.  A handler returns a :class:`DeferredAnswer` instead and arranges for
``set(response)`` to be called when the outcome is known; the channel subscribes with a plain
callback that queues the response, and queues written by one wake-up leave in one ``writev``
(:func:`flush_soon`).

Flush batches.  ``flush_soon(fn)`` runs ``fn`` at the end of the open :class:`flush_batch`
block, or else once per wake-up with ``run_sync_soon``.  ``run_sync_soon`` wakes the loop
through its wake-up socket (a send, an epoll event, a recv) and runs one more task; with one
send in flight that was a fifth of a SYNC_MASTER's CPU per message.  So the code that sets many
answers at once opens a block: the replica watermark when an ack releases sends, and a
channel's read loop around the requests of one received chunk.  Work that should happen once
per such turn uses :func:`flush_in_batch` and otherwise runs at once (the HA master's inline
transfer of the chunk's new bytes) or from ``run_sync_soon`` (the DLedger leader's push of the
chunk's proposals).

Callers outside a read loop (tests, a handler that still has to await something else) use
:meth:`DeferredAnswer.wait`.

The likely answer.  A handler that knows what it will answer unless something goes wrong (a
SYNC_MASTER send: its SEND_OK, unless the slave's ack times out) passes it as ``likely``.  The
channel encodes that frame while the outcome is pending, when the process would otherwise wait
idle for the slave, and when ``set`` is given that same object it queues the bytes it made: the
answer's build and encode leave the path from the slave's ack to the client (issue 28).

Invariants: ``set`` is effective once (later calls are ignored); a subscriber is called exactly
once, with the response, whether it subscribed before or after ``set``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

import trio

from common.remoting.command import RemotingCommand

__all__ = ["DeferredAnswer", "flush_batch", "flush_in_batch", "flush_soon"]

log = logging.getLogger(__name__)


class _Batches(threading.local):
    # the flushes asked for inside the outermost open flush_batch block of this thread's run
    # (a thread runs one Trio loop at a time; a thread-local costs a fraction of a RunVar)
    open: list[Callable[[], None]] | None = None


_BATCH = _Batches()


def flush_in_batch(fn: Callable[[], None]) -> bool:
    """Call ``fn`` (which must not raise) at the end of the open flush batch; False (and no
    call) if none is open."""
    batch = _BATCH.open
    if batch is None:
        return False
    batch.append(fn)
    return True


def flush_soon(fn: Callable[[], None]) -> None:
    """Call ``fn`` (which must not raise) once the answers being set now are all set."""
    if not flush_in_batch(fn):
        trio.lowlevel.current_trio_token().run_sync_soon(fn)


class flush_batch:  # lower case: used like a function, ``with flush_batch():``
    """A block that may set many DeferredAnswers: the flushes asked for run at its end.

    The block must not await: the open batch belongs to the thread, so a task that ran during
    an await would add its flushes to this block's.  Each flush runs even if one before it
    raised (that one is logged): a flush skipped would leave its owner believing it queued."""

    __slots__ = ("_outer",)

    def __enter__(self) -> None:
        self._outer = _BATCH.open
        if self._outer is None:
            _BATCH.open = []

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._outer is not None:
            return  # nested: the outermost block flushes
        batch = _BATCH.open
        _BATCH.open = None
        for fn in batch or ():
            try:
                fn()
            except Exception:
                log.exception("a flush at the end of a flush batch failed")


class DeferredAnswer:
    __slots__ = ("_event", "_response", "_subscriber", "likely")

    def __init__(self, likely: RemotingCommand | None = None) -> None:
        # the response ``set`` will most likely be given (see "The likely answer"); nobody may
        # change it once it is handed over
        self.likely = likely
        self._response: RemotingCommand | None = None
        self._subscriber: Callable[[RemotingCommand], None] | None = None
        self._event: trio.Event | None = None

    @property
    def done(self) -> bool:
        return self._response is not None

    def set(self, response: RemotingCommand) -> None:
        if self._response is not None:
            return
        self._response = response
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            subscriber(response)
        if self._event is not None:
            self._event.set()

    def subscribe(self, fn: Callable[[RemotingCommand], None]) -> None:
        """Call ``fn(response)`` once: now if it is known, else from ``set``."""
        if self._response is not None:
            fn(self._response)
        else:
            assert self._subscriber is None, "one subscriber"
            self._subscriber = fn

    async def wait(self) -> RemotingCommand:
        if self._response is None:
            if self._event is None:
                self._event = trio.Event()
            await self._event.wait()
        assert self._response is not None
        return self._response
