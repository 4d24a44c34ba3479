"""A slave serves replicated queues of a topic whose config has not reached it yet.

The master auto-creates a topic on its first send; the bytes reach the slave's CommitLog at
once, the config only with the next metadata sync. Consumers that fail over to the slave
because the master died must still get those messages.
"""

from __future__ import annotations

from pathlib import Path

import trio

from broker.config import BrokerConfig
from broker.service import run_broker
from broker.store import MessageStoreConfig, run_memory_store
from common.message import MessageExtBrokerInner, decode_records
from common.message_encoder import encode_record
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand


def pull(topic: str, queue_id: int) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.PULL_MESSAGE,
        {
            "consumerGroup": "g",
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": 0,
            "maxMsgNums": 32,
            "sysFlag": 4,
            "commitOffset": 0,
            "suspendTimeoutMillis": 0,
            "subscription": "*",
            "subVersion": 0,
        },
    )


async def test_slave_serves_queues_it_holds_without_their_topic_config(tmp_path: Path) -> None:
    store = MessageStoreConfig(store_path_root_dir=tmp_path, broker_role="SLAVE")
    config = BrokerConfig(listen_port=0, broker_id=1, store=store)
    # what the master wrote: two records of a topic the slave has no config for
    records = b""
    for qoff, body in enumerate((b"first", b"second")):
        msg = MessageExtBrokerInner(topic="ReplicatedOnly", queue_id=2, body=body)
        records += encode_record(msg, qoff, len(records), 1_700_000_000_000)
    async with trio.open_nursery() as n, open_remoting_client() as c:
        b = await n.start(
            lambda task_status: run_broker(
                config, store_factory=run_memory_store, task_status=task_status
            )
        )
        assert b.store.append_to_commit_log(0, records)
        await b.store.wait_dispatched()
        r = await c.invoke(b.addr, pull("ReplicatedOnly", 2))
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert [m.body for m in decode_records(r.body_bytes())] == [b"first", b"second"]
        # a queue beyond what the store holds, and a topic it has nothing of, stay errors
        r = await c.invoke(b.addr, pull("ReplicatedOnly", 3))
        assert r.code == ResponseCode.SYSTEM_ERROR
        r = await c.invoke(b.addr, pull("NeverSeen", 0))
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
        n.cancel_scope.cancel()
