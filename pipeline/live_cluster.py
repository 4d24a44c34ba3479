"""The live source's driver side: which queues a query reads, their offsets, and commits.

Theory of operation. `LiveCluster` resolves topics (a comma list or a pattern over the
nameserver's topic list, system topics excluded), finds every readable queue with the addresses
of its broker's nodes (master first; a slave first with readFromSlave; only slaves when the
master is gone) and asks their min/max offsets, searches offsets by timestamp and commits
consumer offsets.  It runs in Spark's driver, on plain threads, so it talks to the cluster
through `pipeline.blocking_client`.  The reading itself happens on the executors
(`pipeline.live_reader`).
"""

from __future__ import annotations

import logging
import re

import attrs

from common.errors import RemotingConnectError, RemotingTimeoutError, RmqError, error_for_response
from common.message import decode_records
from common.model import ClusterInfo, MessageQueue, TopicList, TopicRouteData
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.serde import from_json
from common.topics import is_system_topic
from pipeline.blocking_client import BlockingClient
from pipeline.errors import DataLossError, OptionError
from pipeline.options import ReaderOptions
from pipeline.source_offsets import QueueKey
from rmq.client_api import PULL_SUBSCRIPTION
from rmq.topic_publish_info import subscribe_queues

log = logging.getLogger(__name__)

# the answers to a PULL that are not errors
_PULL_OK = frozenset(
    {
        ResponseCode.SUCCESS,
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
        ResponseCode.PULL_OFFSET_MOVED,
    }
)


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
        self,
        addrs: tuple[str, ...],
        code: int,
        ext: dict,
        *,
        ok: frozenset[int] = frozenset({ResponseCode.SUCCESS}),
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
        ext = {
            "topic": k.topic,
            "queueId": k.queue_id,
            "bname": k.broker,
            "timestamp": timestamp_ms,
        }
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
        k = state.key
        ext = {
            "consumerGroup": self.opts.pull_group,
            "topic": k.topic,
            "queueId": k.queue_id,
            "queueOffset": offset,
            "maxMsgNums": 1,
            "sysFlag": PULL_SUBSCRIPTION,
            "commitOffset": 0,
            "suspendTimeoutMillis": 0,
            "subscription": "*",
            "subVersion": 0,
            "expressionType": "TAG",
            "bname": k.broker,
        }
        resp = self._first(state.addrs, RequestCode.PULL_MESSAGE, ext, ok=_PULL_OK)
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
                    {
                        "consumerGroup": group,
                        "topic": key.topic,
                        "queueId": key.queue_id,
                        "commitOffset": offset,
                        "bname": key.broker,
                    },
                )
            except RmqError as exc:
                # the query's checkpoint is the source of truth; the group's offsets only show
                # its progress, so a broker hiccup must not fail the query
                log.warning("offset of %s for group %s not committed: %s", key, group, exc)
