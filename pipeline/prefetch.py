"""Prefetching in a thread: the items of an iterator, produced ahead of their consumer.

The live source's pulls of one task run in a thread of their own, up to :data:`PREFETCH_DEPTH`
PULL bodies ahead of the decoder (the numba decoder releases the GIL), so the broker's answer
time overlaps decoding and Spark's transfer instead of adding to them (``pipeline.live_reader``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator
from typing import TypeVar

import attrs

# PULL bodies waiting for the decoder: with 1024-message pulls ~2 MiB, enough to ride out jitter
PREFETCH_DEPTH = 8
_END = object()

T = TypeVar("T")


@attrs.frozen
class _Failed:
    exc: BaseException


def prefetched(
    make: Callable[[], Iterator[T]], depth: int = PREFETCH_DEPTH
) -> Generator[T, None, None]:
    """The items of ``make()``, produced by a thread up to ``depth`` ahead of the consumer.

    An exception of the producer is raised to the consumer in order (after the items before
    it).  Closing this generator early (Spark stopped reading) stops the producer and closes its
    iterator (and so its sockets) before returning.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        it = make()
        try:
            for item in it:
                if not put(item):
                    return
            put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            put(_Failed(exc))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=run, name="rmq-pull-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item
    finally:
        stop.set()
        thread.join()
