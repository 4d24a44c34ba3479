"""Talking to a live cluster from Spark: a small blocking client, metadata, and queue reads.

Theory of operation. Spark calls the reader from plain threads of the driver and of Python
workers, so this module speaks the remoting protocol over blocking sockets: one request, one
response per connection at a time, with the sans-I/O codec of `common.remoting.codec`. We
measured rmq.sync against it for the read loop: rmq.sync hands every pull to a Trio thread and
decodes each record into a MessageExt, while here the pull body (raw CommitLog records) goes
straight to the compiled `pipeline.record_batch.decode_records` (docs/benchmarks.md, Spark
section: raw-pull vs spark-live); nothing but a socket lives in a worker.

`LiveCluster` (driver) resolves topics (a comma list or a pattern over the nameserver's topic
list, system topics excluded), finds every readable queue with the addresses of its broker's
nodes (master first; a slave first with readFromSlave; only slaves when the master is gone)
and asks their min/max offsets, searches offsets by timestamp and commits consumer offsets.

`read_task` (executor) pulls [start, end) of one queue with maxMsgNums = pullBatchSize; the
broker caps each answer by maxTransferCountOnMessageInMemory (32 by default) and
maxTransferBytesOnMessageInMemory (256 KiB), raise both in broker.conf for throughput. Records
whose queue offset lies outside the range are dropped, and the tag filter is re-checked exactly
because the broker compares only tag hash codes. A pull answered OFFSET_MOVED, or a gap in the
offsets of an unfiltered read, is data loss: it raises unless failOnDataLoss=false. The pulls
of one task run in a thread of their own, up to 8 bodies ahead of the decoder (the numba decoder
releases the GIL), so the broker's answer time overlaps decoding and Spark's transfer instead of
adding to them; the thread's errors are raised in the reading generator, in order.
"""

from __future__ import annotations

import itertools
import logging
import queue
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import attrs

from common.errors import (
    RemotingConnectError,
    RemotingTimeoutError,
    RmqError,
    error_for_response,
)
from common.model import ClusterInfo, MessageQueue, TopicList, TopicRouteData
from common.remoting.codec import decode_frame, encode
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.serde import from_json
from common.topics import SYSTEM_TOPICS, is_system_topic  # noqa: F401 - re-exported
from pipeline.offsets import QueueKey
from pipeline.options import OptionError, ReaderOptions
from rmq.client_api import PULL_SUBSCRIPTION
from rmq.topic_publish_info import subscribe_queues

log = logging.getLogger(__name__)

__all__ = [
    "BlockingClient",
    "DataLossError",
    "LiveCluster",
    "PullTask",
    "QueueState",
    "is_system_topic",
    "read_task",
]

_LEN = struct.Struct(">i")
PULL_OK = frozenset(
    {ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY,
     ResponseCode.PULL_OFFSET_MOVED}
)  # fmt: skip

class DataLossError(RuntimeError):
    """Offsets a query planned to read are gone (retention) or never existed (store replaced)."""


class BlockingClient:
    """Request/response over blocking sockets, one cached connection per address."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        # addr -> connected socket; dropped on any transport error (the stream is out of sync)
        self._socks: dict[str, socket.socket] = {}
        self._opaque = itertools.count(1)

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self, addr: str) -> socket.socket:
        sock = self._socks.get(addr)
        if sock is None:
            host, _, port = addr.rpartition(":")
            try:
                sock = socket.create_connection((host, int(port)), timeout=self.timeout)
            except OSError as exc:
                raise RemotingConnectError(f"connect to {addr} failed: {exc}") from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks[addr] = sock
        return sock

    def call(
        self, addr: str, code: int, ext: dict | None = None, *, timeout: float | None = None
    ) -> RemotingCommand:
        try:
            return self._call_once(addr, code, ext, timeout)
        except RemotingConnectError:
            # A cached connection may have died since its last use (the node restarted): every
            # request sent here is safe to repeat, so try once more on a fresh connection.
            return self._call_once(addr, code, ext, timeout)

    def _call_once(
        self, addr: str, code: int, ext: dict | None, timeout: float | None
    ) -> RemotingCommand:
        cmd = RemotingCommand.request(code, ext)
        cmd.opaque = next(self._opaque)
        sock = self._connect(addr)
        sock.settimeout(self.timeout if timeout is None else timeout)
        try:
            sock.sendall(encode(cmd))
            while True:
                (length,) = _LEN.unpack(_recv_exact(sock, 4))
                resp = decode_frame(_recv_exact(sock, length))
                if resp.is_response and resp.opaque == cmd.opaque:
                    return resp
        except TimeoutError:
            self._drop(addr)
            raise RemotingTimeoutError(f"no answer from {addr} to request {code}") from None
        except OSError as exc:
            self._drop(addr)
            raise RemotingConnectError(f"connection to {addr} failed: {exc}") from None

    def call_ok(self, addr: str, code: int, ext: dict | None = None) -> RemotingCommand:
        resp = self.call(addr, code, ext)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for_response(resp.code, resp.remark)
        return resp

    def _drop(self, addr: str) -> None:
        sock = self._socks.pop(addr, None)
        if sock is not None:
            sock.close()


def _recv_exact(sock: socket.socket, n: int) -> memoryview:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionResetError("connection closed by the peer")
        got += k
    return view


def node_order(addrs: dict[int, str], read_from_slave: bool) -> tuple[str, ...]:
    """Addresses of a broker's nodes in the order to try them."""
    ids = sorted(addrs)
    if read_from_slave:
        ids.sort(key=lambda i: (i == 0, i))  # slaves first, the master last
    return tuple(addrs[i] for i in ids)


@attrs.frozen
class QueueState:
    key: QueueKey
    min_offset: int
    max_offset: int
    addrs: tuple[str, ...]  # the nodes to read from, preferred first
    master: str | None


@attrs.define(eq=False)
class LiveCluster:
    """Driver-side view of the cluster for one query; `close()` when done."""

    opts: ReaderOptions
    client: BlockingClient = attrs.field(default=None)

    def __attrs_post_init__(self) -> None:
        if self.client is None:
            self.client = BlockingClient(self.opts.timeout)

    def close(self) -> None:
        self.client.close()

    def _namesrv(self, code: int, ext: dict | None = None) -> RemotingCommand:
        last: Exception | None = None
        for addr in self.opts.namesrv.split(";"):
            try:
                return self.client.call(addr.strip(), code, ext)
            except (RemotingConnectError, RemotingTimeoutError) as exc:
                last = exc
        raise RemotingConnectError(
            f"option namesrv: no nameserver of {self.opts.namesrv!r} answered ({last})"
        )

    def route(self, topic: str) -> TopicRouteData | None:
        resp = self._namesrv(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        if resp.code != ResponseCode.SUCCESS:
            raise error_for_response(resp.code, resp.remark)
        return from_json(resp.body_bytes(), TopicRouteData)

    def topics(self) -> list[str]:
        """The topics of the `topic` / `topicPattern` option; OptionError when there are none."""
        if self.opts.topic_pattern is None:
            return list(self.opts.topics)
        resp = self._namesrv(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for_response(resp.code, resp.remark)
        names = from_json(resp.body_bytes(), TopicList).topicList
        info_resp = self._namesrv(RequestCode.GET_BROKER_CLUSTER_INFO)
        own: frozenset[str] = frozenset()
        if info_resp.code == ResponseCode.SUCCESS:
            info = from_json(info_resp.body_bytes(), ClusterInfo)
            own = frozenset(info.brokerAddrTable) | frozenset(info.clusterAddrTable)
        rx = re.compile(self.opts.topic_pattern)
        found = sorted(t for t in names if rx.fullmatch(t) and not is_system_topic(t, own))
        return found

    def queues(self, *, require_all: bool) -> dict[QueueKey, QueueState]:
        """Every readable queue of the topics with its min/max offset.

        Unknown topics raise OptionError. A broker with no live node is skipped (a stream keeps
        its offsets until it is back), or raises with `require_all` (a batch would miss data).
        """
        out: dict[QueueKey, QueueState] = {}
        topics = self.topics()
        if self.opts.topic_pattern is not None and not topics:
            raise OptionError(
                f"option topicPattern: {self.opts.topic_pattern!r} matches no topic of the "
                "nameserver"
            )
        for topic in topics:
            route = self.route(topic)
            if route is None:
                raise OptionError(
                    f"option topic: topic {topic!r} does not exist on nameserver "
                    f"{self.opts.namesrv}"
                )
            brokers = {bd.brokerName: bd.brokerAddrs for bd in route.brokerDatas}
            for mq in subscribe_queues(topic, route):
                addrs = node_order(brokers.get(mq.brokerName, {}), self.opts.read_from_slave)
                if not addrs:
                    if require_all:
                        raise DataLossError(
                            f"broker {mq.brokerName} of topic {topic} has no live node: "
                            "its queues cannot be read"
                        )
                    continue
                key = QueueKey(topic, mq.brokerName, mq.queueId)
                lo, hi = self._min_max(addrs, mq)
                master = brokers[mq.brokerName].get(0)
                out[key] = QueueState(key, lo, hi, addrs, master)
        return out

    def _first(
        self, addrs: tuple[str, ...], code: int, ext: dict, *, ok=frozenset({ResponseCode.SUCCESS})
    ) -> RemotingCommand:
        last: Exception | None = None
        for addr in addrs:
            try:
                resp = self.client.call(addr, code, ext)
                if resp.code not in ok:
                    raise error_for_response(resp.code, resp.remark)
                return resp
            except (RemotingConnectError, RemotingTimeoutError) as exc:
                last = exc
        assert last is not None
        raise last

    def _min_max(self, addrs: tuple[str, ...], mq: MessageQueue) -> tuple[int, int]:
        ext = {"topic": mq.topic, "queueId": mq.queueId, "bname": mq.brokerName}
        lo = int(self._first(addrs, RequestCode.GET_MIN_OFFSET, ext).ext_fields.get("offset", 0))
        hi = int(self._first(addrs, RequestCode.GET_MAX_OFFSET, ext).ext_fields.get("offset", 0))
        return lo, hi

    def search_offset(self, state: QueueState, timestamp_ms: int) -> int:
        """The first offset stored at or after `timestamp_ms` (SEARCH_OFFSET_BY_TIMESTAMP)."""
        k = state.key
        ext = {"topic": k.topic, "queueId": k.queue_id, "bname": k.broker,
               "timestamp": timestamp_ms}  # fmt: skip
        resp = self._first(state.addrs, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, ext)
        offset = int(resp.ext_fields.get("offset", 0))
        # The broker answers the offset whose store time is *closest* (ConsumeQueue's binary
        # search), which may be the last message before the timestamp: step past those, so the
        # start is the first message stored at or after it (Kafka's offsetsForTimes).
        while offset < state.max_offset:
            stored = self._store_timestamp(state, offset)
            if stored is None or stored >= timestamp_ms:
                break
            offset += 1
        return offset

    def _store_timestamp(self, state: QueueState, offset: int) -> int | None:
        from common.message import decode_records

        k = state.key
        ext = {
            "consumerGroup": self.opts.pull_group, "topic": k.topic, "queueId": k.queue_id,
            "queueOffset": offset, "maxMsgNums": 1, "sysFlag": PULL_SUBSCRIPTION,
            "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*",
            "subVersion": 0, "expressionType": "TAG", "bname": k.broker,
        }  # fmt: skip
        resp = self._first(state.addrs, RequestCode.PULL_MESSAGE, ext, ok=PULL_OK)
        if resp.code != ResponseCode.SUCCESS:
            return None
        msgs = [m for m in decode_records(resp.body_bytes()) if m.queue_offset == offset]
        return msgs[0].store_timestamp if msgs else None

    def commit(self, group: str, offsets: dict[QueueKey, int], masters: dict[str, str]) -> None:
        """UPDATE_CONSUMER_OFFSET of each queue to its broker's master (skipped without one)."""
        for key, offset in offsets.items():
            addr = masters.get(key.broker)
            if addr is None:
                log.warning("no master of %s: offset of %s not committed", key.broker, key)
                continue
            try:
                self.client.call_ok(
                    addr,
                    RequestCode.UPDATE_CONSUMER_OFFSET,
                    {"consumerGroup": group, "topic": key.topic, "queueId": key.queue_id,
                     "commitOffset": offset, "bname": key.broker},
                )  # fmt: skip
            except RmqError as exc:
                # the query's checkpoint is the source of truth; the group's offsets only show
                # its progress, so a broker hiccup must not fail the query
                log.warning("offset of %s for group %s not committed: %s", key, group, exc)


# --- executor side ------------------------------------------------------------------------------


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


def _keep(batch, start: int, end: int, tags: frozenset[str] | None):
    import pyarrow.compute as pc

    if batch.num_rows == 0:
        return batch
    qo = batch.column("queueOffset")
    mask = pc.and_(pc.greater_equal(qo, start), pc.less(qo, end))
    if tags is not None:
        mask = pc.and_(mask, pc.fill_null(pc.is_in(batch.column("tags"), pa_strings(tags)), False))
    return batch.filter(mask)


def pa_strings(values: frozenset[str]):
    import pyarrow as pa

    return pa.array(sorted(values), type=pa.string())


# bytes of raw records decoded at once: one vectorized decode per chunk, not per pull
DECODE_CHUNK = 4 << 20
# a CommitLog record's queue offset sits after totalSize, magic, bodyCRC, queueId and flag
_QUEUE_OFFSET = struct.Struct(">q")
_QUEUE_OFFSET_POS = 20


def read_task(task: PullTask) -> Iterator:
    """Arrow record batches of the messages of `task`'s queue in [start, end).

    The pulls run in a thread of their own (`_prefetched`) while this generator decodes and
    Spark ships the batches: the broker's answer time overlaps the decode instead of adding to
    it.  Errors of the pull loop (data loss, broker errors) are raised here, unchanged.
    """
    from pipeline.record_batch import decode_records as decode
    from rmq.pull_consumer import parse_tag_expression

    wanted = parse_tag_expression(task.tags)
    chunk: list[bytes] = []
    chunk_bytes = 0

    def flush():
        batch = decode(b"".join(chunk), broker_name=task.broker)
        chunk.clear()
        return _keep(batch, task.start, task.end, wanted)

    for body in _prefetched(lambda: _pull_bodies(task, wanted)):
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


def _pull_bodies(task: PullTask, wanted) -> Iterator[bytes]:
    """The raw PULL bodies of [start, end) of `task`'s queue, in order."""
    where = f"{task.topic} {task.broker}/{task.queue_id}"
    offset = task.start
    addrs = list(task.addrs)
    with BlockingClient(task.timeout) as client:
        while offset < task.end:
            ext = {
                "consumerGroup": task.group, "topic": task.topic, "queueId": task.queue_id,
                "queueOffset": offset, "maxMsgNums": min(task.pull_batch_size, task.end - offset),
                "sysFlag": PULL_SUBSCRIPTION, "commitOffset": 0, "suspendTimeoutMillis": 0,
                "subscription": task.tags if wanted is not None else "*",
                "subVersion": int(time.time() * 1000), "expressionType": "TAG",
                "bname": task.broker,
            }  # fmt: skip
            resp = _pull(client, addrs, ext, task)
            code = resp.code
            nxt = int(resp.ext_fields.get("nextBeginOffset", offset))
            if code == ResponseCode.SUCCESS:
                body = resp.body_bytes()
                if wanted is None and len(body) >= _QUEUE_OFFSET_POS + 8:
                    (first,) = _QUEUE_OFFSET.unpack_from(body, _QUEUE_OFFSET_POS)
                    if first > offset:
                        _lost(task, f"{where}: offsets {offset}..{first - 1} are gone")
                yield body
            elif code == ResponseCode.PULL_OFFSET_MOVED:
                _lost(task, f"{where}: offset {offset} is no longer in the queue "
                      f"(min {resp.ext_fields.get('minOffset')}, max "
                      f"{resp.ext_fields.get('maxOffset')})")  # fmt: skip
                if nxt <= offset:
                    break
            elif code == ResponseCode.PULL_NOT_FOUND:
                _lost(task, f"{where}: offsets {offset}..{task.end - 1} are not in the queue "
                      f"(its max offset is {resp.ext_fields.get('maxOffset')})")  # fmt: skip
                break
            elif code != ResponseCode.PULL_RETRY_IMMEDIATELY:
                raise error_for_response(resp.code, resp.remark)
            if nxt <= offset:
                raise DataLossError(f"{where}: the broker did not advance past offset {offset}")
            offset = nxt


# PULL bodies waiting for the decoder: with 1024-message pulls ~2 MiB, enough to ride out jitter
PREFETCH_DEPTH = 8
_END = object()


@attrs.frozen
class _Failed:
    exc: BaseException


def _prefetched(make: Callable[[], Iterator], depth: int = PREFETCH_DEPTH) -> Iterator:
    """The items of ``make()``, produced by a thread up to ``depth`` ahead of the consumer.

    An exception of the producer is raised to the consumer in order (after the items before
    it).  Closing this generator early (Spark stopped reading) stops the producer and closes its
    iterator (and so its sockets) before returning.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        it = make()
        try:
            for item in it:
                if not put(item):
                    return
            put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            put(_Failed(exc))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=run, name="rmq-pull-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item
    finally:
        stop.set()
        thread.join()


def _pull(client: BlockingClient, addrs: list[str], ext: dict, task: PullTask) -> RemotingCommand:
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
