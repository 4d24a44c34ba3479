"""Offset stores: broker-kept (clustering) and file-kept (broadcasting)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from common.model import MessageQueue
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from rmq.client_instance import ClientInstance
from rmq.errors import ClientError
from rmq.offset_store import LocalFileOffsetStore, ReadOffsetType, RemoteBrokerOffsetStore

if TYPE_CHECKING:
    from broker.consumer_offset_manager import ConsumerOffsetManager

MQ0 = MessageQueue("T", "broker-a", 0)
MQ1 = MessageQueue("T", "broker-a", 1)


@pytest.fixture
async def cluster(memory_cluster):
    await memory_cluster.create_topic("T", 2)
    return memory_cluster


async def test_remote_store_reads_updates_and_persists(cluster):
    tap = cluster.tap()
    offsets = cluster.broker().controller.consumer_offset_manager
    async with open_remoting_client(network=tap) as remoting:
        instance = ClientInstance(remoting, [cluster.namesrv])
        store = RemoteBrokerOffsetStore(instance, "g")
        # a fresh group on a queue that starts at 0: the broker says 0
        assert await store.read_offset(MQ0, ReadOffsetType.STORE) == 0
        # QUERY_NOT_FOUND (the queue's head is gone): none yet
        query = {RequestCode.QUERY_CONSUMER_OFFSET}
        tap.fail(cluster.addr(), ResponseCode.QUERY_NOT_FOUND, requests=query)
        assert await store.read_offset(MQ0, ReadOffsetType.STORE) == -1
        offsets.commit_offset("g", "T", 0, 7)
        await _remote_store_updates_and_persists(store, offsets)


async def _remote_store_updates_and_persists(
    store: RemoteBrokerOffsetStore, offsets: ConsumerOffsetManager
) -> None:
    assert await store.read_offset(MQ0, ReadOffsetType.STORE) == 7
    assert await store.read_offset(MQ0, ReadOffsetType.MEMORY) == 7
    store.update_offset(MQ0, 9, increase_only=True)
    store.update_offset(MQ0, 8, increase_only=True)  # a late, smaller result is ignored
    store.update_offset(MQ1, 3)
    await store.persist_all([MQ0])
    assert offsets.offsets_of("g", "T")[0] == 9
    assert 1 not in offsets.offsets_of("g", "T")  # not assigned any more: not written ...
    assert MQ1 not in store.table()  # ... and forgotten
    store.update_offset(MQ0, 2)  # not increase_only: moves back (orderly, offset reset)
    assert await store.read_offset(MQ0, ReadOffsetType.MEMORY) == 2


async def test_remote_store_failure_reads_minus_two(cluster):
    async with open_remoting_client(network=cluster.network) as remoting:
        instance = ClientInstance(remoting, [cluster.namesrv])
        store = RemoteBrokerOffsetStore(instance, "g")
        await instance.fetch_route("T")
        cluster.network.refused.add(cluster.broker().port)
        assert await store.read_offset(MQ0, ReadOffsetType.STORE) == -2
        store.update_offset(MQ0, 5)
        await store.persist(MQ0)  # logged, not raised
        assert store.table() == {MQ0: 5}


async def test_local_store_round_trips_through_its_file(tmp_path):
    store = LocalFileOffsetStore(tmp_path, "127.0.0.1@x", "g")
    store.load()  # no file yet
    assert await store.read_offset(MQ0, ReadOffsetType.MEMORY_FIRST_THEN_STORE) == -1
    store.update_offset(MQ0, 11)
    store.update_offset(MQ1, 4)
    await store.persist_all([MQ0])  # broadcasting keeps every queue
    path = tmp_path / "127.0.0.1@x" / "g" / "offsets.json"
    assert path.exists() and not path.with_suffix(".json.tmp").exists()
    again = LocalFileOffsetStore(tmp_path, "127.0.0.1@x", "g")
    again.load()
    assert again.table() == {MQ0: 11, MQ1: 4}
    assert await again.read_offset(MQ1, ReadOffsetType.STORE) == 4
    data = json.loads(path.read_text())
    assert {"topic": "T", "brokerName": "broker-a", "queueId": 0, "offset": 11} in data["offsets"]


async def test_local_store_rejects_a_corrupt_file(tmp_path):
    path = tmp_path / "c" / "g" / "offsets.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(ClientError, match="not valid"):
        LocalFileOffsetStore(tmp_path, "c", "g").load()
