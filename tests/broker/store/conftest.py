"""Fixtures for the store tests: one ``open_store`` per implementation (conformance suite)."""

from __future__ import annotations

import contextlib

import attrs
import pytest
import trio

from broker.store import MessageStoreConfig, run_memory_store, run_message_store

IMPLS = ["memory", "file"]


@pytest.fixture(params=IMPLS)
def impl(request):
    return request.param


@pytest.fixture
def open_store(impl, tmp_path):
    """``async with open_store(**config) as store``: a running store of the current impl."""

    @contextlib.asynccontextmanager
    async def _open(root=None, **kw):
        cfg = MessageStoreConfig(store_path_root_dir=str(root or tmp_path / "store"), **kw)
        runner = run_memory_store if impl == "memory" else run_message_store
        async with trio.open_nursery() as nursery:
            store = await nursery.start(runner, cfg)
            try:
                yield store
            finally:
                nursery.cancel_scope.cancel()

    return _open


@attrs.frozen
class TagsFilter:
    codes: frozenset[int]

    def is_matched_by_consume_queue(self, tags_code: int) -> bool:
        return tags_code in self.codes

    def is_matched_by_commit_log(self, record: object) -> bool:
        return True


@pytest.fixture
def tags_filter():
    return lambda *codes: TagsFilter(frozenset(codes))
