"""Spark pipeline over trio-rmq topics: order events -> per-minute aggregates, and a backfill.

Modes:

  generate  produce sample JSON order events {"order_id", "amount", "ts"} to --topic
  stream    read --topic as a stream, aggregate per event-time minute with a watermark, and
            write each finished minute to --out-topic (through the rocketmq sink) and to
            Parquet under --out/aggregates
  backfill  read a broker's store directory (CommitLog segment files, no broker needed) with
            the "rocketmq-store" source and write the --topic events to Parquet under
            --out/backfill

    rmq up --detach                        # namesrv 127.0.0.1:9876, store under ./.rmq
    python examples/spark_pipeline.py --namesrv 127.0.0.1:9876 generate --count 10000
    python examples/spark_pipeline.py --namesrv 127.0.0.1:9876 stream --out /tmp/orders
    python examples/spark_pipeline.py backfill --store .rmq/broker-a --out /tmp/orders

`python` is the venv's (`.venv/bin/python` works without activating it): `pipeline.session()`
makes Spark's Python workers run that same interpreter. With spark-submit, name it in
PYSPARK_PYTHON; no zip is needed when the project is installed in that interpreter:

    PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/spark-submit --master 'local[2]' \\
        examples/spark_pipeline.py --namesrv 127.0.0.1:9876 stream --out /tmp/orders

How the stream keeps its promises: the source's offsets live in the checkpoint, so a restart
replays what was not committed. Each micro-batch is written by `foreachBatch`: the Parquet
files go to a directory named after the batch id and are overwritten on a replay (idempotent),
and the topic messages carry `pipelineKey` properties (idempotentKeys=true) so a consumer of
--out-topic can drop the duplicates a replay sends (the rocketmq sink is at-least-once).
Aggregates use append mode: a minute is written once, when the watermark passes its end.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid

ORDER_SCHEMA = "order_id string, amount double, ts long"


def order_events(count: int, *, start_ms: int, step_ms: int = 250, seed: int = 7) -> list[dict]:
    """`count` deterministic sample orders, one every `step_ms` from `start_ms`."""
    rnd = random.Random(seed)
    return [
        {
            "order_id": f"o-{i:08d}",
            "amount": round(rnd.uniform(1, 500), 2),
            "ts": start_ms + i * step_ms,
        }
        for i in range(count)
    ]


def generate(namesrv: str, topic: str, events: list[dict], *, batch: int = 256) -> int:
    """Send the events as JSON bodies (keys = order id) in batches; returns how many."""
    from rmq import Message
    from rmq.sync import Producer

    with Producer(f"order-generator-{uuid.uuid4().hex[:6]}", namesrv) as producer:
        for i in range(0, len(events), batch):
            msgs = [
                Message(topic, json.dumps(e).encode(), tags="order", keys=e["order_id"])
                for e in events[i : i + batch]
            ]
            producer.send_batch(msgs)
    return len(events)


def _orders(df):
    """Parse the JSON body of a rocketmq DataFrame into typed order columns."""
    from pyspark.sql import functions as F

    return (
        df.select(F.from_json(F.col("body").cast("string"), ORDER_SCHEMA).alias("o"))
        .select("o.*")
        .where(F.col("order_id").isNotNull())
        .withColumn("event_time", F.timestamp_millis(F.col("ts")))
    )


def per_minute(orders, watermark: str = "1 minute"):
    """Orders per event-time minute: count, sum and max of amount."""
    from pyspark.sql import functions as F

    return (
        orders.withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", "1 minute").alias("w"))
        .agg(
            F.count("*").alias("orders"),
            F.round(F.sum("amount"), 2).alias("amount"),
            F.max("amount").alias("max_amount"),
        )
        .select(
            F.col("w.start").alias("minute"),
            "orders",
            "amount",
            "max_amount",
        )
    )


def run_stream(
    spark,
    *,
    namesrv: str,
    topic: str,
    out_topic: str,
    out: str,
    trigger: str = "availableNow",
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
):
    """Start the aggregation query; returns the StreamingQuery (call awaitTermination)."""
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("rocketmq")
        .option("namesrv", namesrv)
        .option("topic", topic)
        .option("startingOffsets", starting_offsets)
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    aggregates = per_minute(_orders(reader.load()))

    def write_batch(batch_df, batch_id: int) -> None:
        batch_df = batch_df.persist()
        try:
            # a replayed batch id overwrites its own directory: Parquet output stays exact
            batch_df.write.mode("overwrite").parquet(f"{out}/aggregates/batch={batch_id}")
            (
                batch_df.select(
                    F.to_json(
                        F.struct(
                            F.date_format("minute", "yyyy-MM-dd'T'HH:mm'Z'").alias("minute"),
                            "orders",
                            "amount",
                            "max_amount",
                        )
                    ).alias("body"),
                    F.lit("minute").alias("tags"),
                    F.date_format("minute", "yyyyMMddHHmm").alias("keys"),
                )
                .write.format("rocketmq")
                .option("namesrv", namesrv)
                .option("topic", out_topic)
                .option("idempotentKeys", "true")
                .mode("append")
                .save()
            )
        finally:
            batch_df.unpersist()

    writer = (
        aggregates.writeStream.outputMode("append")
        .foreachBatch(write_batch)
        .option("checkpointLocation", f"{out}/checkpoint")
    )
    if trigger == "availableNow":
        writer = writer.trigger(availableNow=True)
    elif trigger == "once":
        writer = writer.trigger(once=True)
    else:
        writer = writer.trigger(processingTime=trigger)
    return writer.start()


def run_backfill(spark, *, store: str, topic: str, out: str, broker_name: str | None = None):
    """Batch: the topic's orders from a store directory's CommitLog files to Parquet."""
    from pyspark.sql import functions as F

    reader = spark.read.format("rocketmq-store")
    if broker_name:
        reader = reader.option("brokerName", broker_name)
    raw = reader.load(store).where(F.col("topic") == topic)
    orders = _orders(raw.select("body")).withColumn("day", F.to_date("event_time"))
    orders.write.mode("overwrite").partitionBy("day").parquet(f"{out}/backfill")
    return orders.count()


def session(app: str = "trio-rmq-pipeline"):
    """The SparkSession of the example: workers run this interpreter, formats registered."""
    import pipeline

    return pipeline.session(app, **{"spark.sql.shuffle.partitions": "4"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namesrv", default="127.0.0.1:9876")
    parser.add_argument("--topic", default="Orders")
    sub = parser.add_subparsers(dest="mode", required=True)
    g = sub.add_parser("generate", help="produce sample order events")
    g.add_argument("--count", type=int, default=10_000)
    g.add_argument("--step-ms", type=int, default=250)
    s = sub.add_parser("stream", help="per-minute aggregates to a topic and Parquet")
    s.add_argument("--out-topic", default="OrdersPerMinute")
    s.add_argument("--out", required=True, help="output directory (Parquet + checkpoint)")
    s.add_argument(
        "--trigger", default="availableNow", help="availableNow, once or e.g. '10 seconds'"
    )
    s.add_argument("--max-offsets-per-trigger", type=int, default=None)
    b = sub.add_parser("backfill", help="store files -> Parquet")
    b.add_argument("--store", required=True, help="broker storePathRootDir or its commitlog/")
    b.add_argument("--out", required=True)
    b.add_argument("--broker-name", default=None)
    args = parser.parse_args(argv)

    if args.mode == "generate":
        now = int(time.time() * 1000)
        n = generate(
            args.namesrv, args.topic, order_events(args.count, start_ms=now, step_ms=args.step_ms)
        )
        print(f"sent {n} order events to {args.topic}")
        return 0
    spark = session()
    try:
        if args.mode == "stream":
            query = run_stream(
                spark,
                namesrv=args.namesrv,
                topic=args.topic,
                out_topic=args.out_topic,
                out=args.out,
                trigger=args.trigger,
                max_offsets_per_trigger=args.max_offsets_per_trigger,
            )
            query.awaitTermination()
            print(f"aggregates in {args.out}/aggregates and topic {args.out_topic}")
        else:
            n = run_backfill(
                spark,
                store=args.store,
                topic=args.topic,
                out=args.out,
                broker_name=args.broker_name,
            )
            print(f"{n} orders of {args.topic} written to {args.out}/backfill")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
