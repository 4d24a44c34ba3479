"""A slave broker in process whose CommitLog already holds what its master wrote, for tests of
what a slave serves from replicated records (its topic config or filters not synced yet)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from broker.config import BrokerConfig
from broker.service import BrokerHandle, run_broker
from broker.store import MessageStoreConfig, run_memory_store
from common.message import MessageExtBrokerInner
from common.message_encoder import encode_record
from common.remoting.client import RemotingClient, open_remoting_client


@asynccontextmanager
async def slave_holding(
    tmp_path: Path, msgs: Iterable[MessageExtBrokerInner], **config: Any
) -> AsyncIterator[tuple[BrokerHandle, RemotingClient]]:
    """A slave broker (memory store in ``tmp_path``; ``config``: more BrokerConfig fields) with
    ``msgs`` in its CommitLog as a master writes them (queue offsets 0, 1, ... in order),
    dispatched to its consume queues; and a client to call it."""
    store = MessageStoreConfig(store_path_root_dir=tmp_path, broker_role="SLAVE")
    broker_config = BrokerConfig(listen_port=0, broker_id=1, store=store, **config)
    records = b""
    for qoff, msg in enumerate(msgs):
        records += encode_record(msg, qoff, len(records), 1_700_000_000_000)
    async with trio.open_nursery() as n, open_remoting_client() as c:
        b = await n.start(
            lambda task_status: run_broker(
                broker_config, store_factory=run_memory_store, task_status=task_status
            )
        )
        assert b.store.append_to_commit_log(0, records)
        await b.store.wait_dispatched()
        try:
            yield b, c
        finally:
            n.cancel_scope.cancel()
