"""The sink of the "rocketmq" data source: `df.write` and `df.writeStream` into topics.

Theory of operation:

* Driver side. `RocketMQWriter(schema, options, overwrite)` / `RocketMQStreamWriter(...)` are
  made by `pipeline.data_source.RocketMQDataSource.writer()/streamWriter()`. Their constructor
  checks the options and the DataFrame schema (`SinkOptions.parse`, `SinkColumns.of`) and
  raises `SinkConfigError` naming the option or column, so a bad query fails before any task
  runs. Nothing unpicklable is kept: the object travels to the executors by pickle.
* Executor side. `write(batches)` receives pyarrow RecordBatches (the Arrow writer classes of
  PySpark 4.x) and runs one `trio.run` that opens an async `rmq.Producer`, turns each row into
  a `Message`, and groups messages into SEND_BATCH_MESSAGE requests per (topic, queue): at most
  `batchSize` messages and always under the broker's 4 MiB body limit. Rows without a queueId
  go to a shared channel drained by `maxInFlight` senders (the producer picks the queue, round
  robin, and retries retriable errors on another broker); rows with a queueId go to one channel
  per queue with ONE sender, so their order in the queue is the order of the rows. Reading the
  next Arrow batch from Spark blocks, so it runs in a worker thread and the sends keep flowing.
* Failure. The first failed send (a broker response code, a timeout, or a stored-but-not-OK
  status such as FLUSH_SLAVE_TIMEOUT) cancels the other sends and fails the task with
  `SinkWriteError` whose message carries the broker's code. Spark retries the task, which
  sends the whole partition again: the guarantee is AT-LEAST-ONCE. RocketMQ has no transaction
  spanning requests, so `commit()` has nothing to publish (messages are visible as soon as each
  send returns) and `abort()` cannot take back what successful sends stored; both only log.
* Deduplication. With `idempotentKeys=true` every message carries the user property
  `pipelineKey` = "{queryId}:{batchId}:{partitionId}:{seq}" (streaming) or
  "{jobId}:batch:{partitionId}:{seq}" (batch; jobId is made once on the driver, so a retried
  task repeats it). `seq` is the row's index in the task's partition. A re-sent row gets the
  same key, so a consumer that remembers keys sees each row once. The streaming ids come from
  the local properties Spark sets on every task of a micro-batch.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Iterator
from typing import Any

import attrs
import pyarrow as pa
import trio
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from common.errors import RmqError, unwrap_group
from common.model import MessageQueue
from rmq.message import PROPERTY_UNIQ_KEY, RESERVED_PROPERTIES, Message
from rmq.producer import MAX_MESSAGE_SIZE, Producer, SendStatus

log = logging.getLogger(__name__)

IDEMPOTENT_KEY_PROPERTY = "pipelineKey"
DEFAULT_PRODUCER_GROUP = "spark-rocketmq-sink"
DEFAULT_BATCH_SIZE = 256  # messages per SEND_BATCH_MESSAGE request
DEFAULT_TIMEOUT = 10.0  # seconds per send, retries included
DEFAULT_MAX_IN_FLIGHT = 4  # concurrent requests of rows without a queueId
# Spark's local properties of a micro-batch's tasks (StreamExecution / MicroBatchExecution).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
# Bytes a message adds to a batch body besides its body and user properties: the 20-byte
# head, the 2-byte properties length and the properties the producer adds (TAGS, KEYS, WAIT,
# UNIQ_KEY). Tags and keys are counted separately; 96 covers the rest with room to spare.
_PER_MESSAGE_OVERHEAD = 96
# The request body must stay under the broker's maxMessageSize; keep a margin for rounding.
_BATCH_BYTES_LIMIT = MAX_MESSAGE_SIZE - 64 * 1024
# System properties the producer sets itself; a row read from a topic may carry them.
_DROPPED_PROPERTIES = RESERVED_PROPERTIES | {PROPERTY_UNIQ_KEY}

# What a sender receives: the queue the messages must go to (None: the producer picks one) and
# one request's worth of messages.
_Chunk = tuple[MessageQueue | None, list[Message]]
# One row as `_Writer._messages` yields it: topic, (brokerName, queueId) or None, the message
# and its estimated encoded size.
_Row = tuple[str, tuple[str | None, int] | None, Message, int]


class SinkConfigError(ValueError):
    """A sink option or a column of the DataFrame is wrong (raised on the driver)."""


class SinkWriteError(RuntimeError):
    """A send failed on an executor; the message names the topic, queue and broker code."""


def _truthy(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise SinkConfigError(f"option {name}: expected true or false, got {value!r}")


@attrs.frozen
class SinkOptions:
    namesrv: str
    topic: str | None = None
    producer_group: str = DEFAULT_PRODUCER_GROUP
    batch_size: int = DEFAULT_BATCH_SIZE
    timeout: float = DEFAULT_TIMEOUT
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    idempotent_keys: bool = False

    @classmethod
    def parse(cls, options: Any) -> SinkOptions:
        """Options are case-insensitive, as everywhere in Spark."""
        opts = {str(k).lower(): str(v) for k, v in dict(options or {}).items()}
        namesrv = opts.get("namesrv", "").strip()
        if not namesrv:
            raise SinkConfigError(
                "option namesrv is required (the nameserver address, e.g. 127.0.0.1:9876)"
            )
        topic = opts.get("topic", "").strip() or None

        def number(name: str, kind: type, default: Any, low: float) -> Any:
            raw = opts.get(name.lower())
            if raw is None:
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise SinkConfigError(f"option {name}: expected a number, got {raw!r}") from None
            if not (value >= low and math.isfinite(value)):
                raise SinkConfigError(f"option {name}: must be >= {low}, got {raw!r}")
            return value

        return cls(
            namesrv=namesrv,
            topic=topic,
            producer_group=opts.get("producergroup", "").strip() or DEFAULT_PRODUCER_GROUP,
            batch_size=number("batchSize", int, DEFAULT_BATCH_SIZE, 1),
            timeout=number("timeout", float, DEFAULT_TIMEOUT, 0.001),
            max_in_flight=number("maxInFlight", int, DEFAULT_MAX_IN_FLIGHT, 1),
            idempotent_keys=_truthy("idempotentKeys", opts.get("idempotentkeys", "false")),
        )


_COLUMN_TYPES = {
    "body": "binary or string",
    "topic": "string",
    "tags": "string",
    "keys": "string or array<string>",
    "properties": "map<string,string>",
    "queueId": "int",
    "brokerName": "string",
}


def _type_ok(name: str, dt: Any) -> bool:
    if name == "body":
        return isinstance(dt, (BinaryType, StringType))
    if name in ("topic", "tags", "brokerName"):
        return isinstance(dt, StringType)
    if name == "keys":
        return isinstance(dt, StringType) or (
            isinstance(dt, ArrayType) and isinstance(dt.elementType, StringType)
        )
    if name == "properties":
        return (
            isinstance(dt, MapType)
            and isinstance(dt.keyType, StringType)
            and isinstance(dt.valueType, StringType)
        )
    if name == "queueId":
        return isinstance(dt, (IntegerType, LongType, ShortType))
    return True


@attrs.frozen
class SinkColumns:
    """Which of the sink's columns the DataFrame has; other columns are ignored, so a
    DataFrame read from a topic can be written back as is."""

    names: tuple[str, ...]

    @classmethod
    def of(cls, schema: StructType, options: SinkOptions) -> SinkColumns:
        fields = {f.name: f.dataType for f in schema.fields}
        if "body" not in fields:
            raise SinkConfigError(
                "the DataFrame has no body column (binary or string): "
                f"columns are {', '.join(fields) or 'none'}"
            )
        for name, dt in fields.items():
            if name in _COLUMN_TYPES and not _type_ok(name, dt):
                raise SinkConfigError(
                    f"column {name} must be {_COLUMN_TYPES[name]}, not {dt.simpleString()}"
                )
        if "topic" not in fields and options.topic is None:
            raise SinkConfigError("no topic: set option topic or add a topic column (string)")
        return cls(tuple(n for n in _COLUMN_TYPES if n in fields))


@attrs.frozen
class SinkCommitMessage(WriterCommitMessage):
    partition_id: int
    messages: int
    requests: int
    body_bytes: int


def _keys(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    return " ".join(k for k in value if k) or None


class _Chunker:
    """Groups the messages of one (topic, queue) into requests under both limits."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        # messages not yet handed to a sender; their estimated encoded size is `size`
        self.msgs: list[Message] = []
        self.size = 0

    def add(self, msg: Message, size: int) -> list[Message] | None:
        """Add `msg`; return the full chunk to send first if `msg` does not fit in it."""
        full = None
        if self.msgs and self.size + size > _BATCH_BYTES_LIMIT:
            full = self.take()
        self.msgs.append(msg)
        self.size += size
        if full is None and len(self.msgs) >= self.batch_size:
            full = self.take()
        return full

    def take(self) -> list[Message]:
        msgs, self.msgs, self.size = self.msgs, [], 0
        return msgs


@attrs.define(eq=False)
class _Writer:
    """One task's write: rows -> messages -> batched sends (runs inside `trio.run`)."""

    options: SinkOptions
    columns: SinkColumns
    key_prefix: str | None
    # sums for the commit message; only changed by senders after a successful send
    messages: int = 0
    requests: int = 0
    body_bytes: int = 0

    async def run(self, batches: Iterator[pa.RecordBatch]) -> None:
        opts = self.options
        async with (
            Producer(
                opts.producer_group,
                opts.namesrv,
                send_timeout=opts.timeout,
                instance_name=f"spark-sink-{uuid.uuid4().hex[:12]}",
            ) as producer,
            trio.open_nursery() as nursery,
        ):
            shared_send, shared_recv = trio.open_memory_channel[_Chunk](0)
            async with shared_send:
                for _ in range(opts.max_in_flight):
                    nursery.start_soon(self._sender, producer, shared_recv.clone())
                shared_recv.close()
                # queue -> the channel of that queue's single (order-keeping) sender
                ordered: dict[MessageQueue, trio.MemorySendChannel[_Chunk]] = {}
                try:
                    await self._feed(producer, nursery, batches, shared_send, ordered)
                finally:
                    for chan in ordered.values():
                        chan.close()

    async def _feed(
        self,
        producer: Producer,
        nursery: trio.Nursery,
        batches: Iterator[pa.RecordBatch],
        shared_send: trio.MemorySendChannel[_Chunk],
        ordered: dict[MessageQueue, trio.MemorySendChannel[_Chunk]],
    ) -> None:
        chunkers: dict[tuple[str, MessageQueue | None], _Chunker] = {}
        seq = 0
        while True:
            # Spark never hands over a None batch, so None marks the end of the iterator
            batch: pa.RecordBatch | None = await trio.to_thread.run_sync(next, batches, None)
            if batch is None:
                break
            for topic, where, msg, size in self._messages(batch, seq):
                mq = None if where is None else await self._queue(producer, topic, *where)
                key = (topic, mq)
                chunker = chunkers.get(key)
                if chunker is None:
                    chunker = chunkers[key] = _Chunker(self.options.batch_size)
                full = chunker.add(msg, size)
                if full:
                    await self._dispatch(nursery, producer, shared_send, ordered, mq, full)
            seq += batch.num_rows
        for (_topic, mq), chunker in chunkers.items():
            if chunker.msgs:
                await self._dispatch(nursery, producer, shared_send, ordered, mq, chunker.take())

    async def _dispatch(
        self,
        nursery: trio.Nursery,
        producer: Producer,
        shared_send: trio.MemorySendChannel[_Chunk],
        ordered: dict[MessageQueue, trio.MemorySendChannel[_Chunk]],
        mq: MessageQueue | None,
        msgs: list[Message],
    ) -> None:
        if mq is None:
            await shared_send.send((None, msgs))
            return
        chan = ordered.get(mq)
        if chan is None:
            chan, recv = trio.open_memory_channel[_Chunk](1)
            ordered[mq] = chan
            nursery.start_soon(self._sender, producer, recv)
        await chan.send((mq, msgs))

    async def _sender(self, producer: Producer, recv: trio.MemoryReceiveChannel[_Chunk]) -> None:
        async with recv:
            async for mq, msgs in recv:
                topic = msgs[0].topic
                where = f"topic {topic}" + (
                    f" queue {mq.brokerName}/{mq.queueId}" if mq is not None else ""
                )
                try:
                    result = await producer.send_batch(msgs, queue=mq)
                except RmqError as exc:
                    code = getattr(exc, "code", None)
                    raise SinkWriteError(
                        f"sending {len(msgs)} messages to {where} failed"
                        + (f" with broker code {code}" if code is not None else "")
                        + f": {exc}"
                    ) from exc
                if result.status is not SendStatus.SEND_OK:
                    raise SinkWriteError(
                        f"sending {len(msgs)} messages to {where}: the broker stored them but "
                        f"answered {result.status.value}; failing the task so Spark retries it"
                    )
                self.messages += len(msgs)
                self.requests += 1
                self.body_bytes += sum(len(m.body) for m in msgs)

    async def _queue(
        self, producer: Producer, topic: str, broker: str | None, qid: int
    ) -> MessageQueue:
        try:
            info = producer._cached_publish_info(topic) or await producer.publish_info(topic)
        except RmqError as exc:
            # a route with no writable queue (a read-only topic, a DLedger group between two
            # leaders) is refused before any send, as Java's producer refuses it
            raise SinkWriteError(
                f"column queueId: topic {topic} has no writable queue: {exc}"
            ) from exc
        found = [
            q
            for q in info.queues
            if q.queueId == qid and (broker is None or q.brokerName == broker)
        ]
        if len(found) == 1:
            return found[0]
        if not found:
            where = f" on broker {broker}" if broker else ""
            raise SinkWriteError(f"column queueId: topic {topic} has no queue {qid}{where}")
        names = ", ".join(sorted(q.brokerName for q in found))
        raise SinkWriteError(
            f"column queueId: queue {qid} of topic {topic} exists on brokers {names}; "
            "add a brokerName column to choose one"
        )

    def _messages(self, batch: pa.RecordBatch, seq0: int) -> Iterator[_Row]:
        """(topic, (brokerName, queueId) or None, Message, estimated size) per row."""
        n = batch.num_rows
        cols = set(self.columns.names)

        def column(name: str) -> list[Any]:
            if name not in cols:
                return [None] * n
            return batch.column(batch.schema.get_field_index(name)).to_pylist()

        bodies, topics, tags, keys = column("body"), column("topic"), column("tags"), column("keys")
        props, qids, brokers = column("properties"), column("queueId"), column("brokerName")
        forced_topic = self.options.topic
        prefix = self.key_prefix
        for i in range(n):
            body = bodies[i]
            if body is None:
                raise SinkWriteError(f"column body is null in row {seq0 + i} of the partition")
            topic = forced_topic or topics[i]
            if not topic:
                raise SinkWriteError(
                    f"column topic is null in row {seq0 + i} and option topic is not set"
                )
            user_props = {
                k: v for k, v in (props[i] or ()) if k not in _DROPPED_PROPERTIES and v is not None
            }
            if prefix is not None:
                user_props[IDEMPOTENT_KEY_PROPERTY] = f"{prefix}:{seq0 + i}"
            msg = Message(
                topic, body, tags=tags[i] or None, keys=_keys(keys[i]), properties=user_props
            )
            size = (
                _PER_MESSAGE_OVERHEAD
                + len(msg.body)
                + len(msg.tags or "")
                + len(msg.keys or "")
                + sum(len(k) + len(v) + 2 for k, v in user_props.items())
            )
            if size > _BATCH_BYTES_LIMIT:
                raise SinkWriteError(
                    f"row {seq0 + i}: message of {len(msg.body)} body bytes exceeds the "
                    f"broker's {MAX_MESSAGE_SIZE}-byte limit"
                )
            qid = qids[i]
            yield topic, (None if qid is None else (brokers[i], int(qid))), msg, size


def _partition_id() -> int:
    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


def _write(
    options: SinkOptions,
    columns: SinkColumns,
    key_prefix: str | None,
    batches: Iterator[pa.RecordBatch],
) -> SinkCommitMessage:
    partition = _partition_id()
    writer = _Writer(options, columns, None if key_prefix is None else f"{key_prefix}:{partition}")
    try:
        trio.run(writer.run, iter(batches))
    except BaseException as exc:  # a group of one is re-raised as its cause
        inner = unwrap_group(exc)
        if inner is exc:
            raise
        raise inner from None
    return SinkCommitMessage(partition, writer.messages, writer.requests, writer.body_bytes)


def _log_outcome(kind: str, messages: list, what: str) -> None:
    done = [m for m in messages if isinstance(m, SinkCommitMessage)]
    total = sum(m.messages for m in done)
    log.info("rocketmq sink %s %s: %d messages from %d tasks", kind, what, total, len(done))


class RocketMQWriter(DataSourceArrowWriter):
    """Batch sink: `df.write.format("rocketmq").option("namesrv", ...).save()`."""

    def __init__(self, schema: StructType, options: Any, overwrite: bool = False) -> None:
        self.options = SinkOptions.parse(options)
        self.columns = SinkColumns.of(schema, self.options)
        # one id per write job, made on the driver: a retried task repeats its keys
        self.job_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        prefix = f"{self.job_id}:batch" if self.options.idempotent_keys else None
        return _write(self.options, self.columns, prefix, iterator)

    def commit(self, messages: list) -> None:
        # every message is already visible: RocketMQ has nothing to commit
        _log_outcome("job", messages, "committed")

    def abort(self, messages: list) -> None:
        # messages sent by finished tasks (and part of the failed one) stay in the topic
        _log_outcome("job", messages, "aborted; already sent messages stay")


class RocketMQStreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink: `df.writeStream.format("rocketmq").option("namesrv", ...).start()`."""

    def __init__(self, schema: StructType, options: Any, overwrite: bool = False) -> None:
        self.options = SinkOptions.parse(options)
        self.columns = SinkColumns.of(schema, self.options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        prefix = None
        if self.options.idempotent_keys:
            ctx = TaskContext.get()
            query = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx else None
            batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx else None
            prefix = f"{query or 'query'}:{batch if batch is not None else 'batch'}"
        return _write(self.options, self.columns, prefix, iterator)

    def commit(self, messages: list, batchId: int) -> None:
        _log_outcome(f"micro-batch {batchId}", messages, "committed")

    def abort(self, messages: list, batchId: int) -> None:
        _log_outcome(f"micro-batch {batchId}", messages, "aborted; already sent messages stay")
