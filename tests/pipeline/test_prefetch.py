"""The live reader's pull thread (pipeline/prefetch.py): order, errors, and an early close."""

from __future__ import annotations

import threading

import pytest

from pipeline.errors import DataLossError
from pipeline.prefetch import prefetched


def test_prefetched_yields_every_item_in_order_then_raises_the_producers_error():
    def produce():
        yield from range(50)
        raise DataLossError("offsets 50..60 are gone")

    got = []
    with pytest.raises(DataLossError, match="50..60"):
        for item in prefetched(produce, depth=4):
            got.append(item)
    assert got == list(range(50))


def test_closing_prefetched_early_stops_the_producer_and_closes_its_iterator():
    closed = threading.Event()
    made = []

    def produce():
        try:
            for i in range(10_000):
                made.append(i)
                yield i
        finally:
            closed.set()

    gen = prefetched(produce, depth=2)
    assert [next(gen) for _ in range(3)] == [0, 1, 2]
    gen.close()  # returns only after the producer thread has finished
    assert closed.is_set()
    assert len(made) < 100  # it stopped at most a few items ahead, not at the end
