"""Fixtures for the HA tests: running stores (memory by default) and a message factory."""

from __future__ import annotations

import contextlib

import pytest
import trio

from broker.store import MessageStoreConfig, run_memory_store, run_message_store
from common.message import MessageExtBrokerInner

STORE_HOST = ("127.0.0.1", 10911)


def make_message(topic="T", qid=0, body=b"x", **props):
    return MessageExtBrokerInner(
        topic=topic,
        queue_id=qid,
        body=body,
        properties={k: str(v) for k, v in props.items()},
        born_timestamp=1,
        born_host=("10.0.0.1", 1234),
        store_host=STORE_HOST,
    )


@pytest.fixture
def mk():
    return make_message


@pytest.fixture
def open_store(tmp_path):
    """``async with open_store(name, file=False, **config) as store``."""

    @contextlib.asynccontextmanager
    async def _open(name="master", *, file=False, **kw):
        kw.setdefault("mapped_file_size_commit_log", 4096)
        cfg = MessageStoreConfig(store_path_root_dir=str(tmp_path / name), **kw)
        async with trio.open_nursery() as nursery:
            store = await nursery.start(run_message_store if file else run_memory_store, cfg)
            try:
                yield store
            finally:
                nursery.cancel_scope.cancel()

    return _open
