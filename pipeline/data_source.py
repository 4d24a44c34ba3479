"""The "rocketmq" PySpark data source: batch and streaming reads of live topics.

    spark.read.format("rocketmq").option("namesrv", "127.0.0.1:9876").option("topic", "t").load()
    spark.readStream.format("rocketmq").option(...).option("maxOffsetsPerTrigger", 10000).load()

Theory of operation. Options are checked on the driver (`pipeline.options`). Planning asks the
cluster (`pipeline.live_cluster.LiveCluster`) for every readable queue of the topics and its
min/max offsets, turns the start/end options into one [start, end) range per queue
(`pipeline.source_offsets`) and gives Spark one InputPartition per queue with data, split above
maxOffsetsPerPartition offsets. A partition carries only a frozen `PullTask` of plain values;
`read()` runs on the executor and opens its own sockets there.

Streaming: an offset is `{"topic": {"broker/queue": next_offset}}`. `latestOffset` re-reads the
route each micro-batch, so queues added to a topic (they start at their min offset) and brokers
that appear are picked up, and a broker whose master is gone is read from its slave (the route
then lists only the slave). A broker with no live node keeps its offsets until it is back.
maxOffsetsPerTrigger arrives as Spark's ReadMaxRows limit and is split by backlog; under
Trigger.AvailableNow the queues' max offsets at the start are the run's target
(SupportsTriggerAvailableNow), still read in limited micro-batches. A checkpoint
offset below a queue's min offset (retention) or above its max offset (the store was replaced)
is data loss: it fails the query with failOnDataLoss=true (the default), else it is logged and
reading goes on from the queue's min offset. `commit(end)` (Spark calls it once the batch ending
at `end` is durable, one batch late) stores the offsets for consumerGroup on each master, so
`rmq group progress <group>` shows the pipeline's lag.

Writing delegates to `pipeline.sink`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from common.errors import RemotingConnectError
from pipeline.errors import DataLossError
from pipeline.live_cluster import LiveCluster, QueueState
from pipeline.live_reader import PullTask, read_task
from pipeline.options import OptionError, ReaderOptions, parse_reader_options
from pipeline.schema import SPARK_SCHEMA_DDL
from pipeline.source_offsets import (
    QueueKey,
    QueueRange,
    data_loss,
    format_key,
    offsets_from_json,
    offsets_to_json,
    rate_limit,
    resolve_offset,
    split_range,
)

if TYPE_CHECKING:  # the sink (and the producer under it) loads only when a query writes
    from pipeline.sink import RocketMQStreamWriter, RocketMQWriter

log = logging.getLogger(__name__)

__all__ = [
    "RocketMQBatchReader",
    "RocketMQDataSource",
    "RocketMQInputPartition",
    "RocketMQStreamReader",
]


class RocketMQInputPartition(InputPartition):
    """One queue range; `value` is a picklable PullTask."""

    def __init__(self, task: PullTask) -> None:
        super().__init__(task)


def _read(partition: InputPartition) -> Iterator:
    task = getattr(partition, "value", None)
    if isinstance(task, PullTask):  # Spark sends InputPartition(None) when we planned none
        yield from read_task(task)


def _check_named_queues(opts: ReaderOptions, states: dict[QueueKey, QueueState]) -> None:
    """A JSON start/end naming a topic or queue that is not read is a typo: say which."""
    topics = {k.topic for k in states}
    for option, spec in (("startingOffsets", opts.starting), ("endingOffsets", opts.ending)):
        if not isinstance(spec, dict):
            continue
        for key in spec:
            if key.topic not in topics:
                raise OptionError(
                    f"option {option}: topic {key.topic!r} is not one of the topics read"
                )
            if key not in states:
                raise OptionError(
                    f"option {option}: {key.topic} has no queue {format_key(key.broker, key.queue_id)}"
                )


def _starts(
    cluster: LiveCluster, opts: ReaderOptions, states: dict[QueueKey, QueueState]
) -> dict[QueueKey, int]:
    out = {}
    for key, st in states.items():
        if opts.starting_timestamp is not None:
            out[key] = cluster.search_offset(st, opts.starting_timestamp)
        else:
            out[key] = resolve_offset(
                opts.starting, key, st.min_offset, st.max_offset, missing="earliest"
            )
    return out


def _partitions(
    opts: ReaderOptions, ranges: list[QueueRange], addrs: dict[QueueKey, tuple[str, ...]]
) -> list[RocketMQInputPartition]:
    out = []
    for r in ranges:
        for piece in split_range(r, opts.max_offsets_per_partition):
            out.append(
                RocketMQInputPartition(
                    PullTask(
                        namesrv=opts.namesrv,
                        topic=r.topic,
                        broker=r.broker,
                        queue_id=r.queue_id,
                        start=piece.start,
                        end=piece.end,
                        addrs=addrs[r.key],
                        group=opts.pull_group,
                        tags=opts.tags,
                        timeout=opts.timeout,
                        pull_batch_size=opts.pull_batch_size,
                        fail_on_data_loss=opts.fail_on_data_loss,
                        read_from_slave=opts.read_from_slave,
                    )
                )
            )
    return out


class RocketMQDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self) -> str:
        return SPARK_SCHEMA_DDL

    def reader(self, schema: StructType) -> RocketMQBatchReader:
        return RocketMQBatchReader(parse_reader_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> RocketMQStreamReader:
        return RocketMQStreamReader(parse_reader_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> RocketMQWriter:
        from pipeline.sink import RocketMQWriter

        return RocketMQWriter(schema, self.options, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> RocketMQStreamWriter:
        from pipeline.sink import RocketMQStreamWriter

        return RocketMQStreamWriter(schema, self.options, overwrite)


class RocketMQBatchReader(DataSourceReader):
    def __init__(self, opts: ReaderOptions) -> None:
        self.opts = opts

    def plan(self) -> list[QueueRange]:
        """The [start, end) range of every queue (empty ones included)."""
        opts = self.opts
        cluster = LiveCluster(opts)
        try:
            states = cluster.queues(require_all=True)
            _check_named_queues(opts, states)
            starts = _starts(cluster, opts, states)
        finally:
            cluster.close()
        ranges = []
        for key, st in sorted(states.items()):
            start = starts[key]
            end = resolve_offset(opts.ending, key, st.min_offset, st.max_offset, missing="latest")
            if end > st.max_offset:
                raise OptionError(
                    f"option endingOffsets: {end} is past the max offset {st.max_offset} of "
                    f"{key.topic} {format_key(key.broker, key.queue_id)}"
                )
            if start > end:
                raise OptionError(
                    f"startingOffsets {start} of {key.topic} {format_key(key.broker, key.queue_id)}"
                    f" is after its endingOffsets {end}"
                )
            lost = data_loss(key, start, st.min_offset, st.max_offset)
            if lost is not None:
                if opts.fail_on_data_loss:
                    raise DataLossError(f"{lost}; set failOnDataLoss=false to skip it")
                log.warning("%s (failOnDataLoss=false: reading from %d)", lost, st.min_offset)
                start = st.min_offset
            ranges.append(QueueRange(key.topic, key.broker, key.queue_id, start, end))
        self._addrs = {k: st.addrs for k, st in states.items()}
        return ranges

    def partitions(self) -> list[RocketMQInputPartition]:
        ranges = [r for r in self.plan() if r.size]
        return _partitions(self.opts, ranges, self._addrs)

    def read(self, partition: InputPartition) -> Iterator:
        return _read(partition)


class RocketMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: ReaderOptions) -> None:
        self.opts = opts
        # driver-side only (this object is not sent to executors: read() is static)
        self._cluster: LiveCluster | None = None
        # the latest route view: queue -> state, broker name -> master address
        self._states: dict[QueueKey, QueueState] = {}
        # (queue, checkpoint offset) -> where reading really starts (data loss skipped)
        self._resets: dict[tuple[QueueKey, int], int] = {}
        # Trigger.AvailableNow: each queue's max offset when the run started (None otherwise)
        self._target: dict[QueueKey, int] | None = None

    def _live(self) -> LiveCluster:
        if self._cluster is None:
            self._cluster = LiveCluster(self.opts)
        return self._cluster

    def _refresh(self) -> dict[QueueKey, QueueState]:
        self._states = self._live().queues(require_all=False)
        return self._states

    def initialOffset(self) -> dict:
        states = self._refresh()
        _check_named_queues(self.opts, states)
        return offsets_to_json(_starts(self._live(), self.opts, states))

    def prepareForTriggerAvailableNow(self) -> None:
        # Without this Spark reads everything in ONE batch under availableNow, ignoring
        # maxOffsetsPerTrigger. With it, what the queues hold now is the run's target: later
        # messages wait for the next run and the target is still read in limited micro-batches
        # (Kafka's source does the same). A queue that appears after this point waits too.
        self._target = {key: st.max_offset for key, st in self._refresh().items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_offsets_per_trigger)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        states = self._refresh()
        begin = offsets_from_json(start)
        eff: dict[QueueKey, int] = {}
        latest: dict[QueueKey, int] = {}
        for key, st in states.items():
            s = begin.get(key)
            if s is None:  # a queue we have not seen: a topic extended or a new broker
                s = st.min_offset
            elif s > st.max_offset and st.master is None:
                # only the slave answers (the master is gone): it may lag behind the offsets
                # read from the master, which is not data loss; wait here until it catches up
                # or the master is back
                eff[key] = latest[key] = s
                continue
            else:
                lost = data_loss(key, s, st.min_offset, st.max_offset)
                if lost is not None:
                    if self.opts.fail_on_data_loss:
                        raise DataLossError(f"{lost}; set failOnDataLoss=false to skip it")
                    log.warning("%s (failOnDataLoss=false: going on from %d)", lost, st.min_offset)
                    self._resets[(key, s)] = st.min_offset
                    s = st.min_offset
            eff[key] = s
            latest[key] = st.max_offset
            if self._target is not None:
                latest[key] = max(s, min(st.max_offset, self._target.get(key, s)))
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(eff, latest, limit.max_rows)
        else:
            end = latest
        # queues of brokers with no live node right now keep their place
        for key, s in begin.items():
            end.setdefault(key, s)
        return offsets_to_json(end)

    def partitions(self, start: dict, end: dict) -> list[RocketMQInputPartition]:
        begin = offsets_from_json(start)
        stop = offsets_from_json(end)
        states = self._states or self._refresh()
        ranges = []
        for key, e in sorted(stop.items()):
            s = begin.get(key)
            if s is None:
                st = states.get(key)
                s = st.min_offset if st is not None else 0
            s = self._resets.get((key, s), s)
            if s > e:
                # replayed after a restart without the reset note: read_task skips what is gone
                s = 0
            if e > s:
                if key not in states:
                    # a batch replayed from the checkpoint while its broker has no live node:
                    # fail the attempt (Spark retries it) rather than mark the range done unread
                    raise RemotingConnectError(
                        f"no live node of {key.broker} to read {key.topic} queue "
                        f"{key.queue_id} offsets {s}..{e}"
                    )
                ranges.append(QueueRange(key.topic, key.broker, key.queue_id, s, e))
        return _partitions(self.opts, ranges, {k: st.addrs for k, st in states.items()})

    def read(self, partition: InputPartition) -> Iterator:
        return _read(partition)

    def commit(self, end: dict) -> None:
        group = self.opts.consumer_group
        if group is None:
            return
        states = self._states or self._refresh()
        masters = {st.key.broker: st.master for st in states.values() if st.master is not None}
        self._live().commit(group, offsets_from_json(end), masters)

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
