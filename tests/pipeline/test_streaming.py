"""Streaming reads through real Spark from a real `rmq up`: micro-batches under
maxOffsetsPerTrigger, a stop and a restart from the checkpoint while messages keep arriving
(the output holds every message exactly once), consumer offsets committed for the group, and
data loss reported per failOnDataLoss.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest

from common.model import MessageQueue
from rmq import Message
from rmq.sync import Admin, Producer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from tests.conftest import LocalCluster

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

# Spark's Python workers must run this interpreter (see tests/pipeline/test_live_source.py)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def make_topic(ns: str, topic: str, queues: int) -> None:
    with Admin(ns) as admin:
        admin.create_topic(topic, queues=queues)
        deadline = time.monotonic() + 20
        while True:
            try:
                admin.topic_route(topic)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def produce(ns: str, topic: str, seqs: range, queues: int, batch: int = 100) -> None:
    with Producer("spark-stream-pg", ns) as producer:
        for b, start in enumerate(range(seqs.start, seqs.stop, batch)):
            msgs = [
                Message(topic, f"s-{i}".encode())
                for i in range(start, min(start + batch, seqs.stop))
            ]
            producer.send_batch(msgs, queue=MessageQueue(topic, "broker-a", b % queues))


def stream(spark: SparkSession, ns: str, topic: str, **opts: str) -> DataFrame:
    reader = spark.readStream.format("rocketmq").option("namesrv", ns).option("topic", topic)
    for k, v in opts.items():
        reader = reader.option(k, v)
    return reader.load()


def bodies(out_dir: Path) -> list[bytes]:
    if not os.path.isdir(out_dir) or not os.listdir(out_dir):
        return []
    return pq.read_table(str(out_dir), columns=["body"]).column("body").to_pylist()


def test_stream_micro_batches_restart_exactly_once_and_commit(
    spark: SparkSession, module_cluster: LocalCluster, tmp_path: Path
) -> None:
    ns, topic, queues, group = module_cluster.namesrv_addr, "SparkStreamed", 3, "spark-stream-cg"
    make_topic(ns, topic, queues)
    produce(ns, topic, range(0, 3000), queues)
    checkpoint, out = tmp_path / "ckpt", tmp_path / "out"
    sizes: dict[int, int] = {}  # batch id -> rows

    def sink(df: DataFrame, batch_id: int) -> None:
        # idempotent per batch id: a batch Spark replays after a stop (sink ran, commit log
        # not yet written) replaces its first attempt, as an exactly-once sink must
        df.select("body", "queueId", "queueOffset").write.mode("overwrite").parquet(
            str(out / f"batch={batch_id}")
        )
        sizes[batch_id] = df.count()

    def start(trigger: dict[str, str]) -> StreamingQuery:
        df = stream(
            spark,
            ns,
            topic,
            startingOffsets="earliest",
            maxOffsetsPerTrigger="700",
            consumerGroup=group,
        )
        return (
            df.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    def run_until(total: int) -> None:
        # availableNow is one ReadAllAvailable batch for a Python source: use a real trigger
        q = start({"processingTime": "100 milliseconds"})
        deadline = time.monotonic() + 120
        while sum(sizes.values()) < total and time.monotonic() < deadline and q.isActive:
            time.sleep(0.1)
        q.stop()
        assert q.exception() is None

    # run 1: everything there is, 700 per micro-batch
    run_until(3000)
    assert sum(sizes.values()) == 3000 and max(sizes.values()) <= 700 and len(sizes) >= 5

    # run 2 restarts from the checkpoint while a producer keeps sending; stopped mid-way
    producer = threading.Thread(target=produce, args=(ns, topic, range(3000, 6000), queues))
    producer.start()
    run_until(3700)
    producer.join(120)
    assert 3700 <= sum(sizes.values()) and max(sizes.values()) <= 700

    # run 3 (restart again) catches up; every message exactly once
    run_until(6000)
    time.sleep(0.5)
    got = bodies(out)
    assert len(got) == 6000
    assert sorted(got) == sorted(f"s-{i}".encode() for i in range(6000))

    # the group's offsets on the master: Spark commits one batch late, so at least run 2's
    # last batch is stored (and never more than the queue holds)
    with Admin(ns) as admin:
        committed = [
            admin.consumer_offset(group, MessageQueue(topic, "broker-a", i)) for i in range(queues)
        ]
        maxes = [admin.max_offset(MessageQueue(topic, "broker-a", i)) for i in range(queues)]
    assert sum(committed) >= 3700 and all(
        0 <= c <= m for c, m in zip(committed, maxes, strict=True)
    )


@pytest.mark.parametrize("fail", [True, False])
def test_checkpoint_offset_past_the_queue_is_data_loss(
    spark: SparkSession, module_cluster: LocalCluster, tmp_path: Path, fail: bool
) -> None:
    """A start offset above the queue's max offset (a replaced store) fails the query, or with
    failOnDataLoss=false is logged and reading starts over from the queue's min offset."""
    ns, topic = module_cluster.namesrv_addr, f"SparkLoss{int(fail)}"
    make_topic(ns, topic, 1)
    produce(ns, topic, range(20), 1)
    seen: list[int] = []
    df = stream(
        spark,
        ns,
        topic,
        failOnDataLoss=str(fail).lower(),
        startingOffsets=f'{{"{topic}": {{"broker-a/0": 500}}}}',
    )
    q = (
        df.writeStream.foreachBatch(lambda d, _i: seen.extend(r.queueOffset for r in d.collect()))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    if fail:
        with pytest.raises(Exception, match="past the queue's max offset 20"):
            q.awaitTermination(120)
        assert seen == []
    else:
        q.awaitTermination(120)
        assert q.exception() is None
        assert sorted(seen) == list(range(20))


def test_available_now_reads_what_was_there_in_limited_micro_batches(
    spark: SparkSession, module_cluster: LocalCluster, tmp_path: Path
) -> None:
    """Trigger.AvailableNow (SupportsTriggerAvailableNow): the queues' contents when the run
    starts, split by maxOffsetsPerTrigger into several micro-batches; messages sent during the
    run wait for the next run, which reads exactly them."""
    ns, topic, queues = module_cluster.namesrv_addr, "SparkAvailableNow", 2
    make_topic(ns, topic, queues)
    produce(ns, topic, range(0, 1000), queues)
    sizes: list[int] = []
    seen: list[bytes] = []
    sent_late = threading.Event()

    def sink(df: DataFrame, _batch_id: int) -> None:
        rows = [r.body for r in df.select("body").collect()]
        sizes.append(len(rows))
        seen.extend(rows)
        if not sent_late.is_set():  # arrives after the run's target was fixed
            produce(ns, topic, range(1000, 1100), queues)
            sent_late.set()

    def run() -> None:
        q = (
            stream(spark, ns, topic, startingOffsets="earliest", maxOffsetsPerTrigger="300")
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(180)
        assert q.exception() is None

    run()
    assert len(sizes) >= 4 and max(sizes) <= 300, sizes
    assert sorted(seen) == sorted(f"s-{i}".encode() for i in range(1000))
    sizes.clear()
    run()
    assert sorted(seen) == sorted(f"s-{i}".encode() for i in range(1100))


def test_a_topic_extended_between_runs_has_its_new_queues_read_from_their_start(
    spark: SparkSession, module_cluster: LocalCluster, tmp_path: Path
) -> None:
    """Queues added to a topic (`rmq topic update --queues`) appear in the next micro-batch's
    route and are read from their min offset; the old queues continue from the checkpoint."""
    ns, topic = module_cluster.namesrv_addr, "SparkExtended"
    make_topic(ns, topic, 2)
    produce(ns, topic, range(0, 200), 2)
    seen: list[tuple[int, bytes]] = []

    def run() -> None:
        q = (
            stream(spark, ns, topic, startingOffsets="earliest")
            .writeStream.foreachBatch(
                lambda d, _i: seen.extend((r.queueId, r.body) for r in d.collect())
            )
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(180)
        assert q.exception() is None

    run()
    assert sorted(seen) == sorted(((i // 100) % 2, f"s-{i}".encode()) for i in range(200))
    make_topic(ns, topic, 4)  # UPDATE_AND_CREATE_TOPIC with more queues, re-registered
    with Admin(ns) as admin:
        deadline = time.monotonic() + 40  # the route shows 4 queues once the broker re-registers
        while admin.topic_route(topic).queueDatas[0].readQueueNums != 4:
            assert time.monotonic() < deadline, "route never showed the new queues"
            time.sleep(0.2)
    produce(ns, topic, range(200, 600), 4)  # batches of 100 to queues 0, 1, 2, 3
    seen.clear()
    run()
    assert sorted(seen) == sorted(((i - 200) // 100, f"s-{i}".encode()) for i in range(200, 600))
