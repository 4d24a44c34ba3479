"""The live source's executor side: reading one queue's [start, end) into Arrow batches.

Theory of operation. `read_task` pulls [start, end) of one queue with maxMsgNums =
pullBatchSize; the broker caps each answer by maxTransferCountOnMessageInMemory (32 by default)
and maxTransferBytesOnMessageInMemory (256 KiB), raise both in broker.conf for throughput.
Records whose queue offset lies outside the range are dropped, and the tag filter is re-checked
exactly because the broker compares only tag hash codes. A pull answered OFFSET_MOVED below the
queue's min offset, or a gap in the offsets of an unfiltered read, is data loss: it raises unless
failOnDataLoss=false.

A node whose queue ends before the offset asked for is behind, not lossy: the range's end was
planned from whichever node answered first, and another can lag it (a slave behind its master, a
DLedger member just elected that has not yet applied all the old leader committed). The read
tries the range's other nodes, then polls them for up to CATCH_UP_WAIT; only offsets no node
reaches by then count as lost.

The pulls go over `pipeline.blocking_client` (Spark's Python workers have no event loop). We
measured rmq.sync against it for the read loop: rmq.sync hands every pull to a Trio thread and
decodes each record into a MessageExt, while here the pull body (raw CommitLog records) goes
straight to the compiled `pipeline.record_batch.decode_records` (docs/benchmarks.md, Spark
section: raw-pull vs spark-live); nothing but a socket lives in a worker. The pulls of one task
run in a thread of their own (`pipeline.prefetch`), up to 8 bodies ahead of the decoder, and
the thread's errors are raised in the reading generator, in order.

The driver side, which plans the tasks, is `pipeline.live_cluster`.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import attrs

from common.errors import RemotingConnectError, RemotingTimeoutError, error_for_response
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from pipeline.blocking_client import BlockingClient
from pipeline.errors import DataLossError
from pipeline.prefetch import prefetched
from rmq.client_api import PULL_SUBSCRIPTION

if TYPE_CHECKING:  # pyarrow is imported where batches are made, on the executors
    import pyarrow as pa

log = logging.getLogger(__name__)


class PullClient(Protocol):
    """What a read needs of its connection: `BlockingClient`, or a scripted one in tests."""

    def call(self, addr: str, code: int, ext: dict | None = None) -> RemotingCommand: ...

    def __enter__(self) -> PullClient: ...

    def __exit__(self, *exc: object) -> None: ...


@attrs.frozen
class PullTask:
    """Everything one Spark partition needs to read its range (plain, picklable values)."""

    namesrv: str
    topic: str
    broker: str
    queue_id: int
    start: int
    end: int
    addrs: tuple[str, ...]
    group: str
    tags: str
    timeout: float
    pull_batch_size: int
    fail_on_data_loss: bool
    read_from_slave: bool = False


def _keep(
    batch: pa.RecordBatch, start: int, end: int, tags: frozenset[str] | None
) -> pa.RecordBatch:
    import pyarrow.compute as pc

    if batch.num_rows == 0:
        return batch
    qo = batch.column("queueOffset")
    mask = pc.and_(pc.greater_equal(qo, start), pc.less(qo, end))
    if tags is not None:
        mask = pc.and_(mask, pc.fill_null(pc.is_in(batch.column("tags"), pa_strings(tags)), False))
    return batch.filter(mask)


def pa_strings(values: frozenset[str]) -> pa.Array:
    import pyarrow as pa

    return pa.array(sorted(values), type=pa.string())


# how long a range's nodes may all stay behind it before the missing offsets count as lost: a
# DLedger election plus the new leader's apply, or a slave's catch-up, take seconds
CATCH_UP_WAIT = 30.0
_CATCH_UP_POLL = 0.2

# bytes of raw records decoded at once: one vectorized decode per chunk, not per pull
DECODE_CHUNK = 4 << 20
# a CommitLog record's queue offset sits after totalSize, magic, bodyCRC, queueId and flag
_QUEUE_OFFSET = struct.Struct(">q")
_QUEUE_OFFSET_POS = 20


def read_task(task: PullTask) -> Iterator:
    """Arrow record batches of the messages of `task`'s queue in [start, end).

    The pulls run in a thread of their own (`pipeline.prefetch`) while this generator decodes and
    Spark ships the batches: the broker's answer time overlaps the decode instead of adding to
    it.  Errors of the pull loop (data loss, broker errors) are raised here, unchanged.
    """
    from pipeline.record_batch import decode_records as decode
    from rmq.message_selector import parse_tag_expression

    wanted = parse_tag_expression(task.tags)
    chunk: list[bytes] = []
    chunk_bytes = 0

    def flush() -> pa.RecordBatch:
        batch = decode(b"".join(chunk), broker_name=task.broker)
        chunk.clear()
        return _keep(batch, task.start, task.end, wanted)

    for body in prefetched(lambda: _pull_bodies(task, wanted)):
        chunk.append(body)
        chunk_bytes += len(body)
        if chunk_bytes >= DECODE_CHUNK:
            chunk_bytes = 0
            batch = flush()
            if batch.num_rows:
                yield batch
    if chunk:
        batch = flush()
        if batch.num_rows:
            yield batch


def _pull_bodies(
    task: PullTask,
    wanted: frozenset[str] | None,
    *,
    connect: Callable[[float], PullClient] = BlockingClient,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[bytes]:
    """The raw PULL bodies of [start, end) of `task`'s queue, in order."""
    where = f"{task.topic} {task.broker}/{task.queue_id}"
    offset = task.start
    addrs = list(task.addrs)
    behind_since: float | None = None  # when every node first proved behind `offset`
    behind_tried = 0  # nodes found behind `offset` since the last poll
    with connect(task.timeout) as client:
        while offset < task.end:
            ext = {
                "consumerGroup": task.group,
                "topic": task.topic,
                "queueId": task.queue_id,
                "queueOffset": offset,
                "maxMsgNums": min(task.pull_batch_size, task.end - offset),
                "sysFlag": PULL_SUBSCRIPTION,
                "commitOffset": 0,
                "suspendTimeoutMillis": 0,
                "subscription": task.tags if wanted is not None else "*",
                "subVersion": int(time.time() * 1000),
                "expressionType": "TAG",
                "bname": task.broker,
            }
            resp = _pull(client, addrs, ext, task)
            code = resp.code
            nxt = int(resp.ext_fields.get("nextBeginOffset", offset))
            if _is_behind(resp, offset):
                behind_tried += 1
                if behind_tried < len(addrs):
                    addrs.append(addrs.pop(0))
                    continue
                now = clock()
                if behind_since is None:
                    behind_since = now
                if now - behind_since < CATCH_UP_WAIT:
                    behind_tried = 0
                    addrs.append(addrs.pop(0))
                    sleep(_CATCH_UP_POLL)
                    continue
                _lost(
                    task,
                    f"{where}: offsets {offset}..{task.end - 1} are not in the queue on any "
                    f"node after {CATCH_UP_WAIT:g} s (its max offset is "
                    f"{resp.ext_fields.get('maxOffset')})",
                )
                break
            behind_since = None
            behind_tried = 0
            if code == ResponseCode.SUCCESS:
                body = resp.body_bytes()
                if wanted is None and len(body) >= _QUEUE_OFFSET_POS + 8:
                    (first,) = _QUEUE_OFFSET.unpack_from(body, _QUEUE_OFFSET_POS)
                    if first > offset:
                        _lost(task, f"{where}: offsets {offset}..{first - 1} are gone")
                yield body
            elif code == ResponseCode.PULL_OFFSET_MOVED:
                _lost(
                    task,
                    f"{where}: offset {offset} is no longer in the queue "
                    f"(min {resp.ext_fields.get('minOffset')}, max "
                    f"{resp.ext_fields.get('maxOffset')})",
                )
                if nxt <= offset:
                    break
            elif code == ResponseCode.PULL_NOT_FOUND:
                _lost(
                    task,
                    f"{where}: offsets {offset}..{task.end - 1} are not in the queue "
                    f"(its max offset is {resp.ext_fields.get('maxOffset')})",
                )
                break
            elif code != ResponseCode.PULL_RETRY_IMMEDIATELY:
                raise error_for_response(resp.code, resp.remark)
            if nxt <= offset:
                raise DataLossError(f"{where}: the broker did not advance past offset {offset}")
            offset = nxt


def _is_behind(resp: RemotingCommand, offset: int) -> bool:
    """True when the answering node's queue simply ends at or before `offset`."""
    if resp.code not in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED):
        return False
    max_offset = resp.ext_fields.get("maxOffset")
    return max_offset is not None and offset >= int(max_offset)


def _pull(client: PullClient, addrs: list[str], ext: dict, task: PullTask) -> RemotingCommand:
    """PULL_MESSAGE to the first node that answers; a dead node moves to the back."""
    last: Exception | None = None
    for _ in range(len(addrs)):
        addr = addrs[0]
        try:
            return client.call(addr, RequestCode.PULL_MESSAGE, ext)
        except (RemotingConnectError, RemotingTimeoutError) as exc:
            last = exc
            addrs.append(addrs.pop(0))
    raise RemotingConnectError(
        f"no node of broker {task.broker} answered a pull of {task.topic}: {last}"
    )


def _lost(task: PullTask, msg: str) -> None:
    if task.fail_on_data_loss:
        raise DataLossError(
            f"{msg}. Some data may have been lost; set failOnDataLoss=false to skip it."
        )
    log.warning("%s (failOnDataLoss=false: skipped)", msg)
