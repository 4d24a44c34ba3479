"""The nameserver's Prometheus metrics (docs/metrics.md): RPC latency, connections, refusals,
live brokers, and the process.

Like the broker's (broker/broker_metrics.py), the request path only adds to plain counters
(common/metrics/remoting_metrics.py); everything else is read when Prometheus scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator

import trio
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.metrics.exporter import MetricsServerHandle, run_metrics_server
from common.metrics.remoting_metrics import RemotingCollector, RpcLatency
from common.remoting.server_limits import ServerLoad
from namesrv.config import NamesrvConfig
from namesrv.routeinfo import RouteInfoManager


def namesrv_labels(host: str, port: int) -> dict[str, str]:
    # a nameserver serves every cluster: no cluster of its own (an empty label is no label)
    return {"cluster": "", "node_type": "nameserver", "node_id": f"{host}:{port}"}


class NamesrvCollector(Collector):
    def __init__(self, labels: dict[str, str], routes: RouteInfoManager) -> None:
        self._names = list(labels)
        self._values = list(labels.values())
        self._routes = routes

    def collect(self) -> Iterator[Metric]:
        live = GaugeMetricFamily(
            "rocketmq_nameserver_live_brokers",
            "Broker addresses registered and live.",
            labels=self._names,
        )
        live.add_metric(self._values, len(self._routes.live_broker_addrs()))
        yield live


async def run_namesrv_metrics(
    config: NamesrvConfig,
    routes: RouteInfoManager,
    load: ServerLoad,
    listen_port: int,
    *,
    task_status: trio.TaskStatus[MetricsServerHandle | None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the nameserver's metrics on ``metricsPromExporterPort`` (0: reports None)."""
    if not config.metrics_prom_exporter_port:
        task_status.started(None)
        return
    labels = namesrv_labels(config.host, listen_port)
    latency = RpcLatency()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NamesrvCollector(labels, routes))
    registry.register(RemotingCollector(labels, latency, [load]))
    ProcessCollector(registry=registry)
    load.rpc_observer = latency.observe
    try:
        await run_metrics_server(
            registry,
            config.metrics_prom_exporter_host or config.host,
            config.metrics_prom_exporter_port,
            task_status=task_status,
        )
    finally:
        load.rpc_observer = None
