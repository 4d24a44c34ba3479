"""The rocketmq-store source: segment files of a real broker decode into the live read's rows."""

from __future__ import annotations

import os
import shutil
import struct
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


# ------------------------------------------------------------------ RocketMQ's DLedger layout
# Stores built byte by byte as Apache RocketMQ 4.9 writes them in DLedger mode
# (tests/broker/dledger/apache_store_fixture.py), a classic store switched to DLedger, and the
# broker's own Raft log: read by pipeline.dledger_segments without Spark, then once by Spark.

DL_FILE = 8 * 1024
DL_QUEUES = [("TopicA", 0), ("TopicA", 1), ("TopicB", 0), ("TopicC", 3)]


def dledger_store(root, n, *, classic=0, tail=0, data_dir=None):
    from tests.broker.dledger.apache_store_fixture import ApacheDLedgerStore

    store = ApacheDLedgerStore(root, file_size=DL_FILE, data_dir=data_dir)
    for i in range(classic + n):
        topic, qid = DL_QUEUES[i % len(DL_QUEUES)]
        body = bytes([i % 251]) * (40 + (i * 97) % 900)
        send = store.send_classic if i < classic else store.send
        send(topic, qid, body, tags=f"t{i % 3}")
        if i == classic + n // 2:
            store.new_term()
    for _ in range(tail):
        store.send("TopicA", 0, b"uncommitted", commit=False)
    store.close()
    return store


def read_store(root, max_bytes, **kw):
    from pipeline.store_source import plan_store, read_store_range

    batches = []
    for part in plan_store(root, max_bytes, **kw):
        batches += list(read_store_range(part, broker_name="b", batch_size=7))
    return pa.Table.from_batches(batches).to_pylist() if batches else []


def _row(r):
    return (r["topic"], r["queueId"], r["queueOffset"], r["body"], r["msgId"], r["tags"], r["keys"])


def expected_rows(root, **kw):
    """What the broker's reader serves by queue offset, in CommitLog order, as rows."""
    from broker.dledger.broker.dledger_commitlog import find_dledger_store, open_dledger_commitlog

    paths = find_dledger_store(root, **kw)
    assert paths is not None
    reader = open_dledger_commitlog(paths)
    try:
        out = []
        for m in reader.committed_messages():
            props = m.properties
            got = reader.message(m.topic, m.queue_id, m.queue_offset)
            assert got.commit_log_offset == m.commit_log_offset
            out.append(
                (
                    m.topic,
                    m.queue_id,
                    m.queue_offset,
                    m.body,
                    props.get("UNIQ_KEY") or m.msg_id,
                    props.get("TAGS"),
                    props.get("KEYS"),
                )
            )
        return out
    finally:
        reader.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("max_bytes", [DL_FILE, 1000, 333])
def test_dledger_store_ranges_read_each_committed_record_once(tmp_path, max_bytes):
    from pipeline.store_source import plan_store

    store = dledger_store(tmp_path / "broker-d", 60, tail=3)
    rows = [_row(r) for r in read_store(tmp_path / "broker-d", max_bytes)]
    committed = store.committed()
    assert len(rows) == len(committed) == 60
    assert rows == expected_rows(tmp_path / "broker-d")
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        (s.topic, s.queue_id, s.queue_offset, s.body) for s in committed
    ]
    files = len(os.listdir(store.dledger_data_dir))
    assert files > 4  # blanks closed files
    parts = plan_store(tmp_path / "broker-d", max_bytes)
    assert len(parts) >= files and (max_bytes == DL_FILE or len(parts) > files)
    # no range starts at or past the committed position (the uncommitted tail's file or bytes)
    end = committed[-1].offset + committed[-1].size
    assert max(p.file_from_offset + p.lo for p in parts) < end
    assert max(p.file_from_offset + p.hi for p in parts) == end
    # the member directory names the same store
    assert [_row(r) for r in read_store(tmp_path / "broker-d" / "dledger-n0", max_bytes)] == rows


@pytest.mark.timeout(120)
def test_a_switched_classic_store_reads_both_sides_and_never_above_the_division(tmp_path):
    store = dledger_store(tmp_path / "s", 30, classic=25)
    divided = store.divided_commitlog_offset
    (tmp_path / "s" / "commitlog" / f"{divided:020d}").write_bytes(b"\xff" * DL_FILE)
    for max_bytes in (DL_FILE, 700):
        rows = [_row(r) for r in read_store(tmp_path / "s", max_bytes)]
        assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
            (s.topic, s.queue_id, s.queue_offset, s.body) for s in store.sent
        ]
        assert rows == expected_rows(tmp_path / "s")
    # the commitlog/ path of such a store is the store
    assert len(read_store(tmp_path / "s" / "commitlog", DL_FILE)) == 55


@pytest.mark.timeout(120)
def test_store_path_dledger_commit_log_names_the_data_files(tmp_path):
    data = tmp_path / "elsewhere"
    dledger_store(tmp_path / "r", 20, data_dir=data)
    rows = read_store(tmp_path / "r", 1000, store_path_dledger_commit_log=str(data))
    assert [_row(r) for r in rows] == expected_rows(
        tmp_path / "r", store_path_dledger_commit_log=str(data)
    )
    assert len(rows) == 20


@pytest.mark.timeout(120)
def test_a_torn_entry_ends_its_files_rows(tmp_path):
    store = dledger_store(tmp_path / "t", 40)
    last = sorted(os.listdir(store.dledger_data_dir))[-1]
    in_last = [s for s in store.sent if s.offset - 48 >= int(last)]
    assert len(in_last) >= 3
    torn = in_last[1]
    with open(store.dledger_data_dir / last, "r+b") as f:
        f.seek(torn.offset - 48 - int(last) + 4)
        f.write(struct.pack(">i", 7))  # its size: no longer 48 + its body length
    rows = [_row(r)[3] for r in read_store(tmp_path / "t", DL_FILE)]
    assert rows == [s.body for s in store.sent if s.offset < torn.offset]


@pytest.mark.timeout(120)
def test_our_own_log_reads_with_no_ops_skipped_and_offset_msg_ids(tmp_path):
    """The broker's Raft log (FileLog with the append hook): no-op entries give no row, and a
    message without UNIQ_KEY has the offset msgId of pos + 48."""
    from broker.dledger.driver import entry_coder as ec
    from broker.dledger.driver.mmap_file_store import open_file_log
    from broker.dledger.driver.state_files import Checkpoint, save_checkpoint
    from common.message_id import create_offset_msg_id

    member = tmp_path / "ours" / "dledger-n1"
    flog = open_file_log(
        str(member), data_file_size=DL_FILE, index_file_size=32 * 64, patch_physical_offset=True
    )
    host = ("10.1.1.1", 10911)
    want = []
    flog.append(1, ec.NOOP_RECORD)
    for i in range(25):
        m = MessageExtBrokerInner(
            topic="T", queue_id=i % 2, body=bytes([i]) * (100 + 31 * i), store_host=host
        )
        entry = flog.append(1 + i // 10, encode_record(m, i // 2, 0, 1_700_000_000_000 + i))
        want.append((i % 2, i // 2, m.body, create_offset_msg_id(host, entry.pos + 48)))
        if i in (9, 19):
            flog.append(2 + i // 10, b"")  # an empty no-op, as the simulator's
    flog.append(4, ec.NOOP_RECORD)
    late = MessageExtBrokerInner(topic="T", queue_id=0, body=b"not yet", store_host=host)
    flog.append(4, encode_record(late, 99, 0, 1))
    flog.close()
    save_checkpoint(str(member), Checkpoint(end_index=29, committed_index=28))
    for max_bytes in (DL_FILE, 500):
        rows = read_store(tmp_path / "ours", max_bytes)
        assert [(r["queueId"], r["queueOffset"], r["body"], r["msgId"]) for r in rows] == want
        assert {r["brokerName"] for r in rows} == {"b"}


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_spark_reads_dledger_layout_stores_as_the_reading_layer_does(spark, tmp_path):
    """One Spark read (each costs seconds of a shared 2-core CI box) of a classic store
    switched to DLedger, in byte ranges: its classic segments and its DLedger data files give
    the rows the broker's reader serves."""
    store = dledger_store(tmp_path / "broker-s", 40, classic=25, tail=2)
    df = (
        spark.read.format("rocketmq-store")
        .option("maxBytesPerPartition", "1000")
        .load(str(tmp_path / "broker-s"))
    )
    assert df.rdd.getNumPartitions() > len(os.listdir(store.dledger_data_dir)) + 2
    rows = df.toArrow().to_pylist()
    assert [_row(r) for r in rows] == expected_rows(tmp_path / "broker-s")
    assert len(rows) == 65 and {r["brokerName"] for r in rows} == {"broker-s"}
