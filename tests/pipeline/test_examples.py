"""examples/spark_pipeline.py against a real cluster: the per-minute stream (availableNow) writes
the right aggregates to Parquet and to the output topic; the backfill reads the broker's store
files into Parquet."""

from __future__ import annotations

import os
import sys

# Spark's Python workers run `python3` from PATH unless told; it must be this interpreter
# (the venv with the project and pyarrow). Read when the shared session starts, after import.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import calendar
import importlib.util
import json
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from rmq.sync import Admin, PullConsumer

ROOT = Path(__file__).resolve().parents[2]
START_MS = 1_700_000_040_000  # a whole minute (UTC)
COUNT = 300
STEP_MS = 1000  # 5 minutes of orders


def _example():
    spec = importlib.util.spec_from_file_location(
        "spark_pipeline_example", ROOT / "examples" / "spark_pipeline.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read_topic(namesrv: str, topic: str, expected: int, timeout: float = 30.0) -> list:
    deadline = time.monotonic() + timeout
    with PullConsumer("example-test-reader", namesrv) as consumer:
        while True:
            msgs = []
            for mq in consumer.fetch_queues(topic):
                offset = 0
                while result := consumer.pull(mq, offset, 1024).messages:
                    msgs.extend(result)
                    offset += len(result)
            if len(msgs) >= expected or time.monotonic() > deadline:
                return msgs
            time.sleep(0.2)


def _assert_close(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected)
    for minute, want in expected.items():
        assert got[minute] == pytest.approx(want), minute


@pytest.fixture(scope="module")
def orders(module_cluster):
    """COUNT sample orders in a fresh topic of the module's cluster: (topic, events)."""
    example = _example()
    topic = f"Orders_{uuid.uuid4().hex[:8]}"
    with Admin(module_cluster.namesrv_addr) as admin:
        admin.create_topic(topic, queues=4)
    events = example.order_events(COUNT, start_ms=START_MS, step_ms=STEP_MS)
    assert example.generate(module_cluster.namesrv_addr, topic, events, batch=64) == COUNT
    return topic, events


@pytest.mark.spark
@pytest.mark.integration
def test_stream_aggregates_per_minute_to_parquet_and_topic(spark, module_cluster, tmp_path):
    example = _example()
    namesrv = module_cluster.namesrv_addr
    topic, out_topic = f"OrdersS_{uuid.uuid4().hex[:8]}", f"PerMinute_{uuid.uuid4().hex[:8]}"
    with Admin(namesrv) as admin:
        admin.create_topic(topic, queues=4)
        admin.create_topic(out_topic, queues=2)
    events = example.order_events(COUNT, start_ms=START_MS, step_ms=STEP_MS)
    example.generate(namesrv, topic, events, batch=64)

    def run_once() -> None:
        query = example.run_stream(
            spark, namesrv=namesrv, topic=topic, out_topic=out_topic, out=str(tmp_path)
        )
        query.awaitTermination(180)
        assert query.exception() is None

    # A late event (below) ends the second run; the final watermark is its time - 1 minute and
    # every minute it passed is final and emitted exactly once (Spark runs a no-data
    # micro-batch after the last data batch to apply the new watermark).
    late = example.order_events(1, start_ms=START_MS + 400_000, seed=8)
    late[0]["order_id"] = "o-late"
    watermark = late[0]["ts"] - 60_000
    want: dict[int, list] = defaultdict(list)
    for e in events:
        minute = e["ts"] // 60_000 * 60_000
        if minute + 60_000 <= watermark:
            want[minute].append(e["amount"])
    assert len(want) >= 3
    expected = {m: (len(a), round(sum(a), 2), max(a)) for m, a in want.items()}

    def written() -> dict[int, tuple]:
        if not list((tmp_path / "aggregates").rglob("*.parquet")):
            return {}
        rows = spark.read.parquet(str(tmp_path / "aggregates")).collect()
        got = {
            int(r["minute"].timestamp() * 1000): (r["orders"], r["amount"], r["max_amount"])
            for r in rows
        }
        assert len(got) == len(rows)  # no minute twice
        return got

    # First run: availableNow reads the topic in maxOffsetsPerTrigger micro-batches, so the
    # watermark moves between them and the minutes it passed are already final and written;
    # whatever is written is final (never revised later).
    run_once()
    first = written()
    _assert_close(first, {m: expected[m] for m in first})
    # Later events arrive; the restarted query (same checkpoint) closes the remaining minutes
    # that the watermark passed, each exactly once.
    example.generate(namesrv, topic, late)
    run_once()

    got = written()
    _assert_close(got, expected)

    msgs = _read_topic(module_cluster.namesrv_addr, out_topic, len(expected))
    assert len(msgs) == len(expected)
    from_topic = {}
    for m in msgs:
        doc = json.loads(m.body)
        assert m.tags == "minute" and m.properties.get("pipelineKey")
        minute_ms = calendar.timegm(time.strptime(doc["minute"], "%Y-%m-%dT%H:%MZ")) * 1000
        from_topic[minute_ms] = (doc["orders"], doc["amount"], doc["max_amount"])
    _assert_close(from_topic, expected)


@pytest.mark.spark
@pytest.mark.integration
def test_backfill_from_store_files_to_parquet(spark, module_cluster, orders, tmp_path):
    example = _example()
    topic, events = orders
    store = module_cluster.data_dir / "broker-a"
    assert (store / "commitlog").is_dir()
    n = example.run_backfill(spark, store=str(store), topic=topic, out=str(tmp_path))
    assert n == COUNT
    df = spark.read.parquet(str(tmp_path / "backfill"))
    rows = {r["order_id"]: (r["amount"], r["ts"]) for r in df.collect()}
    assert rows == {e["order_id"]: (e["amount"], e["ts"]) for e in events}
    days = {str(r["day"]) for r in df.select("day").distinct().collect()}
    assert days == {"2023-11-14"}
