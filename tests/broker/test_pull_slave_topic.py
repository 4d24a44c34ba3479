"""A slave serves replicated queues of a topic whose config has not reached it yet.

The master auto-creates a topic on its first send; the bytes reach the slave's CommitLog at
once, the config only with the next metadata sync. Consumers that fail over to the slave
because the master died must still get those messages.
"""

from __future__ import annotations

from pathlib import Path

from common.message import MessageExtBrokerInner, decode_records
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from tests.support.slave_broker import slave_holding


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
    # what the master wrote: two records of a topic the slave has no config for
    written = [
        MessageExtBrokerInner(topic="ReplicatedOnly", queue_id=2, body=body)
        for body in (b"first", b"second")
    ]
    async with slave_holding(tmp_path, written) as (b, c):
        r = await c.invoke(b.addr, pull("ReplicatedOnly", 2))
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert [m.body for m in decode_records(r.body_bytes())] == [b"first", b"second"]
        # a queue beyond what the store holds, and a topic it has nothing of, stay errors
        r = await c.invoke(b.addr, pull("ReplicatedOnly", 3))
        assert r.code == ResponseCode.SYSTEM_ERROR
        r = await c.invoke(b.addr, pull("NeverSeen", 0))
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
