"""Batch reads of live topics through real Spark (`local[2]`) from a real `rmq up` cluster.

One topic of 4 queues and 20,000 messages (produced in two halves 1.2 s apart, so a timestamp
between them splits the topic exactly) serves every test; each test is one or a few Spark
queries, because each costs about a second here.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

import pytest

from common.model import MessageQueue
from rmq import Message
from rmq.sync import Admin, Producer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tests.conftest import LocalCluster

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

# Spark's Python workers must run this interpreter (the venv with the project installed); the
# shared session reads this when it starts (see the report: belongs in tests/pipeline/conftest.py)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

TOPIC = "SparkBatchRead"
QUEUES = 4
PER_HALF = 10_000
BATCH = 250


def produce_half(producer: Producer, first: int, sent: dict[str, int]) -> None:
    """Messages first..first+PER_HALF-1 in batches spread round-robin over the queues."""
    for b, start in enumerate(range(first, first + PER_HALF, BATCH)):
        mq = MessageQueue(TOPIC, "broker-a", b % QUEUES)
        msgs = [
            Message(
                TOPIC,
                f"m-{i}".encode(),
                tags="TagA" if i % 2 == 0 else "TagB",
                keys=f"k{i}",
                properties={"seq": str(i)},
            )
            for i in range(start, start + BATCH)
        ]
        result = producer.send_batch(msgs, queue=mq)
        for i, uniq in zip(range(start, start + BATCH), result.msg_id.split(","), strict=True):
            sent[uniq] = i


# what `topic` produced: (namesrv, {uniq key: seq}, first ms of the second half,
# ms before/after producing)
Produced = tuple[str, dict[str, int], int, tuple[int, int]]


@pytest.fixture(scope="module")
def topic(module_cluster: LocalCluster) -> Produced:
    """(namesrv, {uniq key: seq}, first ms of the second half, ms before/after producing)."""
    ns = module_cluster.namesrv_addr
    with Admin(ns) as admin:
        admin.create_topic(TOPIC, queues=QUEUES)
        deadline = time.monotonic() + 20
        while True:  # the route appears once the broker re-registers
            try:
                admin.topic_route(TOPIC)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    sent: dict[str, int] = {}
    before = int(time.time() * 1000)
    with Producer("spark-test-pg", ns) as producer:
        produce_half(producer, 0, sent)
        time.sleep(0.6)
        middle = int(time.time() * 1000)
        time.sleep(0.6)
        produce_half(producer, PER_HALF, sent)
    after = int(time.time() * 1000)
    return ns, sent, middle, (before, after)


def read(spark: SparkSession, ns: str, **opts: str) -> DataFrame:
    reader = spark.read.format("rocketmq").option("namesrv", ns).option("topic", TOPIC)
    for k, v in opts.items():
        reader = reader.option(k, v)
    return reader.load()


def test_batch_read_returns_every_message_once_with_its_fields(
    spark: SparkSession, topic: Produced
) -> None:
    ns, sent, _middle, (before, after) = topic
    df = read(spark, ns, maxOffsetsPerPartition="3000")  # 4 queues -> 8 partitions
    assert df.columns == [
        "topic",
        "brokerName",
        "queueId",
        "queueOffset",
        "body",
        "tags",
        "keys",
        "properties",
        "msgId",
        "bornTimestamp",
        "storeTimestamp",
        "reconsumeTimes",
    ]
    table = df.toArrow()
    rows = table.to_pylist()
    assert len(rows) == 2 * PER_HALF
    assert {r["msgId"] for r in rows} == set(sent)
    per_queue: dict[int, list[int]] = {}
    for r in rows:
        seq = sent[r["msgId"]]
        assert r["body"] == f"m-{seq}".encode()
        assert r["topic"] == TOPIC and r["brokerName"] == "broker-a"
        assert r["tags"] == ("TagA" if seq % 2 == 0 else "TagB")
        assert r["keys"] == f"k{seq}"
        props = dict(r["properties"])
        assert props["seq"] == str(seq) and props["UNIQ_KEY"] == r["msgId"]
        assert r["reconsumeTimes"] == 0
        born = r["bornTimestamp"].timestamp() * 1000
        stored = r["storeTimestamp"].timestamp() * 1000
        assert before - 1 <= born <= stored <= after + 1
        # batch b of 250 went to queue b % 4 at consecutive offsets
        assert r["queueId"] == (seq // BATCH) % QUEUES
        per_queue.setdefault(r["queueId"], []).append(r["queueOffset"])
    for offsets in per_queue.values():
        assert sorted(offsets) == list(range(2 * PER_HALF // QUEUES))


def test_offsets_json_timestamp_and_tags_select_ranges(
    spark: SparkSession, topic: Produced
) -> None:
    ns, sent, middle, _ = topic
    df = read(
        spark,
        ns,
        startingOffsets=f'{{"{TOPIC}": {{"broker-a/0": 100, "broker-a/1": -2}}}}',
        endingOffsets=f'{{"{TOPIC}": {{"broker-a/0": 200, "broker-a/1": 50, "broker-a/2": -1}}}}',
    )
    got = sorted(
        (r["queueId"], r["queueOffset"]) for r in df.select("queueId", "queueOffset").collect()
    )
    expected = (
        [(0, o) for o in range(100, 200)]
        + [(1, o) for o in range(50)]
        + [(q, o) for q in (2, 3) for o in range(PER_HALF * 2 // QUEUES)]
    )
    assert got == expected

    late = read(spark, ns, startingTimestamp=str(middle)).select("msgId").collect()
    assert sorted(sent[r["msgId"]] for r in late) == list(range(PER_HALF, 2 * PER_HALF))

    tagged = read(spark, ns, tags="TagB", startingOffsets=f'{{"{TOPIC}": {{"broker-a/3": 4900}}}}')
    seqs = sorted(
        sent[r["msgId"]] for r in tagged.select("msgId", "tags").collect() if r["tags"] == "TagB"
    )
    assert tagged.count() == len(seqs)  # nothing but TagB comes back
    odd = [s for s in range(2 * PER_HALF) if s % 2 == 1]
    q3_tail = {s for s in odd if (s // BATCH) % QUEUES == 3}
    # queue 3 read from offset 4900 only: its last 100 offsets hold 50 TagB messages
    assert len([s for s in seqs if s in q3_tail]) == 50
    assert len(seqs) == len(odd) - len(q3_tail) + 50


@pytest.mark.parametrize(
    ("opts", "needle"),
    [
        ({"topic": "NoSuchTopicHere"}, "option topic: topic 'NoSuchTopicHere' does not exist"),
        ({"topic": TOPIC, "startingOffsets": '{"x": '}, "option startingOffsets: malformed JSON"),
        ({"topic": TOPIC, "namesrv": ""}, "option namesrv is required"),
        (
            {"topic": TOPIC, "startingOffsets": '{"Other": {"broker-a/0": 1}}'},
            "option startingOffsets: topic 'Other' is not one of the topics read",
        ),
    ],
)
def test_bad_options_fail_with_a_message_naming_the_option(
    spark: SparkSession, topic: Produced, opts: dict[str, str], needle: str
) -> None:
    ns, *_ = topic
    reader = spark.read.format("rocketmq").option("namesrv", ns)
    for k, v in opts.items():
        reader = reader.option(k, v)
    with pytest.raises(Exception) as info:
        reader.load().count()
    assert needle in str(info.value)


def test_topic_pattern_and_read_from_slave(spark: SparkSession, topic: Produced) -> None:
    """topicPattern selects the topic by regex (system topics never match); readFromSlave pulls
    from brokerId 1: the slave's served-message counter grows by the whole topic, the master's
    does not move."""
    ns, sent, *_ = topic
    with Admin(ns) as admin:
        addrs = admin.cluster_info().brokerAddrTable["broker-a"].brokerAddrs
        master, slave = addrs[0], addrs[1]

        def served(addr: str) -> int:
            return int(admin.broker_runtime_info(addr)["msgGetTotalTodayNow"])

        before = served(master), served(slave)
        df = (
            spark.read.format("rocketmq")
            .option("namesrv", ns)
            .option("topicPattern", "^SparkBatch.*$")
            .option("readFromSlave", "true")
            .load()
        )
        ids = [r["msgId"] for r in df.select("msgId").collect()]
        after = served(master), served(slave)
    assert sorted(ids) == sorted(sent)
    assert after[1] - before[1] >= len(sent)
    assert after[0] - before[0] < len(sent)
