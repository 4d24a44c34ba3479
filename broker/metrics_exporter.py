"""The broker's metric families at scrape time, and the task that serves them (docs/metrics.md).

The counters of the request path are ``broker/broker_metrics.py`` (its docstring says which
number is counted where and why); :class:`BrokerCollector` reads them and the controller's
tables and store when Prometheus scrapes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence

import trio
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from broker.broker_metrics import MESSAGE_SIZE_BUCKETS, BrokerMetrics
from broker.controller import BrokerController
from broker.dledger.broker.applier import DLedgerNodeView
from broker.ha.service import HAService
from broker.store.api import MessageStore
from common.metrics.exporter import ExporterLimits, MetricsServerHandle, run_metrics_server
from common.metrics.remoting_metrics import RemotingCollector, RpcLatency, bucket_samples
from common.mixall import is_system_group
from common.model import ConsumeType
from common.remoting.server_limits import ServerLoad
from common.topics import RETRY_GROUP_TOPIC_PREFIX, is_system_topic


def _bool(flag: bool) -> str:
    return "true" if flag else "false"


def broker_labels(controller: BrokerController) -> dict[str, str]:
    """cluster, node_type, node_id (RocketMQ 5: the broker name) and ours, broker_id."""
    c = controller.config
    member = c.store.dleger_self_id if c.dledger else str(c.broker_id)
    return {
        "cluster": c.broker_cluster_name,
        "node_type": "broker",
        "node_id": c.broker_name,
        "broker_id": member or "",
    }


def _dir_bytes(path: str) -> int:
    """Bytes the files under ``path`` take on disk (allocated blocks: CommitLog segments are
    sparse until written)."""
    total = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        continue
        except OSError:
            continue
    return total


def _flush_behind(info: dict[str, str]) -> int:
    raw = info.get("remainHowManyDataToFlush", "0").split()
    try:
        return max(int(raw[0]), 0) if raw else 0
    except ValueError:
        return 0


class BrokerCollector(Collector):
    """Every broker metric family, computed when Prometheus scrapes (module docstring)."""

    def __init__(
        self,
        controller: BrokerController,
        metrics: BrokerMetrics,
        dledger: DLedgerNodeView | None = None,
    ) -> None:
        self.controller = controller
        self.metrics = metrics
        self.dledger = dledger
        labels = broker_labels(controller)
        self._names = list(labels)
        self._values = list(labels.values())

    def collect(self) -> Iterator[Metric]:
        yield from self._request_counters()
        yield from self._consumer_gauges()
        yield from self._table_gauges()
        yield from self._store_gauges()
        yield from self._ha_gauges()
        yield from self._dledger_gauges()

    # --- counted on the request path -----------------------------------------------------------

    def _request_counters(self) -> Iterator[Metric]:
        v = self._values
        m = self.metrics
        in_labels = ("topic", "message_type", "is_system")
        msgs_in = CounterMetricFamily(
            "rocketmq_messages_in_total", "Messages stored.", labels=[*self._names, *in_labels]
        )
        bytes_in = CounterMetricFamily(
            "rocketmq_throughput_in_total",
            "Bytes of the messages stored.",
            labels=[*self._names, *in_labels],
        )
        size = HistogramMetricFamily(
            "rocketmq_message_size",
            "Bytes per stored message (a batch: its mean), once per put.",
            labels=[*self._names, *in_labels],
        )
        for (topic, kind), row in list(m.puts.items()):
            lv = [*v, topic, kind, _bool(is_system_topic(topic))]
            msgs_in.add_metric(lv, row[0])
            bytes_in.add_metric(lv, row[1])
            size.add_metric(lv, bucket_samples(MESSAGE_SIZE_BUCKETS, row[2:-1]), row[-1])
        yield msgs_in
        yield bytes_in
        yield size
        out_labels = ("topic", "consumer_group", "is_system", "is_retry")
        msgs_out = CounterMetricFamily(
            "rocketmq_messages_out_total",
            "Messages returned by pulls.",
            labels=[*self._names, *out_labels],
        )
        bytes_out = CounterMetricFamily(
            "rocketmq_throughput_out_total",
            "Bytes of the messages returned by pulls.",
            labels=[*self._names, *out_labels],
        )
        for (topic, group), row in list(m.gets.items()):
            lv = [*v, topic, group, *self._system_retry(topic, group)]
            msgs_out.add_metric(lv, row[0])
            bytes_out.add_metric(lv, row[1])
        yield msgs_out
        yield bytes_out
        dlq = CounterMetricFamily(
            "rocketmq_send_to_dlq_messages_total",
            "Messages moved to the DLQ after their last retry.",
            labels=[*self._names, "topic", "consumer_group", "is_system"],
        )
        for (topic, group), n in list(m.dlq.items()):
            system = is_system_topic(topic) or is_system_group(group)
            dlq.add_metric([*v, topic, group, _bool(system)], n)
        yield dlq

    @staticmethod
    def _system_retry(topic: str, group: str) -> tuple[str, str]:
        retry = topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        system = not retry and (is_system_topic(topic) or is_system_group(group))
        return _bool(system), _bool(retry)

    # --- consumer progress -----------------------------------------------------------------------

    def _consumer_gauges(self) -> Iterator[Metric]:
        b = self.controller
        store = b.store
        offsets = b.consumer_offset_manager
        labels = [*self._names, "topic", "consumer_group", "is_system", "is_retry"]
        lag = GaugeMetricFamily(
            "rocketmq_consumer_lag_messages",
            "Messages stored and not yet consumed (GET_CONSUME_STATS's lag).",
            labels=labels,
        )
        lag_ms = GaugeMetricFamily(
            "rocketmq_consumer_lag_latency",
            "Milliseconds since the oldest message not yet consumed was stored.",
            labels=labels,
        )
        inflight = GaugeMetricFamily(
            "rocketmq_consumer_inflight_messages",
            "Messages pulled and not yet committed.",
            labels=labels,
        )
        ready = GaugeMetricFamily(
            "rocketmq_consumer_ready_messages",
            "Messages stored and not yet pulled.",
            labels=labels,
        )
        now_ms = int(time.time() * 1000)
        for group, topic in offsets.group_topics():
            tc = b.topic_config_manager.select_topic_config(topic)
            if tc is None:
                continue
            pulled = self.metrics.pulled.get((group, topic), {})
            total = flight = waiting = 0
            oldest = 0
            for q in range(tc.writeQueueNums):
                broker_offset = max(store.get_max_offset_in_queue(topic, q), 0)
                consumer = max(offsets.query_offset(group, topic, q), 0)
                behind = broker_offset - consumer
                if behind <= 0:
                    continue
                total += behind
                head = max(pulled.get(q, consumer), consumer)
                flight += min(head, broker_offset) - consumer
                waiting += max(broker_offset - head, 0)
                stored = _store_time_at(store, topic, q, consumer)
                if stored and (not oldest or stored < oldest):
                    oldest = stored
            lv = [*self._values, topic, group, *self._system_retry(topic, group)]
            lag.add_metric(lv, total)
            lag_ms.add_metric(lv, max(now_ms - oldest, 0) if oldest else 0)
            inflight.add_metric(lv, flight)
            ready.add_metric(lv, waiting)
        yield lag
        yield lag_ms
        yield inflight
        yield ready

    # --- tables, connections ---------------------------------------------------------------------

    def _table_gauges(self) -> Iterator[Metric]:
        b = self.controller
        v = self._values
        topics = GaugeMetricFamily(
            "rocketmq_topic_number", "Topics in the topic table.", labels=self._names
        )
        topics.add_metric(v, len(b.topic_config_manager.table))
        yield topics
        groups = GaugeMetricFamily(
            "rocketmq_consumer_group_number",
            "Subscription groups in the group table.",
            labels=self._names,
        )
        groups.add_metric(v, len(b.subscription_group_manager.table))
        yield groups
        perm = GaugeMetricFamily(
            "rocketmq_broker_permission", "brokerPermission.", labels=self._names
        )
        perm.add_metric(v, b.config.broker_permission)
        yield perm
        producers: dict[str, int] = {}
        for channels in list(b.producer_manager.groups.values()):
            for info in channels.values():
                producers[info.language] = producers.get(info.language, 0) + 1
        prod = GaugeMetricFamily(
            "rocketmq_producer_connections",
            "Producer connections.",
            labels=[*self._names, "language"],
        )
        for language, n in sorted(producers.items()):
            prod.add_metric([*v, language.lower()], n)
        yield prod
        cons = GaugeMetricFamily(
            "rocketmq_consumer_connections",
            "Consumer connections.",
            labels=[*self._names, "consumer_group", "language", "consume_mode"],
        )
        for group, ginfo in sorted(b.consumer_manager.groups.items()):
            mode = "pull" if ginfo.consume_type == ConsumeType.CONSUME_ACTIVELY else "push"
            per_language: dict[str, int] = {}
            for ch in ginfo.channels.values():
                per_language[ch.language] = per_language.get(ch.language, 0) + 1
            for language, n in sorted(per_language.items()):
                cons.add_metric([*v, group, language.lower(), mode], n)
        yield cons

    # --- the store -------------------------------------------------------------------------------

    def _store_gauges(self) -> Iterator[Metric]:
        b = self.controller
        v = self._values
        store = b.store
        info = store.runtime_info()
        size = GaugeMetricFamily(
            "rocketmq_storage_size", "Bytes the store's files take on disk.", labels=self._names
        )
        size.add_metric(v, _dir_bytes(b.config.store.store_path_root_dir))
        yield size
        flush = GaugeMetricFamily(
            "rocketmq_storage_flush_behind_bytes",
            "CommitLog bytes written and not yet flushed.",
            labels=self._names,
        )
        flush.add_metric(v, _flush_behind(info))
        yield flush
        dispatch = GaugeMetricFamily(
            "rocketmq_storage_dispatch_behind_bytes",
            "CommitLog bytes not yet dispatched to the ConsumeQueues.",
            labels=self._names,
        )
        dispatch.add_metric(v, max(store.dispatch_behind_bytes, 0))
        yield dispatch
        flags = store.flags
        ratio = GaugeMetricFamily(
            "rocketmq_storage_disk_used_ratio",
            "Used share of the CommitLog's filesystem.",
            labels=self._names,
        )
        try:
            ratio.add_metric(v, float(info.get("commitLogDiskRatio", flags.disk_ratio)))
        except ValueError:
            ratio.add_metric(v, flags.disk_ratio)
        yield ratio
        refused = GaugeMetricFamily(
            "rocketmq_storage_put_refused",
            "1 while the store refuses puts for this reason.",
            labels=[*self._names, "reason"],
        )
        refused.add_metric([*v, "disk_full"], 1 if flags.disk_full else 0)
        refused.add_metric([*v, "logics_queue_error"], 1 if flags.logics_queue_error else 0)
        yield refused

    # --- replication -----------------------------------------------------------------------------

    def _ha_gauges(self) -> Iterator[Metric]:
        ha = self.controller.ha
        if not isinstance(ha, HAService) or self.controller.is_slave:
            return
        v = self._values
        lag_b = GaugeMetricFamily(
            "rocketmq_ha_slave_lag_bytes",
            "The master's CommitLog max offset minus what the slave acknowledged.",
            labels=[*self._names, "slave_addr"],
        )
        lag_ms = GaugeMetricFamily(
            "rocketmq_ha_slave_lag_ms",
            "Milliseconds since the slave last had everything the master had.",
            labels=[*self._names, "slave_addr"],
        )
        slaves = ha.slaves()
        for s in slaves:
            lag_b.add_metric([*v, s.addr], s.lag_bytes)
            lag_ms.add_metric([*v, s.addr], int(s.lag_seconds * 1000))
        yield lag_b
        yield lag_ms
        conns = GaugeMetricFamily(
            "rocketmq_ha_slave_connections", "Slaves connected.", labels=self._names
        )
        conns.add_metric(v, len(slaves))
        yield conns

    def _dledger_gauges(self) -> Iterator[Metric]:
        node = self.dledger
        if node is None:
            return
        names = [*self._names, "dledger_group", "dledger_member"]
        lv = [*self._values, node.config.group, node.config.self_id]
        role = GaugeMetricFamily(
            "rocketmq_dledger_role",
            "1 for the member's current Raft role.",
            labels=[*names, "role"],
        )
        for r in ("leader", "follower", "candidate"):
            role.add_metric([*lv, r], 1 if node.role.value.lower() == r else 0)
        yield role
        for name, doc, value in (
            ("rocketmq_dledger_term", "The member's current term.", node.term),
            (
                "rocketmq_dledger_ledger_end_index",
                "Index of the last entry in the member's log.",
                node.log.end_index,
            ),
            (
                "rocketmq_dledger_committed_index",
                "The member's committed index.",
                node.committed_index,
            ),
        ):
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(lv, value)
            yield g


def _store_time_at(store: MessageStore, topic: str, queue_id: int, offset: int) -> int:
    """Store timestamp (ms) of the message at ``offset`` of the queue; 0 if unknown (as
    GET_CONSUME_STATS's lastTimestamp, broker/processor/admin.py)."""
    phys = store.get_commit_log_offset_in_queue(topic, queue_id, offset)
    m = store.look_message_by_offset(phys) if phys or offset == 0 else None
    return m.store_timestamp if m is not None and m.topic == topic else 0


def broker_registry(
    controller: BrokerController,
    metrics: BrokerMetrics,
    latency: RpcLatency,
    loads: Sequence[ServerLoad],
    dledger: DLedgerNodeView | None = None,
) -> CollectorRegistry:
    """One broker's registry (a registry per node: tests run several in one process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(controller, metrics, dledger))
    registry.register(RemotingCollector(broker_labels(controller), latency, loads))
    ProcessCollector(registry=registry)
    return registry


async def run_broker_metrics(
    controller: BrokerController,
    loads: Sequence[ServerLoad],
    *,
    dledger: DLedgerNodeView | None = None,
    limits: ExporterLimits | None = None,
    task_status: trio.TaskStatus[MetricsServerHandle | None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Count and serve the broker's metrics on ``metricsPromExporterPort`` (0: reports None
    and returns: no counting, no port)."""
    c = controller.config
    if not c.metrics_prom_exporter_port:
        task_status.started(None)
        return
    metrics = BrokerMetrics()
    latency = RpcLatency()
    for load in loads:
        load.rpc_observer = latency.observe
    controller.metrics = metrics
    registry = broker_registry(controller, metrics, latency, loads, dledger)
    host = c.metrics_prom_exporter_host or c.listen_host
    try:
        await run_metrics_server(
            registry, host, c.metrics_prom_exporter_port, limits=limits, task_status=task_status
        )
    finally:
        controller.metrics = None
        for load in loads:
            load.rpc_observer = None
