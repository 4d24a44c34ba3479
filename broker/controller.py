"""The broker's state as its parts see it: ``BrokerController`` (RocketMQ ``BrokerController``).

Theory of operation
-------------------
The controller is the one object processors, the HA service and the slave sync are handed: the
tables (topics, groups, offsets, consumers, producers, locks), the store, the long-poll hold
service and the broker's own address (``store_host``, fixed once the port is bound, used in every
stored record and msgId).  It owns the config files: ``load`` reads them at start; topic and group
changes go to a write-behind (``common/config_file.py``) so the fsync happens off the event loop,
and answers that acknowledge such a change await ``wait_config_durable``; offsets are written
every ``flushConsumerOffsetInterval`` and at shutdown.

It imports none of the processors, nor the service that wires them (``broker/service.py``), so
processors depend on it and nothing depends back: no import circle.  The parts it holds that
need it back, the HA service and the slave sync, take it as a Protocol of what they use
(``broker.ha.service.HABroker``, ``broker.slave_sync.SlaveSyncBroker``), which the controller
keeps: it imports them, they do not import it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from broker.acl.validator import PlainAccessValidator
from broker.broker_metrics import BrokerMetrics
from broker.broker_stats_manager import BrokerStatsManager
from broker.config import BrokerConfig
from broker.config_manager import atomic_write
from broker.configuration import Configuration, UpdatePlan, merge_properties
from broker.consumer_manager import ConsumerManager, ProducerManager, RebalanceLockManager
from broker.consumer_offset_manager import ConsumerOffsetManager, config_dir
from broker.filter.consumer_filter_manager import ConsumerFilterManager
from broker.ha.service import HABroker, HAService
from broker.pop.api import PopService
from broker.processor.pull_hold import PullRequestHoldService
from broker.registrar import BrokerRegistrar, RegisterResult
from broker.schedule import ScheduleMessageService, parse_delay_levels
from broker.slave_sync import SlaveSyncBroker, SlaveSynchronize
from broker.store.api import MessageStore
from broker.subscription import SubscriptionGroupManager
from broker.timer.checkpoint import TimerCheckpoint
from broker.timer.service import TimerMessageService
from broker.timer.transform import TimerSettings
from broker.topic_config import TopicConfigManager
from broker.transaction.check import CheckConfig
from broker.transaction.check_listener import DefaultTransactionalMessageCheckListener
from broker.transaction.check_service import run_transaction_check
from broker.transaction.service import TransactionalMessageService
from common import serde
from common.config_file import WriteBehind
from common.errors import RmqError
from common.model import RegisterBrokerBody
from common.remoting.channel import Channel
from common.remoting.codes import RequestCode
from common.remoting.command import RemotingCommand
from common.remoting.network import TCP, Network

log = logging.getLogger(__name__)


def _parse_host(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    try:
        return host.strip("[]") or "127.0.0.1", int(port)
    except ValueError:
        return "127.0.0.1", 0


# (group, its members' channels): one NOTIFY_CONSUMER_IDS_CHANGED round to send
_Notify = tuple[str, list[Channel]]


@attrs.define(eq=False)
class BrokerStats:
    put_count: int = 0
    put_failed: int = 0
    get_found: int = 0
    get_miss: int = 0
    send_back_count: int = 0
    # per topic, group and cluster, over a minute, an hour and a day (VIEW_BROKER_STATS_DATA)
    manager: BrokerStatsManager = attrs.field(factory=BrokerStatsManager)


@attrs.define(eq=False)
class BrokerController:
    config: BrokerConfig
    store: MessageStore
    # (ip, port) written into stored records; the port is the bound listen port
    store_host: tuple[str, int] = ("127.0.0.1", 0)
    ha_port: int | None = None
    vip_port: int | None = None
    topic_config_manager: TopicConfigManager = attrs.field(init=False)
    subscription_group_manager: SubscriptionGroupManager = attrs.field(init=False)
    consumer_offset_manager: ConsumerOffsetManager = attrs.field(factory=ConsumerOffsetManager)
    consumer_manager: ConsumerManager = attrs.field(init=False)
    producer_manager: ProducerManager = attrs.field(init=False)
    lock_manager: RebalanceLockManager = attrs.field(init=False)
    pull_hold: PullRequestHoldService = attrs.field(factory=PullRequestHoldService)
    # compiled SQL92 filters of the pulls (bounded)
    consumer_filter_manager: ConsumerFilterManager = attrs.field(factory=ConsumerFilterManager)
    schedule_service: ScheduleMessageService = attrs.field(init=False)
    # RocketMQ 5 timer messages (broker/timer); runs on a master / DLedger leader only
    timer_service: TimerMessageService = attrs.field(init=False)
    # half messages, END_TRANSACTION and the check (broker/transaction); the check runs on a
    # master only (run_transaction_check)
    transaction_service: TransactionalMessageService = attrs.field(init=False)
    transaction_check_listener: DefaultTransactionalMessageCheckListener = attrs.field(init=False)
    stats: BrokerStats = attrs.field(factory=BrokerStats)
    # pop consumption (broker/pop): built by broker/service.py; its revive task runs on a
    # master / DLedger leader only, and pops are answered only while it runs
    pop: PopService | None = None
    # the Prometheus counters of the request paths while the broker serves metrics
    # (broker/broker_metrics.py; None: metricsPromExporterPort is 0)
    metrics: BrokerMetrics | None = None
    registrar: BrokerRegistrar | None = None
    boot_timestamp: int = attrs.field(factory=lambda: int(time.time() * 1000))
    # (group, channels) waiting to be told NOTIFY_CONSUMER_IDS_CHANGED; drained by a task
    _notify_send: trio.MemorySendChannel[_Notify] = attrs.field(init=False)
    _notify_recv: trio.MemoryReceiveChannel[_Notify] = attrs.field(init=False)
    # called with every successful REGISTER_BROKER answer (a slave's HA client and metadata
    # sync learn the master's address here)
    register_listeners: list[Callable[[RegisterResult], None]] = attrs.field(factory=list)
    # the HA service once ha_factory started it; the send path awaits
    # ha.wait_for_replica(end_offset) on a SYNC_MASTER
    ha: HAService | None = None
    # the metadata sync from the master, on a slave (UPDATE_CONSUMER_OFFSET hands commits to it)
    slave_sync: SlaveSynchronize | None = None
    # how this broker's ports are bound and its peers reached (TCP; in tests an in-memory one)
    network: Network = TCP
    # topics.json / subscriptionGroup.json are fsynced by this, in a worker thread; answers that
    # acknowledge a topic or group change wait for it (wait_config_durable)
    config_writer: WriteBehind = attrs.field(init=False)
    # file writes (configs, offsets) in worker threads; False keeps them on the event loop for
    # tests under autojump_clock (see common/config_file.py)
    io_threads: bool = True
    # The brokerId this broker registers with and the role it serves as ("ASYNC_MASTER",
    # "SYNC_MASTER", "SLAVE"): the config's, except in DLedger mode, where they start as -1 /
    # SLAVE (not registered, no writes) and follow the Raft role (broker/dledger/broker/roles.py).
    # Set only through set_role, which keeps the store's role equal to broker_role.
    broker_id: int = attrs.field(init=False)
    broker_role: str = attrs.field(init=False)
    # the topic table changed since it was last written
    _topics_dirty: bool = attrs.field(default=False, init=False)
    _groups_dirty: bool = attrs.field(default=False, init=False)
    # the plain ACL in force when aclEnable (the ACL admin requests edit its file)
    acl: PlainAccessValidator | None = None
    # the DataVersion of GET_BROKER_CONFIG and the file updates are written to
    configuration: Configuration = attrs.field(init=False)
    # one UPDATE_BROKER_CONFIG at a time rewrites the file (RocketMQ: a synchronized method)
    _config_update_lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)

    def __attrs_post_init__(self) -> None:
        self.config_writer = WriteBehind(in_thread=self.io_threads)
        c = self.config
        self.configuration = Configuration(
            c.broker_config_path
            or str(config_dir(c.store.store_path_root_dir) / "broker.properties")
        )
        self.topic_config_manager = TopicConfigManager(
            broker_name=c.broker_name,
            cluster_name=c.broker_cluster_name,
            auto_create_topic_enable=c.auto_create_topic_enable,
            auto_create_topic_max=c.auto_create_topic_max,
            default_topic_queue_nums=c.default_topic_queue_nums,
            cluster_topic_enable=c.cluster_topic_enable,
            broker_topic_enable=c.broker_topic_enable,
            trace_topic_enable=c.trace_topic_enable,
        )
        self.subscription_group_manager = SubscriptionGroupManager(
            auto_create_subscription_group=c.auto_create_subscription_group
        )
        self._notify_send, self._notify_recv = trio.open_memory_channel[_Notify](math.inf)
        self.consumer_manager = ConsumerManager(
            channel_expired_timeout=c.channel_expired_timeout,
            on_ids_changed=self._queue_notify,
        )
        self.producer_manager = ProducerManager(channel_expired_timeout=c.channel_expired_timeout)
        self.lock_manager = RebalanceLockManager(max_live_time=c.rebalance_lock_max_live_time)
        self.schedule_service = ScheduleMessageService(
            self.store, self.pull_hold, parse_delay_levels(c.store.message_delay_level)
        )
        self.timer_service = TimerMessageService(
            self.store,
            self.pull_hold,
            TimerSettings(
                c.store.timer_wheel_enable, c.store.timer_max_delay_sec, c.store.timer_precision_ms
            ),
            window_slots=c.store.timer_roll_window_slot,
            commit_log_file_size=c.store.mapped_file_size_commit_log,
        )
        self.transaction_service = TransactionalMessageService(
            self.store,
            self.consumer_offset_manager,
            lambda: self.store_host,
            CheckConfig(
                transaction_timeout_ms=int(c.transaction_timeout * 1000),
                transaction_check_max=c.transaction_check_max,
                file_reserved_hours=c.store.file_reserved_time,
            ),
            ensure_topic=self._ensure_check_max_time_topic,
        )
        self.transaction_check_listener = DefaultTransactionalMessageCheckListener(
            self.producer_manager
        )
        if self.store_host == ("127.0.0.1", 0):
            self.store_host = (c.broker_ip1, c.listen_port)
        if c.dledger:
            self.set_role(-1, "SLAVE")
        else:
            self.broker_id, self.broker_role = c.broker_id, c.broker_role

    # --- role -----------------------------------------------------------------------------------
    @property
    def is_slave(self) -> bool:
        return self.broker_role == "SLAVE"

    def set_role(self, broker_id: int, role: str) -> None:
        """Switch brokerId and role at run time (DLedger mode); the store refuses puts as a
        SLAVE.  Re-registering and the role's services are the caller's (roles.py)."""
        self.broker_id = broker_id
        self.broker_role = role
        self.store.broker_role = role

    async def run_transaction_check(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The transaction check of a master (started and stopped with the master role)."""
        await run_transaction_check(
            self.transaction_service,
            self.transaction_check_listener,
            self.config.transaction_check_interval,
            task_status=task_status,
        )

    def _ensure_check_max_time_topic(self, topic: str) -> None:
        # RocketMQ createTopicOfTranCheckMaxTime: one queue, READ|WRITE
        self.topic_config_manager.create_topic_in_send_message_back_method(topic, 1, 6)

    @property
    def timer_checkpoint(self) -> TimerCheckpoint:
        return self.timer_service.checkpoint

    # --- addresses ---------------------------------------------------------------------------
    @property
    def broker_addr(self) -> str:
        return f"{self.store_host[0]}:{self.store_host[1]}"

    @property
    def ha_server_addr(self) -> str:
        host = self.config.broker_ip2 or self.config.broker_ip1
        return f"{host}:{self.ha_port if self.ha_port is not None else self.config.ha_port}"

    @staticmethod
    def peer_host(channel: Channel) -> tuple[str, int]:
        return _parse_host(channel.remote_addr or "")

    # --- config files -----------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return config_dir(self.config.store.store_path_root_dir)

    def load(self) -> None:
        d = self.config_path
        self.topic_config_manager.load(d / "topics.json")
        self.subscription_group_manager.load(d / "subscriptionGroup.json")
        self.consumer_offset_manager.load(d / "consumerOffset.json")
        self.schedule_service.load(d / "delayOffset.json")
        self.timer_service.checkpoint.load(d / "timerCheckpoint.json")
        # changes from now on are persisted and announced
        self.topic_config_manager.on_change = self._on_topics_changed
        self.subscription_group_manager.on_change = self._on_groups_changed

    def _on_topics_changed(self) -> None:
        self._topics_dirty = True
        self.persist_topics()
        if self.registrar is not None:
            self.registrar.request_register()

    def _on_groups_changed(self) -> None:
        self._groups_dirty = True
        self.persist_groups()

    @property
    def topics_path(self) -> Path:
        return self.config_path / "topics.json"

    @property
    def groups_path(self) -> Path:
        return self.config_path / "subscriptionGroup.json"

    def persist_topics(self) -> None:
        """Hand the topic table to the write-behind (written and fsynced off the loop)."""
        try:
            self.config_writer.submit(self.topics_path, self.topic_config_manager.encode())
            self._topics_dirty = False
        except OSError as exc:
            log.error("could not write topics.json: %s", exc)

    def persist_groups(self) -> None:
        try:
            self.config_writer.submit(self.groups_path, self.subscription_group_manager.encode())
            self._groups_dirty = False
        except OSError as exc:
            log.error("could not write subscriptionGroup.json: %s", exc)

    def config_pending(self) -> bool:
        """A topic or group change is acknowledged to nobody yet: it is not on disk.

        Asked on every send, so it is one dict check: the writer holds nothing but this
        broker's topic and group files (offsets are written by ``persist_offsets_in_thread``)."""
        return self.config_writer.busy()

    async def wait_config_durable(self, timeout: float | None = None) -> bool:
        """Wait until every topic and group change made so far is on disk; False if that took
        longer than ``timeout`` (default: the store's syncFlushTimeout)."""
        w = self.config_writer
        if timeout is None:
            timeout = self.config.store.sync_flush_timeout
        with trio.move_on_after(timeout):
            for path in (self.topics_path, self.groups_path):
                gen = w.pending(path)
                if gen is not None:
                    await w.wait_durable(path, gen)
            return True
        log.error("topic/group config not on disk after %.1f s", timeout)
        return False

    def persist_offsets(self, *, force: bool = False) -> None:
        d = self.config_path
        try:
            self.consumer_offset_manager.persist(d / "consumerOffset.json", force=force)
            self.schedule_service.persist(d / "delayOffset.json", force=force)
            self.timer_service.checkpoint.persist(d / "timerCheckpoint.json", force=force)
        except OSError as exc:
            log.error("could not write offsets: %s", exc)

    def persist_all(self) -> None:
        self.persist_topics()
        self.persist_groups()
        self.persist_offsets(force=True)

    async def update_config(self, plan: UpdatePlan) -> bool:
        """Apply an UPDATE_BROKER_CONFIG (broker/configuration.py): the live keys now, every
        key to the config file; False when the file could not be written."""
        async with self._config_update_lock:
            self.config = c = plan.config
            tcm = self.topic_config_manager
            tcm.auto_create_topic_enable = c.auto_create_topic_enable
            tcm.auto_create_topic_max = c.auto_create_topic_max
            self.subscription_group_manager.auto_create_subscription_group = (
                c.auto_create_subscription_group
            )
            self.configuration.bump()
            if "brokerPermission" in plan.raw:
                # as RocketMQ: the new permission goes to the nameservers at once, on every topic
                tcm.data_version = tcm.data_version.next_version()
                if self.registrar is not None:
                    self.registrar.request_register()
            path = Path(self.configuration.path)

            def write() -> None:
                try:
                    old = path.read_text(encoding="utf-8")
                except FileNotFoundError:
                    old = ""
                atomic_write(path, merge_properties(old, plan.raw).encode("utf-8"))

            try:
                if self.io_threads:
                    await trio.to_thread.run_sync(write)
                else:
                    write()
            except (OSError, UnicodeDecodeError) as exc:
                log.error("could not write the broker config to %s: %s", path, exc)
                return False
            return True

    # --- registration -------------------------------------------------------------------------
    def register_headers(self) -> dict[str, str]:
        return {
            "brokerName": self.config.broker_name,
            "brokerAddr": self.broker_addr,
            "clusterName": self.config.broker_cluster_name,
            "haServerAddr": self.ha_server_addr,
            "brokerId": str(self.broker_id),
        }

    def _on_register_result(self, result: RegisterResult) -> None:
        for fn in list(self.register_listeners):
            fn(result)

    def register_body(self) -> bytes:
        wrapper = self.topic_config_manager.wrapper()
        if self.config.broker_permission != 6:
            # like Java: a broker whose permission is restricted advertises it on every topic
            wrapper.topicConfigTable = {
                k: attrs.evolve(v, perm=v.perm & self.config.broker_permission)
                for k, v in wrapper.topicConfigTable.items()
            }
        return serde.to_json(RegisterBrokerBody(topicConfigSerializeWrapper=wrapper))

    # --- consumer notifications -------------------------------------------------------------
    def _queue_notify(self, group: str, channels: list[Channel]) -> None:
        self._notify_send.send_nowait((group, channels))

    async def _notify_task(self) -> None:
        async for group, channels in self._notify_recv:
            for ch in channels:
                if ch.closed:
                    continue
                cmd = RemotingCommand.request(
                    RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group}, oneway=True
                )
                try:
                    with trio.move_on_after(3.0):
                        await ch.send(cmd)
                except RmqError as exc:
                    log.info("notify %s of %s failed: %s", ch, group, exc)

    # --- periodic work ------------------------------------------------------------------------
    async def _persist_task(self) -> None:
        while True:
            await trio.sleep(self.config.flush_consumer_offset_interval)
            await self.persist_offsets_in_thread()

    async def persist_offsets_in_thread(self) -> None:
        """The periodic offsets write: snapshot on the event loop, write + fsync in a worker
        thread, so every connection keeps being served while the disk syncs."""
        d = self.config_path
        jobs = []
        for manager, name in (
            (self.consumer_offset_manager, "consumerOffset.json"),
            (self.schedule_service, "delayOffset.json"),
            (self.timer_service.checkpoint, "timerCheckpoint.json"),
        ):
            data = manager.take_snapshot()
            if data is not None:
                jobs.append((manager, d / name, data))
        if not jobs:
            return

        def write_all() -> None:
            for _, path, data in jobs:
                atomic_write(path, data)

        try:
            if self.io_threads:
                await trio.to_thread.run_sync(write_all)
            else:
                write_all()
        except OSError as exc:
            for manager, _, _ in jobs:
                manager.mark_dirty()
            log.error("could not write offsets: %s", exc)

    async def _housekeeping_task(self) -> None:
        while True:
            await trio.sleep(self.config.client_scan_interval)
            self.consumer_manager.scan_not_active_channel()
            self.producer_manager.scan_not_active_channel()

    def on_channel_closed(self, channel: Channel) -> None:
        self.consumer_manager.do_channel_close_event(channel)
        self.producer_manager.do_channel_close_event(channel)


# mypy proves here that the controller is what the HA service and the slave sync take it as
# (they are started through nursery.start, whose arguments are not checked against them)
_HA_CONTRACT: type[HABroker] = BrokerController
_SYNC_CONTRACT: type[SlaveSyncBroker] = BrokerController

__all__ = ["BrokerController", "BrokerStats"]
