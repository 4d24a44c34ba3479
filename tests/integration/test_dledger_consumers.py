"""A push consumer and a Spark stream read a DLedger group's topic through three leader kills and
get every acknowledged message, at least once.

The group runs as real processes; the push consumer runs in this Trio loop, the Spark query in a
worker thread (Spark's own micro-batch loop).  A producer keeps sending while the leader is
SIGKILLed and restarted three times; then the producer stops and both readers must end with
every key that was answered SEND_OK.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from common.message import MessageExt
from rmq import Message, Producer
from rmq.consume_service import ConsumeStatus
from rmq.producer import SendStatus
from rmq.push_consumer import ConsumeFromWhere, PushConsumer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from common.remoting.client import RemotingClient
    from tests.integration.conftest import DLedgerFactory

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.spark]

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

TOPIC = "RaftRead"
KILLS = 3


async def test_push_consumer_and_spark_stream_read_through_leader_kills(
    dledger_factory: DLedgerFactory,
    raft_client: RemotingClient,
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    group = await dledger_factory(3)
    leader = await group.leader(raft_client, timeout=60)
    await group.create_topic(raft_client, TOPIC, queues=4)

    acked: set[str] = set()
    pushed: set[str] = set()
    streamed: set[str] = set()
    lock = threading.Lock()

    async def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
        pushed.update(m.keys or "" for m in msgs)
        return ConsumeStatus.SUCCESS

    def sink(df: DataFrame, batch_id: int) -> None:
        rows = df.select("keys").collect()
        with lock:
            streamed.update(r["keys"] for r in rows)

    query = (
        spark.readStream.format("rocketmq")
        .option("namesrv", group.namesrv_addr)
        .option("topic", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        consumer = PushConsumer(
            "raft-read-cg", group.namesrv_addr, consume_from=ConsumeFromWhere.FIRST_OFFSET
        )
        consumer.subscribe(TOPIC)
        consumer.register_listener(on_messages)
        stop = trio.Event()

        async def produce() -> None:
            n = 0
            async with Producer("raft-read-pg", group.namesrv_addr) as producer:
                while not stop.is_set():
                    key = f"r{n:06d}"
                    n += 1
                    try:
                        r = await producer.send(Message(TOPIC, key.encode(), keys=key))
                    except Exception:
                        await trio.sleep(0.05)
                        continue
                    if r.status is SendStatus.SEND_OK:
                        acked.add(key)
                    await trio.sleep(0.01)

        async with consumer, trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            for _ in range(KILLS):
                await trio.sleep(3.0)
                group.kill(leader)
                await trio.sleep(0.5)
                group.restart(leader)
                leader = await group.leader(raft_client, timeout=30)
            await trio.sleep(2.0)
            stop.set()
            with trio.fail_after(90):
                while not (acked <= pushed and acked <= streamed):  # noqa: ASYNC110
                    await trio.sleep(0.5)
    finally:
        await trio.to_thread.run_sync(query.stop)
    assert len(acked) > 100
