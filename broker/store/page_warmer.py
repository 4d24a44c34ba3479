"""Page-cache warming ahead of a segment's write position (in the spirit of RocketMQ's
``warmMapedFileEnable``, without its cost).

Theory of operation
-------------------
Segments are created sparse and written through a shared mapping (``mapped_file.py``).  The
first write to each page of a hole makes the kernel allocate and zero a page-cache page inside
the page fault: on the writer's thread, which is the event loop, with the GIL held.  On this
project's VMs that fault costs ~2.8 us per 1.3 KiB record when the memory was never touched
before (~0.3 us when the page already exists), and it was three quarters of a slave's CPU while
it caught up with its master.

The warmer is one task per segment queue, which owns one thread.  The thread keeps the range
``[wrote, wrote + ahead)`` of the queue's last segment in the page cache by *reading* it
(``preadv`` of up to ``ahead`` bytes at once into one reused 1 MiB buffer, GIL released):
reading a hole makes the kernel insert zero-filled page-cache pages, so the fault the writer
takes later only maps a page that exists.  The work moves off the event loop to a thread that
can use another core.  It is a thread of its own, not a ``to_thread`` call per chunk, because a
busy loop schedules a task only once per pass: a warmer stepping through the loop was held to
one chunk per pass and fell behind the writer it was meant to precede.  When the writer catches
up anyway (memory the machine never touched is slow to fault in, whoever does it), the thread
jumps ahead by half the window and leaves the near half to the writer, so the two fault
different pages in parallel instead of racing for the same ones.

Why reading and not RocketMQ's way (write a zero into every page of a new segment, then mlock):
a read changes nothing on disk (no extra writeback of zero pages), does not map the pages into
our process (RSS grows only as the writer writes), and can never disagree with the writer.

Invariants: the warmer never writes; it only reads bytes at or past what the writer has written
(and reads of written bytes are harmless anyway), so it cannot change what is stored or served.
It is a hint: pages reclaimed before the writer arrives are faulted as they were without it.
It reads through its own ``dup`` of the segment's descriptor, so a segment closed or deleted
meanwhile costs at most one useless read of an unlinked file.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import trio

from broker.store.mapped_file import PAGE_SIZE, MappedFile

log = logging.getLogger(__name__)

# how far ahead of the write position pages are kept warm, and the scratch buffer's size
DEFAULT_AHEAD = 32 << 20
_CHUNK = 1 << 20
# how often the writer's position is looked at when there is nothing to warm: at first, and
# (doubling each idle look) at most.  Every look takes the GIL from the event loop; a writer
# needs ahead/2 = 16 MiB to outrun a warmer that looks every 50 ms, i.e. 320 MB/s, which only a
# catch-up reaches, and a catch-up keeps the warmer busy (each busy step resets the interval)
DEFAULT_INTERVAL = 0.005
MAX_INTERVAL = 0.05


class _Warmer:
    def __init__(
        self,
        last: Callable[[], MappedFile | None],
        ahead: int,
        interval: float,
        max_interval: float = MAX_INTERVAL,
    ):
        self.last = last
        self.ahead = ahead - ahead % _CHUNK
        self.interval = interval
        self.max_interval = max(interval, max_interval)
        self.stop = threading.Event()
        self._buf = memoryview(bytearray(_CHUNK))
        self._segment: MappedFile | None = None
        self._fd = -1
        self._warmed = 0

    def run(self) -> None:
        idle = self.interval
        try:
            while not self.stop.is_set():
                if self._step():
                    idle = self.interval
                else:
                    self.stop.wait(idle)
                    idle = min(idle * 2, self.max_interval)
        finally:
            self._switch(None)

    def _switch(self, mf: MappedFile | None) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._segment, self._warmed = mf, 0
        if mf is not None and not mf.is_full:
            try:
                # (closed and its number reused between fileno() and dup: we would read some
                # other file, harmlessly; pread on a socket or pipe fails with ESPIPE, reads none)
                self._fd = os.dup(mf.fileno())
            except OSError:
                self._segment = None  # closed under us; look again next round

    def _step(self) -> bool:
        """Warm one stretch; False when there was nothing to do."""
        mf = self.last()
        if mf is not self._segment:
            self._switch(mf)
        segment = self._segment
        if segment is None or self._fd < 0:
            return False
        wrote = segment.wrote
        page = wrote - wrote % PAGE_SIZE
        start = max(self._warmed, page)
        if self._warmed and start - wrote < _CHUNK:
            # the writer has caught up: racing it over the same pages wins nothing, so leave it
            # the near half and warm the far half while it faults its way there
            start = page + self.ahead // 2
        end = min(segment.file_size, wrote + self.ahead)
        n = (end - start) // _CHUNK
        if n <= 0:
            return False
        try:
            os.preadv(self._fd, [self._buf] * n, start)
        except OSError as exc:
            log.debug("page warmer: read of %s failed: %s", segment.path, exc)
            return False
        self._warmed = start + n * _CHUNK
        return True


async def run_page_warmer(
    last: Callable[[], MappedFile | None],
    *,
    ahead: int = DEFAULT_AHEAD,
    interval: float = DEFAULT_INTERVAL,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep ``ahead`` bytes past the write position of ``last()`` in the page cache."""
    warmer = _Warmer(last, ahead, interval)
    thread = threading.Thread(target=warmer.run, name="page-warmer", daemon=True)
    thread.start()
    task_status.started()
    try:
        await trio.sleep_forever()
    finally:
        warmer.stop.set()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(thread.join)
