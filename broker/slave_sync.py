"""Slave metadata sync (RocketMQ ``SlaveSynchronize`` + ``BrokerController.handleSlaveSynchronize``).

Theory of operation
-------------------
HA copies the CommitLog; everything else a slave needs to serve consumers (topics, consumer
offsets, delay-level cursors, subscription groups) is pulled from the master over the remoting
protocol by :func:`run_slave_sync`, one task on a SLAVE: first ``initial_delay`` (3 s) after
start, then every ``slave_sync_interval`` (60 s here; Java uses 10 s), :meth:`SlaveSynchronize.
sync_all` runs these steps in order, each on its own (one failing does not skip the others),
each bounded by ``timeout`` (3 s):

1. ``GET_ALL_TOPIC_CONFIG`` (21) from the master's VIP port (``port - 2``).  Only when the
   master's dataVersion differs from ours: replace the table, adopt the version, persist
   ``topics.json``.
2. ``GET_ALL_CONSUMER_OFFSET`` (43): ``put_all`` (Java's ``offsetTable.putAll``), persist.
3. ``GET_ALL_DELAY_OFFSET`` (45): adopt the cursors, persist ``delayOffset.json``.
4. ``GET_ALL_SUBSCRIPTIONGROUP_CONFIG`` (201): like topics, only on a dataVersion change.
5. ``GET_TIMER_CHECK_POINT`` (60, RocketMQ 5 ``syncTimerCheckPoint``), when timers are enabled
   here: the master's timer checkpoint, kept as ``broker/timer/checkpoint.py`` says (only while
   this node's timer service is stopped, only a fresher one, used at start only if this node's
   CommitLog reaches it), persisted in ``timerCheckpoint.json``; so a slave or DLedger follower
   that becomes the serving node starts its timers near where the master was rather than at the
   oldest timer record.  (RocketMQ syncs it every 3 s and its timer metrics, code 61, with the
   rest; we have no per-topic timer metrics to copy.)

The master's address is the ``masterAddr`` of the newest REGISTER_BROKER answer
(``controller.registrar.master_addr``) unless one is given explicitly; nothing runs while it is
unknown or equal to this broker's own address.  The VIP port is used only when the broker runs
on fixed ports (``listenPort`` != 0 and ``fastChannelEnable``): with ephemeral ports (tests) the
master's VIP port is not ``port - 2``, so the normal port is used.

Adopting a table does not fire the managers' change hooks (no re-registration storm), and a bad
answer is logged and leaves the slave's tables as they were.

Offsets committed to the slave (where RocketMQ 4.x loses them, and where we do not)
--------------------------------------------------------------------------------
While the master is down a consumer reads from the slave and commits its offsets there
(UPDATE_CONSUMER_OFFSET goes to whichever broker of the group its route still lists).  In
RocketMQ 4.x the slave's next sync ``putAll``s the master's table over them, so the progress made
during the outage survives only in the client's memory: a client that restarts, or whose queue
moves to another member, before its route shows the master again re-consumes the outage.

Here the slave hands that progress over instead.  Each commit a slave receives is also kept in
``pending`` (group, topic, queue -> offset).  Step 2 of ``sync_all`` then:

a. fetches the master's table;
b. for every pending entry *ahead* of the master's (or unknown to it) sends the master an
   UPDATE_CONSUMER_OFFSET, and counts it in ``forwarded``;
c. adopts the master's table with the forwarded entries at their forwarded value, and keeps, for
   entries whose forward failed, the slave's own (higher) value;
d. drops from ``pending`` what the master now holds (forwarded, or already at or beyond it),
   unless a newer commit for the same queue arrived meanwhile.

A pending entry never lowers the master's offset (b forwards only values ahead of it), so a
consumer that committed to the master after it came back is not moved back.  The window where a
forward can undo something is an admin offset reset on the master between its return and the
slave's first sync; the slave syncs at once on that return (below), so the window is one round
trip.  ``pending`` lives in memory: a slave restarted before it could forward still has the
offsets in its own table, but no longer marks them for the master (the client re-commits them).

Two events cut the ``slave_sync_interval`` wait short, so the hand-over does not depend on a
client's route-refresh timer or on where the 60 s period falls:

* the HA client connects to a master (``master_connected``): a master that came back, or a new
  one; a whole ``sync_all`` runs;
* a commit arrives while the HA client is connected (``note_commit``): only step 2 runs, at most
  once per ``forward_gap`` (1 s), so a client committing through the slave costs the master one
  GET_ALL_CONSUMER_OFFSET per second at most.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Protocol, TypeVar

import attrs
import trio

from broker.config import BrokerConfig
from broker.config_manager import Versioned, VersionedConfigManager
from broker.consumer_offset_manager import ConsumerOffsetManager
from broker.ha.service import HAService
from broker.registrar import Invoker
from broker.schedule import ScheduleMessageService
from broker.store.api import MessageStore
from broker.subscription import SubscriptionGroupManager
from broker.timer.checkpoint import CheckpointCopy, TimerCheckpoint
from broker.topic_config import TopicConfigManager
from common import serde
from common.errors import RmqError
from common.model import SubscriptionGroupWrapper, TopicConfigSerializeWrapper
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand

log = logging.getLogger(__name__)


def vip_addr(addr: str) -> str:
    """``MixAll.brokerVIPChannel``: the same host, port - 2."""
    host, _, port = addr.rpartition(":")
    return f"{host}:{int(port) - 2}"


V = TypeVar("V")
W = TypeVar("W", bound=Versioned)


class SyncRegistrar(Protocol):
    # the master's address from the last REGISTER_BROKER answer (None before one)
    @property
    def master_addr(self) -> str | None: ...


class SlaveSyncBroker(Protocol):
    """What the sync needs from its broker (``broker.controller.BrokerController``): typed here,
    so the sync does not import the controller, which holds the sync."""

    @property
    def config(self) -> BrokerConfig: ...

    # this broker's own address (a master address equal to it is no master)
    @property
    def broker_addr(self) -> str: ...

    @property
    def registrar(self) -> SyncRegistrar | None: ...

    # the HA service: its client says whether a master is connected
    @property
    def ha(self) -> HAService | None: ...

    @property
    def topic_config_manager(self) -> TopicConfigManager: ...

    @property
    def subscription_group_manager(self) -> SubscriptionGroupManager: ...

    @property
    def consumer_offset_manager(self) -> ConsumerOffsetManager: ...

    @property
    def schedule_service(self) -> ScheduleMessageService: ...

    @property
    def store(self) -> MessageStore: ...

    # the timer service's checkpoint (a copy of the master's is kept in it)
    @property
    def timer_checkpoint(self) -> TimerCheckpoint: ...

    def persist_topics(self) -> None: ...

    def persist_groups(self) -> None: ...

    def persist_offsets(self, *, force: bool = False) -> None: ...

    # set to the sync once it runs (UPDATE_CONSUMER_OFFSET hands commits to it)
    @property
    def slave_sync(self) -> object: ...

    @slave_sync.setter
    def slave_sync(self, value: SlaveSynchronize) -> None: ...


@attrs.frozen
class SyncReport:
    """What one ``sync_all`` changed (tests and logs)."""

    topics: bool = False
    offsets: bool = False
    delay_offsets: bool = False
    groups: bool = False
    timer_checkpoint: bool = False
    errors: tuple[str, ...] = ()


@attrs.define(eq=False)
class SlaveSynchronize:
    controller: SlaveSyncBroker
    client: Invoker
    timeout: float = 3.0
    # use the master's VIP port (port - 2) for the topic config
    vip_channel: bool = True
    # an explicit master address; None -> the registrar's masterAddr
    master_addr: str | None = None
    # completed sync_all rounds that had a master to talk to
    rounds: int = 0
    # (group, topic, queueId) -> offset committed to this slave and not yet known to the master
    pending: dict[tuple[str, str, int], int] = attrs.field(factory=dict)
    # commits handed to the master so far (tests and logs)
    forwarded: int = 0
    # minimum time between two commit-triggered forwards
    forward_gap: float = 1.0
    # True while this slave's HA client has a connection to a master (set by the HA hooks)
    master_online: Callable[[], bool] = lambda: False
    # set to cut the periodic wait short: "full" (a master connected) or "offsets" (a commit)
    _wake: trio.Event = attrs.field(factory=trio.Event)
    _wake_full: bool = False

    def note_commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """A consumer committed to this slave: keep it for the master (see the module doc)."""
        if offset < 0:
            return
        self.pending[(group, topic, queue_id)] = offset
        if self.master_online():
            self._wake.set()

    def master_connected(self) -> None:
        """The HA client reached a master: sync everything now rather than at the next period."""
        self._wake_full = True
        self._wake.set()

    async def wait_for_next_round(self, interval: float) -> bool:
        """Sleep until the period ends or a wake-up; True when a whole ``sync_all`` is due."""
        with trio.move_on_after(interval) as timer:
            await self._wake.wait()
        self._wake = trio.Event()
        full, self._wake_full = self._wake_full or timer.cancelled_caught, False
        return full

    async def forward_offsets(self) -> bool:
        """Step 2 alone (a commit arrived while the master is up); False without a master."""
        addr = self.current_master()
        if addr is None:
            return False
        try:
            return await self.sync_consumer_offset(addr)
        except (RmqError, ValueError, TypeError, KeyError) as exc:
            log.warning("slave sync of offsets from %s failed: %s", addr, exc)
            return False

    def current_master(self) -> str | None:
        addr = self.master_addr
        if addr is None:
            registrar = self.controller.registrar
            addr = registrar.master_addr if registrar is not None else None
        if not addr or addr == self.controller.broker_addr:
            return None
        return addr

    async def _call(self, addr: str, code: int) -> bytes:
        resp = await self.client.invoke(addr, RemotingCommand.request(code), self.timeout)
        if resp.code != ResponseCode.SUCCESS:
            raise RmqError(f"{RequestCode(code).name} answered {resp.code} {resp.remark}")
        return resp.body_bytes()

    async def sync_all(self) -> SyncReport | None:
        addr = self.current_master()
        if addr is None:
            return None
        errors: list[str] = []
        done: dict[str, bool] = {}
        steps = [
            ("topics", self.sync_topic_config),
            ("offsets", self.sync_consumer_offset),
            ("delay_offsets", self.sync_delay_offset),
            ("groups", self.sync_subscription_group_config),
        ]
        if self.controller.config.store.timer_wheel_enable:
            steps.append(("timer_checkpoint", self.sync_timer_checkpoint))
        for name, step in steps:
            try:
                done[name] = await step(addr)
            except (RmqError, ValueError, TypeError, KeyError) as exc:
                log.warning("slave sync of %s from %s failed: %s", name, addr, exc)
                errors.append(f"{name}: {exc}")
                done[name] = False
        self.rounds += 1
        return SyncReport(**done, errors=tuple(errors))

    async def _sync_versioned(
        self,
        addr: str,
        target: str,
        code: int,
        wrapper_type: type[W],
        manager: VersionedConfigManager[V, W],
        persist: Callable[[], None],
        what: str,
    ) -> bool:
        """Fetch a versioned table; adopt and persist it only when its dataVersion differs."""
        body = await self._call(target, code)
        wrapper = serde.from_json(body, wrapper_type)
        if wrapper.dataVersion == manager.data_version:
            return False
        manager.adopt(wrapper)
        persist()
        log.info("slave sync: %s %s from %s", what, wrapper.dataVersion, addr)
        return True

    async def sync_topic_config(self, addr: str) -> bool:
        target = vip_addr(addr) if self.vip_channel else addr
        return await self._sync_versioned(
            addr,
            target,
            RequestCode.GET_ALL_TOPIC_CONFIG,
            TopicConfigSerializeWrapper,
            self.controller.topic_config_manager,
            self.controller.persist_topics,
            "topic config",
        )

    async def sync_consumer_offset(self, addr: str) -> bool:
        body = await self._call(addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
        table = ConsumerOffsetManager.parse_table(serde.loads(body) if body else {})
        offsets = self.controller.consumer_offset_manager
        settled: dict[tuple[str, str, int], int] = {}
        for (group, topic, queue_id), offset in list(self.pending.items()):
            queues = table.setdefault(ConsumerOffsetManager.key(topic, group), {})
            if queues.get(queue_id, -1) < offset:
                if await self._forward(addr, group, topic, queue_id, offset):
                    self.forwarded += 1
                else:
                    continue  # not handed over: kept pending, retried next round
                queues[queue_id] = offset
            settled[(group, topic, queue_id)] = offset
        for key, offset in settled.items():
            if self.pending.get(key) == offset:  # unless a newer commit came in meanwhile
                del self.pending[key]
        for (group, topic, queue_id), offset in self.pending.items():
            # commits still pending (refused, or newer than the forward) stay what we serve
            queues = table.setdefault(ConsumerOffsetManager.key(topic, group), {})
            queues[queue_id] = max(offset, queues.get(queue_id, -1))
        offsets.put_all(table)
        self.controller.persist_offsets()
        return True

    async def _forward(self, addr: str, group: str, topic: str, queue_id: int, offset: int) -> bool:
        fields = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": queue_id,
            "commitOffset": offset,
        }
        cmd = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, fields)
        try:
            resp = await self.client.invoke(addr, cmd, self.timeout)
        except RmqError as exc:
            log.info(
                "handing offset %s@%s/%d=%d to %s failed: %s",
                topic,
                group,
                queue_id,
                offset,
                addr,
                exc,
            )
            return False
        if resp.code != ResponseCode.SUCCESS:
            log.info(
                "master %s refused offset %s@%s/%d=%d: %s %s",
                addr,
                topic,
                group,
                queue_id,
                offset,
                resp.code,
                resp.remark,
            )
            return False
        log.info(
            "handed offset %s@%s/%d=%d over to master %s", topic, group, queue_id, offset, addr
        )
        return True

    async def sync_delay_offset(self, addr: str) -> bool:
        body = await self._call(addr, RequestCode.GET_ALL_DELAY_OFFSET)
        if not body:
            return False
        self.controller.schedule_service.decode(body)
        self.controller.persist_offsets()
        return True

    async def sync_subscription_group_config(self, addr: str) -> bool:
        return await self._sync_versioned(
            addr,
            addr,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
            SubscriptionGroupWrapper,
            self.controller.subscription_group_manager,
            self.controller.persist_groups,
            "subscription groups",
        )

    async def sync_timer_checkpoint(self, addr: str) -> bool:
        body = await self._call(addr, RequestCode.GET_TIMER_CHECK_POINT)
        copy = CheckpointCopy.from_obj(serde.loads(body) if body else None)
        if copy is None:
            return False  # the master has none yet (its timer service never ran)
        cp = self.controller.timer_checkpoint
        if not cp.take_master(copy, self.controller.store.get_max_phy_offset()):
            return False
        self.controller.persist_offsets()
        log.info("slave sync: timer checkpoint %d from %s", copy.commit_offset, addr)
        return True


async def run_slave_sync(
    controller: SlaveSyncBroker,
    client: Invoker,
    *,
    interval: float | None = None,
    initial_delay: float | None = None,
    master_addr: str | None = None,
    on_round: Callable[[SyncReport | None], None] | None = None,
    task_status: trio.TaskStatus[SlaveSynchronize] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``sync_all`` after ``initial_delay`` and then every ``interval`` until cancelled.

    ``on_round`` sees each whole round's report (None: no master known); DLedger followers
    re-register when a round failed, to learn a new master sooner than the next period."""
    config = controller.config
    if interval is None:
        interval = config.slave_sync_interval
    if initial_delay is None:
        initial_delay = config.slave_sync_initial_delay
    sync = SlaveSynchronize(
        controller,
        client,
        vip_channel=bool(config.fast_channel_enable and config.listen_port),
        master_addr=master_addr,
    )
    ha_client = controller.ha.client if controller.ha is not None else None
    if ha_client is not None:
        sync.master_online = lambda: bool(ha_client.connected)
        ha_client.connect_listeners.append(lambda _addr: sync.master_connected())
    controller.slave_sync = sync
    task_status.started(sync)
    full = await sync.wait_for_next_round(initial_delay)
    last_forward = -math.inf
    while True:
        if full:
            report = await sync.sync_all()
            if on_round is not None:
                on_round(report)
        else:
            # a commit-triggered forward: at most one per forward_gap
            await trio.sleep_until(last_forward + sync.forward_gap)
            last_forward = trio.current_time()
            await sync.forward_offsets()
        full = await sync.wait_for_next_round(interval)


__all__ = ["SlaveSynchronize", "SyncReport", "run_slave_sync", "vip_addr"]
