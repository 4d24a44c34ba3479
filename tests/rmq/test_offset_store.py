"""Offset stores: broker-kept (clustering) and file-kept (broadcasting)."""

from __future__ import annotations

import json

import pytest

from common.model import MessageQueue
from rmq.client_instance import ClientInstance
from rmq.errors import ClientError
from rmq.offset_store import LocalFileOffsetStore, ReadOffsetType, RemoteBrokerOffsetStore
from rmq.testing import FakeCluster, FakeRemoting

NS = "127.0.0.1:9876"
MQ0 = MessageQueue("T", "broker-a", 0)
MQ1 = MessageQueue("T", "broker-a", 1)


@pytest.fixture
def cluster() -> FakeCluster:
    c = FakeCluster()
    c.add_broker("broker-a", "127.0.0.1:10911")
    c.create_topic("T", 2)
    return c


async def test_remote_store_reads_updates_and_persists(cluster):
    instance = ClientInstance(FakeRemoting(cluster), [NS])
    store = RemoteBrokerOffsetStore(instance, "g")
    broker = cluster.brokers[0]
    assert await store.read_offset(MQ0, ReadOffsetType.STORE) == -1  # none yet
    broker.offsets[("g", "T", 0)] = 7
    assert await store.read_offset(MQ0, ReadOffsetType.STORE) == 7
    assert await store.read_offset(MQ0, ReadOffsetType.MEMORY) == 7
    store.update_offset(MQ0, 9, increase_only=True)
    store.update_offset(MQ0, 8, increase_only=True)  # a late, smaller result is ignored
    store.update_offset(MQ1, 3)
    await store.persist_all([MQ0])
    assert broker.offsets[("g", "T", 0)] == 9
    assert ("g", "T", 1) not in broker.offsets  # not assigned any more: not written ...
    assert MQ1 not in store.table()  # ... and forgotten
    store.update_offset(MQ0, 2)  # not increase_only: moves back (orderly, offset reset)
    assert await store.read_offset(MQ0, ReadOffsetType.MEMORY) == 2


async def test_remote_store_failure_reads_minus_two(cluster):
    instance = ClientInstance(FakeRemoting(cluster), [NS])
    store = RemoteBrokerOffsetStore(instance, "g")
    await instance.fetch_route("T")
    cluster.brokers[0].down = True
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
