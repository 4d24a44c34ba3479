"""The rocketmq sink: rows written through it come back from a PullConsumer unchanged.

The writer's executor side (`write(batches)`) is exercised directly against a real `rmq up`
(fast, no Spark), then through Spark's `df.write` / `df.writeStream` with the "rocketmq"
format. Driver-side validation is checked on the constructor and through Spark.
"""

from __future__ import annotations

import os
import sys

# Spark's Python workers run `python3` from PATH unless told; it must be this interpreter
# (the venv with the project and pyarrow). Read when the shared session starts, after import.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from common.message import MessageExt
from common.model import MessageQueue
from pipeline.sink import (
    IDEMPOTENT_KEY_PROPERTY,
    RocketMQStreamWriter,
    RocketMQWriter,
    SinkConfigError,
    SinkWriteError,
)
from rmq.sync import Admin, PullConsumer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.conftest import LocalCluster

SCHEMA = StructType(
    [
        StructField("body", BinaryType()),
        StructField("tags", StringType()),
        StructField("keys", StringType()),
        StructField("properties", MapType(StringType(), StringType())),
    ]
)
ARROW = pa.schema(
    [
        ("body", pa.binary()),
        ("tags", pa.string()),
        ("keys", pa.string()),
        ("properties", pa.map_(pa.string(), pa.string())),
    ]
)


def _topic(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _rows(n: int, tag_every: int = 3) -> list[dict]:
    return [
        {
            "body": f"body-{i}-".encode() + bytes([i % 256]) * (i % 7),
            "tags": f"T{i % tag_every}" if i % 5 else None,
            "keys": f"k{i}" if i % 2 else None,
            "properties": [("idx", str(i)), ("kind", "test")],
        }
        for i in range(n)
    ]


def _batches(rows: list[dict], size: int, schema: pa.Schema = ARROW) -> list[pa.RecordBatch]:
    return [
        pa.RecordBatch.from_pylist(rows[i : i + size], schema=schema)
        for i in range(0, len(rows), size)
    ]


def read_all(
    namesrv: str, topic: str, expected: int, timeout: float = 30.0
) -> list[tuple[MessageQueue, MessageExt]]:
    """Every message of `topic` (all queues), waiting until `expected` have arrived."""
    deadline = time.monotonic() + timeout
    with PullConsumer("sink-test-reader", namesrv) as consumer:
        while True:
            msgs: list[tuple[MessageQueue, MessageExt]] = []
            for mq in consumer.fetch_queues(topic):
                offset = 0
                while True:
                    result = consumer.pull(mq, offset, 1024)
                    if not result.messages:
                        break
                    msgs.extend((mq, m) for m in result.messages)
                    offset = result.next_begin_offset
            if len(msgs) >= expected or time.monotonic() > deadline:
                return msgs
            time.sleep(0.2)


def _create_topic(namesrv: str, topic: str, queues: int = 4, **kw: Any) -> None:
    with Admin(namesrv) as admin:
        admin.create_topic(topic, queues=queues, **kw)


# --- driver-side validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "options", "needle"),
    [
        (SCHEMA, {"topic": "t"}, "namesrv"),
        (SCHEMA, {"namesrv": "  ", "topic": "t"}, "namesrv"),
        (
            StructType([StructField("value", BinaryType())]),
            {"namesrv": "x:1", "topic": "t"},
            "no body column",
        ),
        (
            StructType([StructField("body", IntegerType())]),
            {"namesrv": "x:1", "topic": "t"},
            "column body must be binary or string, not int",
        ),
        (
            StructType([StructField("body", StringType()), StructField("tags", IntegerType())]),
            {"namesrv": "x:1", "topic": "t"},
            "column tags must be string",
        ),
        (
            StructType(
                [
                    StructField("body", StringType()),
                    StructField("properties", MapType(StringType(), IntegerType())),
                ]
            ),
            {"namesrv": "x:1", "topic": "t"},
            "column properties must be map<string,string>",
        ),
        (
            StructType([StructField("body", StringType()), StructField("queueId", StringType())]),
            {"namesrv": "x:1", "topic": "t"},
            "column queueId must be int",
        ),
        (SCHEMA, {"namesrv": "x:1"}, "no topic"),
        (SCHEMA, {"namesrv": "x:1", "topic": "t", "batchSize": "0"}, "option batchSize"),
        (SCHEMA, {"namesrv": "x:1", "topic": "t", "batchSize": "ten"}, "option batchSize"),
        (SCHEMA, {"namesrv": "x:1", "topic": "t", "timeout": "-1"}, "option timeout"),
        (
            SCHEMA,
            {"namesrv": "x:1", "topic": "t", "idempotentKeys": "maybe"},
            "option idempotentKeys",
        ),
    ],
)
@pytest.mark.parametrize("cls", [RocketMQWriter, RocketMQStreamWriter])
def test_bad_options_and_columns_fail_on_the_driver(
    cls: type[RocketMQWriter] | type[RocketMQStreamWriter],
    schema: StructType,
    options: dict[str, str],
    needle: str,
) -> None:
    with pytest.raises(SinkConfigError, match=needle):
        cls(schema, options, False)


def test_options_are_case_insensitive_and_topic_column_is_enough() -> None:
    schema = StructType([StructField("body", StringType()), StructField("topic", StringType())])
    w = RocketMQWriter(schema, {"NAMESRV": "h:1", "BatchSize": "7", "IDEMPOTENTKEYS": "true"})
    assert (w.options.namesrv, w.options.batch_size, w.options.idempotent_keys) == ("h:1", 7, True)
    assert w.options.topic is None


# --- executor side, against a real cluster (no Spark) ------------------------------------


@pytest.mark.integration
def test_write_roundtrip_bodies_tags_keys_properties(module_cluster: LocalCluster) -> None:
    namesrv = module_cluster.namesrv_addr
    topic = _topic("SinkRoundTrip")
    _create_topic(namesrv, topic)
    rows = _rows(1500)
    writer = RocketMQWriter(SCHEMA, {"namesrv": namesrv, "topic": topic, "batchSize": "100"})
    commit = writer.write(iter(_batches(rows, 400)))
    assert commit.messages == 1500
    assert commit.requests >= 15  # 1500 rows, at most 100 per request
    got = read_all(namesrv, topic, 1500)
    assert len(got) == 1500
    by_idx = {m.properties["idx"]: m for _mq, m in got}
    assert len(by_idx) == 1500  # each row exactly once
    assert len({mq.queueId for mq, _m in got}) == 4  # spread over the topic's queues
    for i, row in enumerate(rows):
        m = by_idx[str(i)]
        assert m.body == row["body"]
        assert m.tags == row["tags"]
        assert m.keys == row["keys"]
        assert m.properties["kind"] == "test"
        assert IDEMPOTENT_KEY_PROPERTY not in m.properties


@pytest.mark.integration
def test_queue_id_column_keeps_row_order_and_topic_column(module_cluster: LocalCluster) -> None:
    namesrv = module_cluster.namesrv_addr
    t1, t2 = _topic("SinkQ1"), _topic("SinkQ2")
    _create_topic(namesrv, t1)
    _create_topic(namesrv, t2)
    schema = pa.schema([("topic", pa.string()), ("body", pa.string()), ("queueId", pa.int32())])
    rows = [
        {"topic": (t1, t2)[i % 2], "body": f"m{i}", "queueId": (i // 2) % 3} for i in range(600)
    ]
    spark_schema = StructType(
        [
            StructField("topic", StringType()),
            StructField("body", StringType()),
            StructField("queueId", IntegerType()),
        ]
    )
    writer = RocketMQWriter(spark_schema, {"namesrv": namesrv, "batchSize": "16"})
    assert writer.write(iter(_batches(rows, 64, schema))).messages == 600
    for topic in (t1, t2):
        got = read_all(namesrv, topic, 300)
        assert len(got) == 300
        for q in range(3):
            in_queue = [m.body.decode() for mq, m in got if mq.queueId == q]
            want = [r["body"] for r in rows if r["topic"] == topic and r["queueId"] == q]
            assert in_queue == want  # same order as the rows
        assert not [m for mq, m in got if mq.queueId == 3]


@pytest.mark.integration
def test_idempotent_keys_are_unique_and_repeat_on_a_retried_task(
    module_cluster: LocalCluster,
) -> None:
    namesrv = module_cluster.namesrv_addr
    topic = _topic("SinkIdem")
    _create_topic(namesrv, topic)
    rows = _rows(300)
    writer = RocketMQWriter(SCHEMA, {"namesrv": namesrv, "topic": topic, "idempotentKeys": "true"})
    writer.write(iter(_batches(rows, 128)))
    writer.write(iter(_batches(rows, 50)))  # a retried task: same rows, other batching
    got = read_all(namesrv, topic, 600)
    assert len(got) == 600  # at-least-once: the retry sent everything again
    keys = Counter(m.properties[IDEMPOTENT_KEY_PROPERTY] for _mq, m in got)
    assert len(keys) == 300 and set(keys.values()) == {2}
    for _mq, m in got:
        job, kind, partition, seq = m.properties[IDEMPOTENT_KEY_PROPERTY].split(":")
        assert (job, kind, partition) == (writer.job_id, "batch", "0")
        assert m.properties["idx"] == seq  # the key names the row


@pytest.mark.integration
def test_failures_fail_the_task_with_a_clear_message(module_cluster: LocalCluster) -> None:
    namesrv = module_cluster.namesrv_addr
    topic = _topic("SinkBad")
    _create_topic(namesrv, topic, queues=2)
    schema = pa.schema([("body", pa.binary()), ("queueId", pa.int32())])
    spark_schema = StructType(
        [StructField("body", BinaryType()), StructField("queueId", IntegerType())]
    )
    writer = RocketMQWriter(spark_schema, {"namesrv": namesrv, "topic": topic})
    rows = [{"body": b"ok", "queueId": 0}, {"body": b"x", "queueId": 9}]
    with pytest.raises(SinkWriteError, match=f"topic {topic} has no queue 9"):
        writer.write(iter(_batches(rows, 10, schema)))
    with pytest.raises(SinkWriteError, match="column body is null in row 1"):
        writer.write(iter(_batches([{"body": b"a", "queueId": 0}, {"body": None}], 10, schema)))
    huge = [{"body": b"z" * (4 * 1024 * 1024), "queueId": 1}]
    with pytest.raises(SinkWriteError, match="exceeds the broker's 4194304-byte limit"):
        writer.write(iter(_batches(huge, 1, schema)))
    # a read-only topic has no writable queue in its route: refused before any send, as Java's
    # producer refuses it (No route info of this topic), with the topic named
    ro = _topic("SinkReadOnly")
    _create_topic(namesrv, ro, queues=1, perm=4)
    ro_writer = RocketMQWriter(spark_schema, {"namesrv": namesrv, "topic": ro, "timeout": "3"})
    with pytest.raises(SinkWriteError, match=f"topic {ro} has no writable queue"):
        ro_writer.write(iter(_batches([{"body": b"a", "queueId": 0}], 1, schema)))


# --- through Spark -----------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.integration
def test_spark_write_then_consumer_reads_back(
    spark: SparkSession, module_cluster: LocalCluster
) -> None:
    namesrv = module_cluster.namesrv_addr
    topic = _topic("SparkSink")
    _create_topic(namesrv, topic)
    n = 5000
    df = (
        spark.range(n)
        .selectExpr(
            "cast(concat('order-', id) as binary) as body",
            "concat('T', id % 3) as tags",
            "concat('k', id) as keys",
            "map('idx', cast(id as string)) as properties",
            "'ignored' as other",
        )
        .repartition(3)
    )
    (
        df.write.format("rocketmq")
        .option("namesrv", namesrv)
        .option("topic", topic)
        .option("idempotentKeys", "true")
        .mode("append")
        .save()
    )
    got = read_all(namesrv, topic, n)
    assert len(got) == n
    seen = {}
    for _mq, m in got:
        i = int(m.properties["idx"])
        assert m.body == f"order-{i}".encode()
        assert (m.tags, m.keys) == (f"T{i % 3}", f"k{i}")
        seen[i] = m.properties[IDEMPOTENT_KEY_PROPERTY]
    assert sorted(seen) == list(range(n))
    assert len(set(seen.values())) == n
    jobs = {k.split(":")[0] for k in seen.values()}
    partitions = {k.split(":")[2] for k in seen.values()}
    assert len(jobs) == 1 and partitions == {"0", "1", "2"}


@pytest.mark.spark
@pytest.mark.integration
def test_spark_write_stream_available_now(
    spark: SparkSession, module_cluster: LocalCluster, tmp_path: Path
) -> None:
    namesrv = module_cluster.namesrv_addr
    topic = _topic("SparkStreamSink")
    _create_topic(namesrv, topic)
    src = tmp_path / "in"
    src.mkdir()
    for f in range(3):
        (src / f"part{f}.json").write_text(
            "".join(
                json.dumps({"id": f * 100 + i, "v": f"v{f * 100 + i}"}) + "\n" for i in range(100)
            )
        )
    stream = (
        spark.readStream.schema("id long, v string")
        .option("maxFilesPerTrigger", 1)
        .json(str(src))
        .selectExpr("v as body", "cast(id as string) as keys")
    )
    query = (
        stream.writeStream.format("rocketmq")
        .option("namesrv", namesrv)
        .option("topic", topic)
        .option("idempotentKeys", "true")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    got = read_all(namesrv, topic, 300)
    assert sorted(int(m.keys or -1) for _mq, m in got) == list(range(300))
    assert all(m.body.decode() == f"v{m.keys}" for _mq, m in got)
    ids = [m.properties[IDEMPOTENT_KEY_PROPERTY].split(":") for _mq, m in got]
    assert {i[0] for i in ids} == {str(query.id)}
    assert {i[1] for i in ids} == {"0", "1", "2"}  # one file per micro-batch
    assert len({tuple(i) for i in ids}) == 300


@pytest.mark.spark
def test_spark_write_without_namesrv_fails_naming_the_option(spark: SparkSession) -> None:
    df = spark.range(3).selectExpr("cast(id as string) as body")
    with pytest.raises(Exception, match="namesrv"):
        df.write.format("rocketmq").option("topic", "t").mode("append").save()
    with pytest.raises(Exception, match="no body column"):
        spark.range(3).write.format("rocketmq").option("namesrv", "h:1").option("topic", "t").mode(
            "append"
        ).save()
