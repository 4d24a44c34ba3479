"""Spark pipeline throughput: batch read from a live broker, from store files, and the sink.

    .venv/bin/python bench/run_spark_bench.py --count 1000000 --runs 3 [--json]

Theory of operation: starts one `rmq up --slaves 0` (a lone master, so replication does not
count) whose broker.conf raises maxTransferCountOnMessageInMemory / maxTransferBytesOnMessage-
InMemory so one pull can carry 1024 messages (the broker's defaults cap a pull at 32 messages /
256 KiB, which would measure round trips, not decoding). It fills a 4-queue topic with `--count`
100-byte messages through concurrent `send_batch` calls, then per run measures:

* spark-live: `spark.read.format("rocketmq")...load().count()` over the topic (local[2]);
  the source builds every column (no column pruning), so count() pays for the full decode;
* raw-pull: the same messages through `rmq.sync.PullConsumer` without Spark (one thread);
* spark-store: `spark.read.format("rocketmq-store").load(store).count()`;
* raw-decode: `pipeline.record_batch.decode_records` over the mapped segment files, no Spark;
* spark-sink: `spark.range(n)` as 100-byte bodies written with the rocketmq sink.

Each figure is messages / wall-clock second of that step; min/median/max over `--runs`.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from bench.cluster import start_cluster  # noqa: E402

BROKER_CONF = {
    "maxTransferCountOnMessageInMemory": 1024,
    "maxTransferBytesOnMessageInMemory": 8 * 1024 * 1024,
}
BODY = 100


def fill(namesrv: str, topic: str, count: int) -> float:
    import trio

    from rmq import Admin, Message, Producer

    async def main() -> None:
        async with Admin(namesrv) as admin:
            await admin.create_topic(topic, queues=4)
        async with Producer("spark-bench-fill", namesrv) as producer:
            per = 256
            batches = count // per
            body = b"x" * BODY

            async def worker(k: int) -> None:
                for _b in range(k, batches, 8):
                    await producer.send_batch([Message(topic, body) for _ in range(per)])

            async with trio.open_nursery() as nursery:
                for k in range(8):
                    nursery.start_soon(worker, k)

    t = time.perf_counter()
    trio.run(main)
    return time.perf_counter() - t


def raw_pull(namesrv: str, topic: str) -> int:
    from rmq.sync import PullConsumer

    n = 0
    with PullConsumer("spark-bench-raw", namesrv) as consumer:
        for mq in consumer.fetch_queues(topic):
            offset = 0
            while True:
                result = consumer.pull(mq, offset, 1024)
                if not result.messages:
                    break
                n += len(result.messages)
                offset = result.next_begin_offset
    return n


def raw_decode(store: Path) -> int:
    from pipeline.record_batch import decode_records

    n = 0
    for seg in sorted((store / "commitlog").iterdir()):
        with open(seg, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            from broker.store.commitlog_scan import scan_segment

            scan = scan_segment(m, int(seg.name))
            n += decode_records(m, broker_name="broker-a", starts=scan.starts).num_rows
    return n


def timed(fn) -> tuple[float, int]:
    t = time.perf_counter()
    n = fn()
    return time.perf_counter() - t, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--sink-count", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="spark-bench-") as tmp:
        conf = Path(tmp) / "cluster.toml"
        conf.write_text(
            "[broker_conf]\n" + "".join(f"{k} = {v}\n" for k, v in BROKER_CONF.items())
        )
        data = Path(tmp) / "rmq"
        with start_cluster(data, "--slaves", "0", "--config", str(conf), brokers=1) as cluster:
            namesrv = cluster.namesrv_addr
            topic = "SparkBench"
            fill_s = fill(namesrv, topic, args.count)
            total = args.count // 256 * 256
            print(f"filled {total} msgs in {fill_s:.1f}s", file=sys.stderr)

            from pyspark.sql import SparkSession

            import pipeline

            spark = (
                SparkSession.builder.master("local[2]")
                .config("spark.ui.enabled", "false")
                .config("spark.driver.memory", "2g")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            pipeline.register(spark)
            store = data / "broker-a"
            steps = {
                "spark-live": lambda: spark.read.format("rocketmq")
                .option("namesrv", namesrv)
                .option("topic", topic)
                .load()
                .count(),
                "raw-pull": lambda: raw_pull(namesrv, topic),
                "spark-store": lambda: spark.read.format("rocketmq-store")
                .load(str(store))
                .where(f"topic = '{topic}'")
                .count(),
                "raw-decode": lambda: raw_decode(store),
                "spark-sink": lambda: spark.range(args.sink_count)
                .selectExpr(f"cast(repeat('y', {BODY}) as binary) as body")
                .write.format("rocketmq")
                .option("namesrv", namesrv)
                .option("topic", "SparkBenchSink")
                .mode("append")
                .save()
                or args.sink_count,
            }
            steps["spark-live"]()  # warm-up: Python workers, first query planning
            results: dict[str, list[float]] = {k: [] for k in steps}
            counts: dict[str, int] = {}
            for run in range(args.runs):
                for name, fn in steps.items():
                    secs, n = timed(fn)
                    counts[name] = n
                    results[name].append(n / secs)
                    print(f"run {run} {name}: {n} msgs {secs:.2f}s {n / secs:,.0f}/s",
                          file=sys.stderr)  # fmt: skip
            spark.stop()
    report = {
        "machine": f"{platform.platform()} {os.cpu_count()} cpus, Python {platform.python_version()}",
        "count": total,
        "results": {
            k: {
                "msgs": counts[k],
                "min": min(v),
                "median": statistics.median(v),
                "max": max(v),
            }
            for k, v in results.items()
        },
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for k, r in report["results"].items():
            print(f"{k:12} {r['msgs']:>9} msgs  min {r['min']:>12,.0f}  median "
                  f"{r['median']:>12,.0f}  max {r['max']:>12,.0f} msg/s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
