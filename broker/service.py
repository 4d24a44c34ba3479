"""The broker process: ``run_broker`` builds a ``BrokerController`` and runs its tasks.

Theory of operation
-------------------
``run_broker(config)`` is one Trio task tree (DESIGN habit 2):

1. the store starts first (file store by default; tests inject a store or a store factory) and
   is the last thing to stop.  In DLedger mode (``enableDLegerCommitLog``) the member's Raft
   log is opened first and the store's CommitLog is its data files (``run_dledger_member``:
   written once, broker/dledger/broker/committed_dispatch.py); the DLedger node starts on the
   same log (its own port, from ``dLegerPeers``), then the DLedger store
   (``broker/dledger/broker/message_store.py``) over both, which the broker uses.  With an
   injected store or node (tests) the store is a separate state machine the node's committed
   entries are copied into (broker/dledger/broker/applier.py);
2. ``BrokerController`` loads ``config/topics.json``, ``subscriptionGroup.json``,
   ``consumerOffset.json`` and ``delayOffset.json`` from the store root;
3. the remoting server binds ``listenPort`` and the VIP port ``listenPort-2`` (both ephemeral
   when ``listenPort`` is 0), with the same processors; the HA service (``ha_factory``, by
   default classic HA ``broker.ha.service.run_ha_service``, none in DLedger mode) binds
   ``listenPort+1`` and sets ``controller.ha``; the Prometheus exporter
   (``broker/metrics_exporter.py``) binds ``metricsPromExporterPort`` when it is set; RocketMQ
   5's gRPC MessagingService (``broker/grpc/service.py``) binds ``grpcServerPort``;
4. background tasks: the registrar (REGISTER_BROKER at start, every 30 s and after topic
   changes), offset persistence (every 5 s), client housekeeping (idle channels dropped every
   10 s), NOTIFY_CONSUMER_IDS_CHANGED delivery, on masters the delay-level scheduler and the
   transaction check (``broker/transaction/``), and on slaves the metadata sync from the
   master (``broker/slave_sync.py``); in DLedger mode the role handler
   (``broker/dledger/broker/roles.py``) instead, which switches brokerId, role and those
   services as the Raft role changes (brokerId -1, no registration, until it is known);
5. ``task_status.started(BrokerHandle(...))``; serve until cancelled;
6. on cancellation: UNREGISTER_BROKER to every nameserver and a final persist of every config
   file, both shielded and bounded, then the store shuts down.

The controller (``broker/controller.py``) is the one object processors see; this module only
builds and wires (``broker/processor/dispatcher.py`` maps request codes to processors).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from broker.acl.validator import PlainAccessValidator, run_acl_watch
from broker.config import DEFAULT_GRPC_PORT, BrokerConfig
from broker.controller import BrokerController
from broker.dledger.broker.commitlog_view import DLedgerBackedStore
from broker.dledger.broker.committed_dispatch import run_dledger_backed_store
from broker.dledger.broker.log_retention import retention_for, run_log_retention
from broker.dledger.broker.message_store import DLedgerMessageStore, run_dledger_store
from broker.dledger.broker.roles import DLedgerRoleChangeHandler, RoleNode
from broker.dledger.broker.store_layout import move_legacy_layout
from broker.dledger.driver.node import DLedgerNode, run_dledger_node
from broker.dledger.driver.node_config import DLedgerConfig
from broker.dledger.driver.node_storage import open_log
from broker.dledger.driver.transport import RemotingDLedgerNetwork
from broker.grpc.service import GrpcServerHandle, run_grpc_service
from broker.ha.service import run_ha_service
from broker.pop.service import PopMessageService
from broker.processor.dispatcher import build_dispatcher
from broker.registrar import BrokerRegistrar
from broker.slave_sync import run_slave_sync
from broker.store.api import MessageStore
from broker.store.config import MessageStoreConfig
from common.remoting.client import open_remoting_client
from common.remoting.network import TCP, Network
from common.remoting.server import serve_remoting
from common.tls import client_network, server_policy

if TYPE_CHECKING:
    from common.metrics.exporter import MetricsServerHandle

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT = 3.0


@attrs.frozen
class BrokerHandle:
    port: int
    vip_port: int | None
    ha_port: int | None
    store: MessageStore
    controller: BrokerController
    host: str = "127.0.0.1"
    # the metrics port (None: metricsPromExporterPort is 0)
    metrics: MetricsServerHandle | None = None
    # the gRPC MessagingService port (broker/grpc; None: grpcServerPort is -1)
    grpc_port: int | None = None

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


class StoreFactory(Protocol):
    """Starts a store and reports it (``run_message_store``, ``run_memory_store``)."""

    def __call__(
        self, config: MessageStoreConfig, *, task_status: trio.TaskStatus[MessageStore] = ...
    ) -> Awaitable[None]: ...


class HAFactory(Protocol):
    """Starts the HA service for a controller and reports its bound port (``run_ha_service``)."""

    def __call__(
        self, controller: BrokerController, *, task_status: trio.TaskStatus[int] = ...
    ) -> Awaitable[None]: ...


async def run_broker(
    config: BrokerConfig,
    *,
    store: MessageStore | None = None,
    store_factory: StoreFactory | None = None,
    ha_factory: HAFactory | None = None,
    network: Network = TCP,
    io_threads: bool = True,
    dledger_node: RoleNode | None = None,
    task_status: trio.TaskStatus[BrokerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a broker until cancelled (see the module docstring).

    ``store``: an already running store to use; else ``store_factory(config.store,
    task_status=...)`` is started (default: the file store ``run_message_store``).
    ``ha_factory(controller, task_status=...)``: the HA service; it binds ``listenPort+1`` (or
    an ephemeral port when ``listenPort`` is 0) and reports the bound port via task_status.
    Default: classic HA (``broker.ha.service.run_ha_service``), except in DLedger mode.

    DLedger mode: ``store``/``store_factory`` give the classic store (the state machine);
    ``dledger_node`` a running member to use instead of starting one.
    """
    if config.dledger:
        config = dledger_broker_config(config)
    elif ha_factory is None:
        ha_factory = run_ha_service
    dledger: DLedgerMessageStore | None = None
    async with trio.open_nursery() as outer:
        if config.dledger and store is None and store_factory is None and dledger_node is None:
            # write once: the store's CommitLog is the member's Raft log (RocketMQ's layout)
            store, dledger_node = await outer.start(run_dledger_member, config, network)
        if store is None:
            if store_factory is None:
                from broker.store import run_message_store

                store_factory = run_message_store
            store = await outer.start(store_factory, config.store)
        if config.dledger:
            if dledger_node is None:
                dledger_node = await outer.start(
                    partial(
                        run_dledger_node,
                        dledger_node_config(config),
                        RemotingDLedgerNetwork(network),
                    )
                )
            dledger = await outer.start(run_dledger_store, store, dledger_node)
            retention = retention_for(store, dledger.applier, dledger_node)
            if retention is not None:
                await outer.start(run_log_retention, retention)
            store = dledger
        controller = BrokerController(config, store, network=network, io_threads=io_threads)
        controller.load()
        store.add_arrival_listener(controller.pull_hold.notify_message_arriving)
        pop = PopMessageService(controller)
        controller.pop = pop
        store.add_arrival_listener(pop.on_message_arriving)
        dispatcher = build_dispatcher(controller)
        # before any port opens: a bad certificate fails the start
        tls = server_policy(config.tls)
        try:
            async with open_remoting_client(
                network=client_network(config.tls_client, network)
            ) as client:
                try:
                    async with trio.open_nursery() as nursery:
                        if config.chaos_ack_before_store:
                            log.error(
                                "chaosAckBeforeStore is on: every 5th send is acknowledged and "
                                "NOT stored (a switch for the chaos checker's own test only)"
                            )
                        if config.acl_enable:
                            # before the port opens: no request is served unjudged
                            acl = PlainAccessValidator(config.acl_file_path)
                            await nursery.start(run_acl_watch, acl, config.acl_watch_interval)
                            dispatcher.guard = acl.guard
                            controller.acl = acl
                        serve = partial(serve_remoting, network=network, tls=tls)
                        main = await nursery.start(
                            serve, dispatcher, config.listen_host, config.listen_port
                        )
                        controller.store_host = (config.broker_ip1, main.port)
                        loads = [main.load]
                        vip_port = None
                        if config.fast_channel_enable:
                            vip = await nursery.start(
                                serve, dispatcher, config.listen_host, config.vip_port
                            )
                            vip_port = vip.port
                            loads.append(vip.load)
                        controller.vip_port = vip_port
                        # counting starts here: the registrar has not run yet, so no client
                        # knows this broker's address before (a client dialing the port
                        # directly is answered, not counted)
                        metrics = None
                        if config.metrics_prom_exporter_port:
                            # imported here: prometheus_client's imports take ~50 ms, which
                            # only a broker that serves metrics pays
                            from broker.metrics_exporter import run_broker_metrics

                            metrics = await nursery.start(
                                partial(run_broker_metrics, dledger=dledger_node),
                                controller,
                                loads,
                            )
                        registrar = BrokerRegistrar(
                            client,
                            config.namesrv_addrs,
                            controller.register_headers,
                            controller.register_body,
                            period=config.register_name_server_period,
                            timeout=config.register_broker_timeout,
                            on_result=controller._on_register_result,
                        )
                        # HA hook: the HA service binds listenPort+1 and reports its port;
                        # it may add controller.register_listeners to learn the master.
                        if ha_factory is not None:
                            controller.ha_port = await nursery.start(ha_factory, controller)
                        controller.registrar = registrar
                        grpc_port = None
                        if config.grpc_port is not None:
                            grpc = await _start_grpc(
                                nursery,
                                config,
                                partial(
                                    run_grpc_service,
                                    controller,
                                    dispatcher,
                                    controller.pop,
                                    remoting=client,
                                    host=config.listen_host,
                                    port=config.grpc_port,
                                    network=network,
                                    # the same certificate, offering HTTP/2 as gRPC needs
                                    tls=server_policy(config.tls, alpn=["h2"]),
                                ),
                            )
                            grpc_port = None if grpc is None else grpc.port
                        await nursery.start(controller.config_writer.run)
                        nursery.start_soon(controller._notify_task)
                        nursery.start_soon(controller._persist_task)
                        nursery.start_soon(controller._housekeeping_task)
                        if dledger is not None and dledger_node is not None:
                            roles = DLedgerRoleChangeHandler(
                                controller,
                                dledger,
                                dledger_node,
                                client,
                                offset_sync_interval=config.dledger_slave_sync_interval,
                            )
                            await nursery.start(roles.run)
                        elif not config.is_slave:
                            await nursery.start(controller.schedule_service.run)
                            await nursery.start(controller.timer_service.run)
                            await nursery.start(controller.run_transaction_check)
                            await nursery.start(pop.run_revive)
                        else:
                            await nursery.start(run_slave_sync, controller, client)
                        await nursery.start(registrar.run)
                        log.info(
                            "broker %s (%s) serving on %s, vip %s, ha %s, grpc %s",
                            config.broker_name,
                            controller.broker_role,
                            main.port,
                            vip_port,
                            controller.ha_port,
                            grpc_port,
                        )
                        task_status.started(
                            BrokerHandle(
                                port=main.port,
                                vip_port=vip_port,
                                ha_port=controller.ha_port,
                                store=store,
                                controller=controller,
                                host=config.broker_ip1,
                                metrics=metrics,
                                grpc_port=grpc_port,
                            )
                        )
                finally:
                    with trio.CancelScope(shield=True):
                        with trio.move_on_after(SHUTDOWN_TIMEOUT):
                            if controller.registrar is not None and config.namesrv_addrs:
                                await controller.registrar.unregister_all()
        finally:
            controller.persist_all()


async def _start_grpc(
    nursery: trio.Nursery,
    config: BrokerConfig,
    service: partial[Coroutine[object, object, None]],
) -> GrpcServerHandle | None:
    """Start the gRPC endpoint; None when the default port (grpcServerPort not set) is taken.

    A 4.x broker.conf never names grpcServerPort, so several brokers of one host would all
    reach for RocketMQ 5's default 8081: the first serves gRPC there and the others run without
    it, each saying so once.  A port the operator set stops the broker when it cannot be bound,
    as every other port does.
    """
    try:
        handle: GrpcServerHandle = await nursery.start(service)
    except (OSError, BaseExceptionGroup) as exc:
        if config.grpc_server_port is not None or not address_in_use(exc):
            raise
        log.error(
            "gRPC endpoint not served: the default port %d is in use; set grpcServerPort to "
            "another port, or to -1 to serve none",
            DEFAULT_GRPC_PORT,
        )
        return None
    return handle


def address_in_use(exc: BaseException) -> bool:
    """``exc`` is EADDRINUSE, alone or as every leaf of the exception groups it came in."""
    if isinstance(exc, BaseExceptionGroup):
        return all(address_in_use(e) for e in exc.exceptions)
    return isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE


async def run_dledger_member(
    config: BrokerConfig,
    network: Network,
    *,
    task_status: trio.TaskStatus[tuple[DLedgerBackedStore, DLedgerNode]] = (
        trio.TASK_STATUS_IGNORED
    ),
) -> None:
    """A DLedger member writing once (broker/dledger/broker/committed_dispatch.py): its Raft
    log opened here, the store over the log's data files, then the node on the same log;
    the log is closed once both stopped."""
    node_config = dledger_node_config(config)
    flog = await open_log(node_config)
    try:
        async with trio.open_nursery() as nursery:
            store = await nursery.start(
                run_dledger_backed_store, config.store, flog, node_config.store_dir
            )
            node = await nursery.start(
                partial(
                    run_dledger_node,
                    node_config,
                    RemotingDLedgerNetwork(network),
                    log=flog,
                    # a stranded member's log reset by its leader (raft/entry_handler.py)
                    on_log_reset=store.log_reset,
                )
            )
            task_status.started((store, node))
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(flog.close)


def dledger_node_config(config: BrokerConfig) -> DLedgerConfig:
    """The DLedger member a (checked) broker config describes; a store in the layout before
    RocketMQ's is moved to it first (broker/dledger/broker/store_layout.py)."""
    move_legacy_layout(config.store)
    return DLedgerConfig.from_store_config(config.store, group=config.broker_name)


def dledger_broker_config(config: BrokerConfig) -> BrokerConfig:
    """Check the DLedger settings (ValueError naming what is wrong); the group defaults to
    the broker's name, as RocketMQ's sample configs set it."""
    store = config.store
    store.check_dledger()
    if not store.dleger_group:
        store = attrs.evolve(store, dleger_group=config.broker_name)
    return attrs.evolve(config, store=store)
