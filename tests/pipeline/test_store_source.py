"""The rocketmq-store source: segment files of a real broker decode into the live read's rows."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from broker.store.commitlog_scan import ScanEnd, scan_segment
from common.message import BLANK_MAGIC_CODE, MessageExtBrokerInner
from common.message_encoder import encode_record
from common.model import MessageQueue
from pipeline.store_source import (
    StoreSourceError,
    default_broker_name,
    list_segments,
    plan_ranges,
    read_range,
)
from rmq import Message
from rmq.sync import Admin, Producer, PullConsumer

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

SEG = 4096


def write_store(root, bodies_per_segment):
    """A store root with commitlog/ segments of SEG bytes: full ones end in BLANK filler."""
    d = root / "commitlog"
    d.mkdir(parents=True)
    phys = 0
    n = 0
    for k, count in enumerate(bodies_per_segment):
        buf = bytearray()
        for _ in range(count):
            m = MessageExtBrokerInner(
                topic="T", queue_id=n % 3, body=b"m%d" % n, properties={"TAGS": "t", "seq": str(n)}
            )
            buf += encode_record(m, n // 3, phys + len(buf), 1_700_000_000_000)
            n += 1
        assert len(buf) + 8 <= SEG
        if k < len(bodies_per_segment) - 1:
            rem = SEG - len(buf)
            buf += rem.to_bytes(4, "big") + BLANK_MAGIC_CODE.to_bytes(4, "big", signed=True)
        buf += bytes(SEG - len(buf))
        (d / f"{phys:020d}").write_bytes(buf)
        phys += SEG
    return n


def read_all(root, max_bytes, broker="b"):
    batches = []
    for part in plan_ranges(list_segments(root), max_bytes):
        batches += list(read_range(part, broker_name=broker, batch_size=7))
    return pa.Table.from_batches(batches).to_pylist() if batches else []


@pytest.mark.parametrize("max_bytes", [SEG, 1000, 333])
def test_ranges_read_every_record_once_skipping_blank_filler(tmp_path, max_bytes):
    n = write_store(tmp_path / "broker-x" / "store", [20, 20, 5])
    rows = read_all(tmp_path / "broker-x" / "store", max_bytes)
    assert [r["body"] for r in rows] == [b"m%d" % i for i in range(n)]
    assert [dict(r["properties"])["seq"] for r in rows] == [str(i) for i in range(n)]
    assert {r["brokerName"] for r in rows} == {"b"}


def test_torn_tail_stops_cleanly(tmp_path):
    root = tmp_path / "store"
    n = write_store(root, [20, 10])
    last = root / "commitlog" / f"{SEG:020d}"
    data = last.read_bytes()
    starts = scan_segment(data, SEG).starts.tolist()
    last.write_bytes(data[: starts[-1] + 30])  # mid-record
    rows = read_all(root, SEG)
    assert [r["body"] for r in rows] == [b"m%d" % i for i in range(n - 1)]


def test_paths_and_broker_name(tmp_path):
    write_store(tmp_path / "broker-q" / "store", [1])
    assert default_broker_name(tmp_path / "broker-q" / "store") == "broker-q"
    assert default_broker_name(tmp_path / "broker-q" / "store" / "commitlog") == "broker-q"
    assert len(list_segments(tmp_path / "broker-q" / "store" / "commitlog")) == 1
    with pytest.raises(StoreSourceError, match="not a directory"):
        list_segments(tmp_path / "nope")


# ------------------------------------------------------------------------------- real broker


def _produce(ns, topic, n):
    with Admin(ns) as admin:
        admin.create_topic(topic, queues=4)
        deadline = time.monotonic() + 20
        while True:
            try:
                admin.topic_route(topic)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    with Producer("store-src-pg", ns) as producer:
        for start in range(0, n, 100):
            msgs = [
                Message(
                    topic,
                    f"body-{i}".encode() * (1 + i % 5),
                    tags=f"Tag{i % 3}",
                    keys=f"key{i}",
                    properties={"seq": str(i), "ü": "ß"},
                )
                for i in range(start, start + 100)
            ]
            producer.send_batch(msgs, queue=MessageQueue(topic, "broker-a", (start // 100) % 4))
        producer.send(Message(topic, b"single", tags="S", keys="k-single"))


def _pull_all(ns, topic):
    rows = []
    with PullConsumer("store-src-cg", ns) as consumer:
        for mq in consumer.fetch_queues(topic):
            offset = 0
            while True:
                res = consumer.pull(mq, offset, 32)
                if not res.messages:
                    break
                for m in res.messages:
                    rows.append(
                        (
                            m.topic,
                            mq.brokerName,
                            m.queue_id,
                            m.queue_offset,
                            m.body,
                            m.tags,
                            m.keys,
                            m.properties,
                            m.uniq_key,
                            m.born_timestamp,
                            m.store_timestamp,
                            m.reconsume_times,
                        )
                    )
                offset = res.next_begin_offset
    return sorted(rows, key=lambda r: (r[2], r[3]))


def _spark_rows(df, topic):
    out = []
    for r in df.where(df.topic == topic).toArrow().to_pylist():
        out.append(
            (
                r["topic"],
                r["brokerName"],
                r["queueId"],
                r["queueOffset"],
                r["body"],
                r["tags"],
                r["keys"],
                dict(r["properties"]),
                r["msgId"],
                round(r["bornTimestamp"].timestamp() * 1000),
                round(r["storeTimestamp"].timestamp() * 1000),
                r["reconsumeTimes"],
            )
        )
    return sorted(out, key=lambda r: (r[2], r[3]))


@pytest.mark.spark
@pytest.mark.integration
def test_store_reader_decodes_a_brokers_segments_into_the_live_rows(
    spark, cluster_runner, tmp_path
):
    conf = tmp_path / "cluster.toml"
    conf.write_text("slaves = 0\nmasters = 1\n[broker_conf]\nmappedFileSizeCommitLog = 65536\n")
    topic = "StoreSourceTopic"
    n = 1200
    with cluster_runner(tmp_path / "rmq", "--config", str(conf)) as cluster:
        _produce(cluster.namesrv_addr, topic, n)
        live = _pull_all(cluster.namesrv_addr, topic)
        # the live Spark source reads the same rows as the client
        live_spark = _spark_rows(
            spark.read.format("rocketmq")
            .option("namesrv", cluster.namesrv_addr)
            .option("topic", topic)
            .load(),
            topic,
        )
    assert len(live) == n + 1
    assert live_spark == live
    (store,) = {p.parent for p in (tmp_path / "rmq").rglob("commitlog") if p.is_dir()}
    segments = list_segments(store)
    assert len(segments) >= 4, segments  # several segments, each full one ends in BLANK
    ends = [scan_segment(Path(p).read_bytes(), off).reason for p, off, _ in segments]
    assert ends[:-1] == [ScanEnd.BLANK] * (len(segments) - 1)

    df = spark.read.format("rocketmq-store").option("brokerName", "broker-a").load(str(store))
    assert df.columns == list(spark.read.format("rocketmq-store").load(str(store)).columns)
    got = _spark_rows(df, topic)
    assert got == live
    # byte ranges smaller than a segment find the same rows
    ranged = (
        spark.read.format("rocketmq-store")
        .option("brokerName", "broker-a")
        .option("maxBytesPerPartition", "20000")
        .load(str(store))
    )
    assert ranged.rdd.getNumPartitions() > len(segments)
    assert _spark_rows(ranged, topic) == live

    # a torn copy of the last non-empty segment: everything before the torn record, nothing after
    copy = tmp_path / "copy" / "store"
    shutil.copytree(store / "commitlog", copy / "commitlog")
    path, off, _ = [
        s for s in list_segments(copy) if scan_segment(Path(s[0]).read_bytes(), s[1]).count
    ][-1]
    data = Path(path).read_bytes()
    starts = scan_segment(data, off).starts.tolist()
    with open(path, "r+b") as f:
        f.truncate(starts[-3] + 40)
    torn = _spark_rows(
        spark.read.format("rocketmq-store").option("brokerName", "broker-a").load(str(copy)), topic
    )
    lost = {
        (int.from_bytes(data[s + 12 : s + 16], "big"), int.from_bytes(data[s + 20 : s + 28], "big"))
        for s in starts[-3:]
    }
    assert torn == [r for r in live if (r[2], r[3]) not in lost]
    assert len(torn) == len(live) - 3
