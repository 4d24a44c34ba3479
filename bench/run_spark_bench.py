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
* spark-sink: `spark.range(n)` as 100-byte bodies written with the rocketmq sink;
* spark-ceiling: what Spark itself can take from a Python data source with our schema: a
  throwaway source yields one prebuilt 64k-row Arrow batch of ``pipeline.schema.arrow_schema()``
  (100-byte bodies, the 4 producer properties per row) over and over, read into
  ``write.format("noop")``; ``spark-ceiling-nomap`` is the same with an empty properties map.
  No decoding, no I/O: no Spark source of ours can beat these on this machine.
* spark-live-8p: spark-live with ``maxOffsetsPerPartition`` set so there are 8 partitions.

For spark-live the broker's CPU seconds (utime + stime from /proc) are reported per run too:
a broker near one full core while Spark waits means the live path is bound by serving pulls;
"machine busy" (all CPUs, from /proc/stat) near 100% means the step is bound by the CPUs the
broker, the JVM and the Python workers share.  ``--steps a,b`` runs only those steps.
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
from collections.abc import Callable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from bench.cluster import start_cluster  # noqa: E402

BROKER_CONF = {
    "maxTransferCountOnMessageInMemory": 1024,
    "maxTransferBytesOnMessageInMemory": 8 * 1024 * 1024,
    # 64 MiB CommitLog segments: 1 M records of ~270 bytes span several files (the store
    # source reads one partition per segment)
    "mappedFileSizeCommitLog": 64 * 1024 * 1024,
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
                # TAGS + KEYS (+ the UNIQ_KEY and WAIT the producer adds): 4 properties, the
                # shape of the spark-ceiling batch
                for b in range(k, batches, 8):
                    await producer.send_batch(
                        [
                            Message(topic, body, tags="a", keys=f"k{b * per + i:07d}")
                            for i in range(per)
                        ]
                    )

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

            # the scan takes a buffer view, released before the map is closed
            with memoryview(m) as view:
                scan = scan_segment(view, int(seg.name))
            n += decode_records(m, broker_name="broker-a", starts=scan.starts).num_rows
    return n


CEILING_ROWS = 65536


def ceiling_source():
    """The throwaway "spark-ceiling" data source (defined here so cloudpickle ships it by value)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class CeilingReader(DataSourceReader):
        def __init__(self, options: Mapping[str, str]) -> None:
            self.batches = int(options.get("batches", "16"))
            self.empty_map = options.get("emptyMap", "false") == "true"

        def partitions(self):
            return [InputPartition(i) for i in range(2)]

        def read(self, partition):
            import numpy as np
            import pyarrow as pa

            from pipeline.schema import arrow_schema

            n = CEILING_ROWS
            ts_type = pa.timestamp("us", tz="UTC")

            def fixed(width: int, data: np.ndarray, kind: pa.DataType | None = None) -> pa.Array:
                kind = kind or pa.string()
                off = np.arange(0, width * n + 1, width, dtype=np.int32)
                return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(off), pa.py_buffer(data)])

            def texts(prefix: bytes, digits: int) -> np.ndarray:
                # prefix + the row number in `digits` decimal digits, built without a Python loop
                i = np.arange(n, dtype=np.int64)[:, None]
                num = (i // 10 ** np.arange(digits - 1, -1, -1)) % 10 + 48
                head = np.broadcast_to(np.frombuffer(prefix, np.uint8), (n, len(prefix)))
                return np.hstack([head, num.astype(np.uint8)])

            ids = texts(b"AC11000100002A9F0000000000", 6)  # 32 bytes, like a UNIQ_KEY
            keys = texts(b"k", 7)  # 8 bytes
            if self.empty_map:
                props = pa.MapArray.from_arrays(
                    pa.array(np.zeros(n + 1, np.int32)),
                    pa.array([], pa.string()),
                    pa.array([], pa.string()),
                )
            else:
                # TAGS=a KEYS=k... UNIQ_KEY=AC... WAIT=true: 4 entries per row
                names = np.tile(np.frombuffer(b"TAGSKEYSUNIQ_KEYWAIT", np.uint8), n)
                name_len = np.tile([4, 4, 8, 4], n)
                values = np.hstack(
                    [
                        np.full((n, 1), ord("a"), np.uint8),
                        keys,
                        ids,
                        np.broadcast_to(np.frombuffer(b"true", np.uint8), (n, 4)),
                    ]
                ).ravel()
                value_len = np.tile([1, 8, 32, 4], n)

                def strings(lengths, data):
                    off = np.zeros(len(lengths) + 1, dtype=np.int32)
                    np.cumsum(lengths, out=off[1:])
                    return pa.Array.from_buffers(
                        pa.string(), len(lengths), [None, pa.py_buffer(off), pa.py_buffer(data)]
                    )

                props = pa.MapArray.from_arrays(
                    pa.array(np.arange(0, 4 * n + 1, 4, dtype=np.int32)),
                    strings(name_len, names),
                    strings(value_len, values),
                )
            ts = pa.array(np.full(n, 1_700_000_000_000_000), ts_type)
            batch = pa.RecordBatch.from_arrays(
                [
                    fixed(10, np.tile(np.frombuffer(b"SparkBench", np.uint8), n)),
                    fixed(8, np.tile(np.frombuffer(b"broker-a", np.uint8), n)),
                    pa.array(np.zeros(n, np.int32)),
                    pa.array(np.arange(n, dtype=np.int64)),
                    fixed(BODY, np.full(BODY * n, ord("x"), np.uint8), pa.binary()),
                    fixed(1, np.full(n, ord("a"), np.uint8)),
                    fixed(8, keys.ravel()),
                    props,
                    fixed(32, ids.ravel()),
                    ts,
                    ts,
                    pa.array(np.zeros(n, np.int32)),
                ],
                schema=arrow_schema(),
            )
            for _ in range(self.batches):
                yield batch

    class Ceiling(DataSource):
        @classmethod
        def name(cls) -> str:
            return "spark-ceiling"

        def schema(self) -> str:
            from pipeline.schema import SPARK_SCHEMA_DDL

            return SPARK_SCHEMA_DDL

        def reader(self, schema):
            return CeilingReader(self.options)

    return Ceiling


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    vals = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = vals[3] + vals[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(vals) - idle) / tick, sum(vals) / tick


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    t = time.perf_counter()
    n = fn()
    return time.perf_counter() - t, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--sink-count", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", default="", help="comma list of steps to run (default: all)")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="spark-bench-") as tmp:
        conf = Path(tmp) / "cluster.toml"
        conf.write_text("[broker_conf]\n" + "".join(f"{k} = {v}\n" for k, v in BROKER_CONF.items()))
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
            spark.dataSource.register(ceiling_source())
            store = data / "broker-a"
            ceiling_batches = max(total // (2 * CEILING_ROWS), 1)

            def ceiling(empty_map: bool) -> int:
                spark.read.format("spark-ceiling").option("batches", ceiling_batches).option(
                    "emptyMap", str(empty_map).lower()
                ).load().write.format("noop").mode("overwrite").save()
                return 2 * ceiling_batches * CEILING_ROWS

            def live(partitions: int | None = None) -> int:
                reader = spark.read.format("rocketmq").option("namesrv", namesrv)
                if partitions:
                    per = -(-total // partitions)
                    reader = reader.option("maxOffsetsPerPartition", per)
                return reader.option("topic", topic).load().count()

            broker_pid = cluster.broker_pid

            def sink() -> int:
                (
                    spark.range(args.sink_count)
                    .selectExpr(f"cast(repeat('y', {BODY}) as binary) as body")
                    .write.format("rocketmq")
                    .option("namesrv", namesrv)
                    .option("topic", "SparkBenchSink")
                    .mode("append")
                    .save()
                )
                return int(args.sink_count)

            steps: dict[str, Callable[[], int]] = {
                "spark-ceiling": lambda: ceiling(False),
                "spark-ceiling-nomap": lambda: ceiling(True),
                "spark-live": live,
                "spark-live-8p": lambda: live(8),
                "raw-pull": lambda: raw_pull(namesrv, topic),
                "spark-store": lambda: (
                    spark.read.format("rocketmq-store")
                    .load(str(store))
                    .where(f"topic = '{topic}'")
                    .count()
                ),
                "raw-decode": lambda: raw_decode(store),
                "spark-sink": sink,
            }
            steps["spark-live"]()  # warm-up: Python workers, first query planning
            steps["spark-ceiling"]()
            if args.steps:
                steps = {k: v for k, v in steps.items() if k in args.steps.split(",")}
            results: dict[str, list[float]] = {k: [] for k in steps}
            broker_cpu: dict[str, list[float]] = {k: [] for k in steps}
            machine: dict[str, list[float]] = {k: [] for k in steps}
            counts: dict[str, int] = {}
            loads = []
            for run in range(args.runs):
                for name, fn in steps.items():
                    cpu0 = cpu_seconds(broker_pid)
                    busy0, all0 = machine_busy()
                    secs, n = timed(fn)
                    cpu = (cpu_seconds(broker_pid) - cpu0) / secs
                    busy1, all1 = machine_busy()
                    busy = (busy1 - busy0) / max(all1 - all0, 1e-9)
                    machine[name].append(busy)
                    counts[name] = n
                    results[name].append(n / secs)
                    broker_cpu[name].append(cpu)
                    print(
                        f"run {run} {name}: {n} msgs {secs:.2f}s {n / secs:,.0f}/s "
                        f"broker cpu {cpu:.2f} machine busy {busy:.0%}",
                        file=sys.stderr,
                    )
                loads.append(os.getloadavg()[0])
            spark.stop()
    report = {
        "machine": f"{platform.platform()} {os.cpu_count()} cpus, Python {platform.python_version()}",
        "count": total,
        "load_after_each_run": loads,
        "results": {
            k: {
                "msgs": counts[k],
                "min": min(v),
                "median": statistics.median(v),
                "max": max(v),
                "broker_cpu_median": statistics.median(broker_cpu[k]),
                "machine_busy_median": statistics.median(machine[k]),
            }
            for k, v in results.items()
        },
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for k, r in report["results"].items():
            print(
                f"{k:20} {r['msgs']:>9} msgs  min {r['min']:>12,.0f}  median "
                f"{r['median']:>12,.0f}  max {r['max']:>12,.0f} msg/s  broker cpu "
                f"{r['broker_cpu_median']:.2f}  machine busy "
                f"{r['machine_busy_median']:.0%}"
            )
        print(f"load average after each run: {loads}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
