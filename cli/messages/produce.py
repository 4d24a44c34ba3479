"""The send loop behind `rmq produce`: lines streamed to the broker in pipelined batches.

Theory of operation
-------------------
A reader thread reads stdin with `os.read` on its descriptor (whatever the pipe holds now, up
to 64 KiB, without waiting for more), cuts it into lines and hands them on as batches of at most `max_lines`
lines and `max_bytes` bytes through a bounded Trio memory channel. So a line is sent as soon
as it arrives (`tail -f log | rmq produce` works), a fast producer such as `seq` fills whole
batches, and memory stays bounded: when the channel is full the reader blocks in
`from_thread.run(channel.send)`, stops reading, and the pipe pushes back on the writer.

`senders` tasks take batches from the channel and send each as one SEND_BATCH_MESSAGE
(`Producer.send_batch`), so up to `senders` requests are in flight. Each sender owns a fixed
share of the topic's write queues and sends its batches one after the other, round robin over
that share: a queue is written by one sender only, so within a queue the messages keep the
order of the input lines. A batch whose pinned send fails with a retriable error (the broker
went away) is sent once more through the producer's own queue choice, which retries on
another broker; only such a batch may land out of order. Delayed messages cannot be batched
(RocketMQ refuses it), so with a delay level each line is its own SEND_MESSAGE, still
`senders` in flight.

The loop ends at end of input once every batch is answered, or on SIGINT/SIGTERM: reading
stops, what was already read is still sent. A line longer than a message body can be
(`max_line_bytes`) ends reading the same way: the lines before it are sent and reported, it
and everything after it are not, and `ProduceStats.refused` says which line it was. `ProduceStats` counts what was sent and every
answer other than SEND_OK; the command decides what those mean (`rmq produce` fails on a
message that was stored but not replicated or flushed, unless told to accept it).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable, Mapping
from typing import BinaryIO

import attrs
import trio

from cli.app import credentials_from_env
from cli.client_network import network_from_env
from common.errors import RmqError
from common.message_properties import encode_properties
from common.model import MessageQueue
from rmq import Message, Producer, SendResult, SendStatus
from rmq.message import default_generator, stored_batch_record_size, stored_record_size
from rmq.producer import MAX_MESSAGE_SIZE
from rmq.remoting import Remoting

MAX_LINES = 512  # lines per SEND_BATCH_MESSAGE
MAX_BYTES = 1024 * 1024  # body bytes per batch: well under the 4 MiB request limit
READ_SIZE = 64 * 1024
CHANNEL_BATCHES = 8  # batches read ahead of the senders: the memory bound
SENDERS = 8  # requests in flight at most

# stored, but not as durably as asked: the broker's answer says so
NOT_DURABLE = frozenset(
    {SendStatus.SLAVE_NOT_AVAILABLE, SendStatus.FLUSH_SLAVE_TIMEOUT, SendStatus.FLUSH_DISK_TIMEOUT}
)


@attrs.frozen
class MessageTemplate:
    """Everything of a message but its body: the command's options."""

    topic: str
    tags: str | None = None
    keys: str | None = None
    properties: Mapping[str, str] = attrs.field(factory=dict)
    delay_level: int = 0
    # RocketMQ 5 timer: epoch ms, or seconds from now
    deliver_at: int | None = None
    delay: float | None = None

    @property
    def one_at_a_time(self) -> bool:
        """Delayed messages cannot be batched."""
        return bool(self.delay_level) or self.deliver_at is not None or self.delay is not None

    def message(self, body: bytes) -> Message:
        return Message(
            self.topic,
            body,
            tags=self.tags,
            keys=self.keys,
            properties=dict(self.properties),
            delay_level=self.delay_level,
            deliver_at=self.deliver_at,
            delay=self.delay,
        )


@attrs.define(eq=False)
class ProduceStats:
    sent: int = 0
    # status name -> messages answered with it, SEND_OK left out
    statuses: dict[str, int] = attrs.Factory(dict)
    # lines handed to the senders so far (read by the display; written by the reader thread)
    lines_read: int = 0
    # set once the input ended (or reading was stopped): lines_read is then the total
    input_done: bool = False
    # the topic had no route: the queues the producer took from the auto-create topic's
    # (TBW102) route, where the broker creates the topic with the first message; empty if not
    auto_created: list[MessageQueue] = attrs.Factory(list)
    # the stdin line that could not be sent (reading stopped there), None if none
    refused: LineTooLongError | None = None
    # the signal (SIGINT, SIGTERM) that stopped reading, None if the input ended
    stopped_by: int | None = None

    @property
    def not_durable(self) -> int:
        return sum(self.statuses.get(s.name, 0) for s in NOT_DURABLE)


class LineTooLongError(RmqError):
    """A stdin line longer than a message body can be: it is not sent, and reading stops
    there (`length` None: the line had not ended after `limit` bytes)."""

    def __init__(self, number: int, length: int | None, limit: int) -> None:
        size = f"{length} bytes, over" if length is not None else "longer than"
        super().__init__(
            f"line {number} of stdin is {size} the {limit} bytes a message body can have "
            "here (the broker's maxMessageSize less the record's topic and properties): "
            "it was not sent, nor any line after it"
        )
        self.number = number
        self.length = length
        self.limit = limit


# what a broker's cluster name may add to a record (the CLUSTER property), besides the rest
_CLUSTER_NAME_SLACK = 255


def max_line_bytes(template: MessageTemplate, max_message_size: int = MAX_MESSAGE_SIZE) -> int:
    """The longest line `template` can carry as a body: maxMessageSize less what the stored
    record adds (topic, properties, a cluster name of up to `_CLUSTER_NAME_SLACK` bytes), as a
    single message and as a one-message batch, whichever adds more."""
    props, _ = template.message(b"-").wire_properties_string(default_generator().create())
    topic = template.topic
    overhead = max(
        stored_record_size(topic, 0, props, ""),
        # the properties the broker adds to each message of a batch (WAIT=true)
        stored_batch_record_size(topic, 0, props, encode_properties({"WAIT": "true"}), ""),
    )
    return max_message_size - overhead - _CLUSTER_NAME_SLACK


def read_batches(
    stream: BinaryIO,
    put: Callable[[list[bytes]], None],
    stats: ProduceStats,
    *,
    max_lines: int = MAX_LINES,
    max_bytes: int = MAX_BYTES,
    max_line: int = 4 * 1024 * 1024,
) -> None:
    """Read `stream` to its end, calling `put(batch)` for each batch of non-empty lines
    (without their line end); blocking, meant for a worker thread. `put` may block: that is
    the back pressure. A line longer than `max_line` raises LineTooLongError once every line
    before it was put; nothing after it is read."""
    read = _reader(stream)
    tail = b""
    before = 0  # lines (empty ones too) that ended before the current chunk
    while True:
        data = read(READ_SIZE)
        if not data:
            break
        lines = (tail + data).split(b"\n") if tail else data.split(b"\n")
        tail = lines.pop()
        for i, line in enumerate(lines):
            if len(line) > max_line:
                _put_lines(lines[:i], put, stats, max_lines, max_bytes)
                raise LineTooLongError(before + i + 1, len(line), max_line)
        _put_lines(lines, put, stats, max_lines, max_bytes)
        before += len(lines)
        if len(tail) > max_line:
            raise LineTooLongError(before + 1, None, max_line)
    if tail:
        _put_lines([tail], put, stats, max_lines, max_bytes)


def _reader(stream: BinaryIO) -> Callable[[int], bytes]:
    """`os.read` on the stream's file descriptor when it has one: a thread abandoned in a
    read then holds no lock of the `io` object, which the interpreter takes at exit (a
    BufferedReader's lock held by a daemon thread aborts the interpreter at shutdown)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return stream.read1 if hasattr(stream, "read1") else stream.read
    return lambda n: os.read(fd, n)


def _put_lines(
    lines: list[bytes],
    put: Callable[[list[bytes]], None],
    stats: ProduceStats,
    max_lines: int,
    max_bytes: int,
) -> None:
    lines = [ln.rstrip(b"\r") for ln in lines]
    lines = [ln for ln in lines if ln]
    stats.lines_read += len(lines)  # before any of them is sent: the display decides on it
    batch: list[bytes] = []
    size = 0
    for line in lines:
        if batch and (len(batch) >= max_lines or size + len(line) > max_bytes):
            put(batch)
            batch, size = [], 0
        batch.append(line)
        size += len(line)
    if batch:
        put(batch)


async def read_stream(
    stream: BinaryIO,
    send: trio.MemorySendChannel[list[bytes]],
    stats: ProduceStats,
    **limits: int,
) -> None:
    """`read_batches` in a worker thread into `send`, closed at the end. Cancelling it
    abandons the thread (a read from a pipe cannot be interrupted); the thread then ends at
    its next batch, when the closed channel refuses it."""

    def put(batch: list[bytes]) -> None:
        trio.from_thread.run(send.send, batch)

    async with send:
        try:
            await trio.to_thread.run_sync(
                lambda: read_batches(stream, put, stats, **limits), abandon_on_cancel=True
            )
        except LineTooLongError as exc:
            # what was read before it is still sent; the command reports both
            stats.refused = exc
        finally:
            stats.input_done = True


async def feed_bodies(
    bodies: Iterable[str | bytes], send: trio.MemorySendChannel[list[bytes]], stats: ProduceStats
) -> None:
    """Command-line bodies, as batches like stdin's (empty ones are sent, and refused)."""
    async with send:
        batch = [b.encode() if isinstance(b, str) else b for b in bodies]
        stats.lines_read = len(batch)
        stats.input_done = True
        for i in range(0, len(batch), MAX_LINES):
            await send.send(batch[i : i + MAX_LINES])


def split_batch_result(result: SendResult, n: int) -> list[SendResult]:
    """One SendResult per message of a batch answered with `result` (ids are comma-joined,
    queue offsets consecutive)."""
    if n == 1:
        return [result]
    ids = result.msg_id.split(",")
    offsets = result.offset_msg_id.split(",")
    return [
        attrs.evolve(
            result,
            msg_id=ids[i] if len(ids) == n else result.msg_id,
            offset_msg_id=offsets[i] if len(offsets) == n else result.offset_msg_id,
            queue_offset=result.queue_offset + i,
        )
        for i in range(n)
    ]


async def send_batches(
    producer: Producer,
    template: MessageTemplate,
    receive: trio.MemoryReceiveChannel[list[bytes]],
    stats: ProduceStats,
    *,
    on_results: Callable[[list[SendResult]], None] | None = None,
    on_sent: Callable[[int], None] | None = None,
    senders: int = SENDERS,
) -> None:
    """Send every batch `receive` yields until it is closed and drained (see the module
    docstring). `on_results` gets each message's SendResult in input order per queue;
    `on_sent(n)` is told how many messages one answer covered."""
    try:
        first: list[bytes] | None = await receive.receive()
    except trio.EndOfChannel:  # no input at all: nothing to ask the nameserver
        await receive.aclose()
        return
    info = await producer.publish_info(template.topic)
    queues = list(info.queues)
    if info.from_default:
        stats.auto_created = queues
    n = max(1, min(senders, len(queues)))

    async def send_one(lines: list[bytes], mq: MessageQueue) -> list[SendResult] | None:
        if template.one_at_a_time:
            results: list[SendResult] = []
            for line in lines:
                result = await producer.send(template.message(line), queue=mq)
                results.append(result)
                _count(stats, result, 1, on_sent)
            return results
        msgs = [template.message(line) for line in lines]
        try:
            result = await producer.send_batch(msgs, queue=mq)
        except RmqError as exc:
            if not exc.retriable:
                raise
            result = await producer.send_batch(msgs)  # another queue, with the retries
        _count(stats, result, len(msgs), on_sent)
        return split_batch_result(result, len(msgs)) if on_results is not None else None

    async def sender(share: list[MessageQueue], rx: trio.MemoryReceiveChannel[list[bytes]]) -> None:
        nonlocal first
        k = 0
        async with rx:
            while True:
                if first is not None:
                    lines, first = first, None
                else:
                    try:
                        lines = await rx.receive()
                    except trio.EndOfChannel:
                        return
                results = await send_one(lines, share[k % len(share)])
                k += 1
                if results is not None and on_results is not None:
                    on_results(results)

    async with receive, trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(sender, queues[i::n], receive.clone())


def _count(
    stats: ProduceStats, result: SendResult, n: int, on_sent: Callable[[int], None] | None
) -> None:
    stats.sent += n
    if result.status is not SendStatus.SEND_OK:
        name = result.status.name
        stats.statuses[name] = stats.statuses.get(name, 0) + n
    if on_sent is not None:
        on_sent(n)


async def produce(
    namesrv: str,
    template: MessageTemplate,
    *,
    group: str,
    stream: BinaryIO | None = None,
    bodies: Iterable[str | bytes] = (),
    stats: ProduceStats | None = None,
    on_results: Callable[[list[SendResult]], None] | None = None,
    on_sent: Callable[[int], None] | None = None,
    senders: int = SENDERS,
    channel_batches: int = CHANNEL_BATCHES,
    handle_signals: bool = True,
    remoting: Remoting | None = None,
    **limits: int,
) -> ProduceStats:
    """Send `bodies`, or every line of `stream` as it arrives; returns the counts."""
    stats = stats if stats is not None else ProduceStats()
    template.message(b"-").validate()  # a bad topic or property is said before connecting
    limits.setdefault("max_line", max_line_bytes(template))
    send, receive = trio.open_memory_channel[list[bytes]](channel_batches)
    creds = credentials_from_env() if remoting is None else None
    async with Producer(
        group,
        namesrv,
        remoting=remoting,
        credentials=creds,
        network=network_from_env() if remoting is None else None,
    ) as producer:
        async with trio.open_nursery() as nursery:
            reading = trio.CancelScope()
            watching = trio.CancelScope()

            async def read() -> None:
                with reading:  # cancelled by a signal: what was read is still sent
                    if stream is not None:
                        await read_stream(stream, send, stats, **limits)
                    else:
                        await feed_bodies(bodies, send, stats)
                send.close()
                watching.cancel()

            async def signal_watch() -> None:
                with watching, trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as sigs:
                    async for signum in sigs:
                        stats.stopped_by = signum
                        reading.cancel()
                        return

            nursery.start_soon(read)
            if handle_signals:
                nursery.start_soon(signal_watch)
            # ends when the channel is closed and drained
            await send_batches(
                producer,
                template,
                receive,
                stats,
                on_results=on_results,
                on_sent=on_sent,
                senders=senders,
            )
    return stats
