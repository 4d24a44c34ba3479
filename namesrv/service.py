"""run_namesrv: the nameserver service (NamesrvController + NamesrvStartup).

Theory of operation
-------------------
One nursery holds the remoting server (`serve_remoting`, one task per connection and
per request), the metrics port when `metricsPromExporterPort` is set (namesrv/namesrv_metrics.py)
and the scan task that drops brokers not heard from for
`broker_channel_expired_time`. The route tables read Trio's clock, so tests drive expiry with
`autojump_clock` through the real scan task.

Binding happens before `task_status.started(handle)`, so the handle's port is usable at once
(port 0 picks a free one). Everything stops when the caller cancels; the KV store is written on
every change, so there is nothing to flush at shutdown.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

import attrs
import trio

from common.remoting.network import TCP, Network
from common.remoting.server import RequestDispatcher, serve_remoting
from common.tls import server_policy
from namesrv.config import NamesrvConfig
from namesrv.kvconfig import KVConfigManager
from namesrv.processor import NamesrvProcessor
from namesrv.routeinfo import RouteInfoManager

if TYPE_CHECKING:
    from common.metrics.exporter import MetricsServerHandle

log = logging.getLogger(__name__)

# 4.9.7 schedules the first scan 5 s after start.
FIRST_SCAN_DELAY = 5.0


@attrs.frozen
class NamesrvHandle:
    port: int
    host: str
    processor: NamesrvProcessor
    # the metrics port (None: metricsPromExporterPort is 0)
    metrics: MetricsServerHandle | None = None

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def routes(self) -> RouteInfoManager:
        return self.processor.routes

    @property
    def kv(self) -> KVConfigManager:
        return self.processor.kv


async def scan_not_active_broker_task(processor: NamesrvProcessor) -> None:
    """Every `scan_not_active_broker_interval`, drop brokers that stopped registering and close
    the connection they registered over (unless another live broker still uses it)."""
    await trio.sleep(min(FIRST_SCAN_DELAY, processor.config.scan_not_active_broker_interval))
    while True:
        for live in processor.routes.scan_not_active_broker():
            log.warning(
                "broker %s expired: not heard from for %.0f s",
                live.broker_addr,
                processor.config.broker_channel_expired_time,
            )
            channel = live.channel
            if channel is not None and not processor.routes.channel_in_use(channel):
                close = getattr(channel, "close", None)
                if close is not None:
                    close()
        # Read each round: UPDATE_NAMESRV_CONFIG may have changed it.
        await trio.sleep(processor.config.scan_not_active_broker_interval)


async def run_namesrv(
    config: NamesrvConfig,
    *,
    network: Network = TCP,
    task_status: trio.TaskStatus[NamesrvHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    kv = KVConfigManager.load(config.kv_config_path)
    routes = RouteInfoManager(
        now=trio.current_time, broker_channel_expired_time=config.broker_channel_expired_time
    )
    processor = NamesrvProcessor(routes=routes, kv=kv, config=config)
    dispatcher = RequestDispatcher()
    processor.register(dispatcher)
    tls = server_policy(config.tls)  # before binding: a bad certificate fails the start
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            partial(serve_remoting, network=network, tls=tls),
            dispatcher,
            config.host,
            config.listen_port,
        )
        nursery.start_soon(scan_not_active_broker_task, processor)
        metrics = None
        if config.metrics_prom_exporter_port:
            # imported here: prometheus_client's imports take ~50 ms, paid only when serving
            from namesrv.namesrv_metrics import run_namesrv_metrics

            metrics = await nursery.start(
                run_namesrv_metrics, config, routes, server.load, server.port
            )
        log.info("namesrv listening on %s:%d", config.host, server.port)
        task_status.started(
            NamesrvHandle(port=server.port, host=config.host, processor=processor, metrics=metrics)
        )
