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

The master's address is the ``masterAddr`` of the newest REGISTER_BROKER answer
(``controller.registrar.master_addr``) unless one is given explicitly; nothing runs while it is
unknown or equal to this broker's own address.  The VIP port is used only when the broker runs
on fixed ports (``listenPort`` != 0 and ``fastChannelEnable``): with ephemeral ports (tests) the
master's VIP port is not ``port - 2``, so the normal port is used.

Adopting a table does not fire the managers' change hooks (no re-registration storm), and a bad
answer is logged and leaves the slave's tables as they were.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import attrs
import trio

from broker.offsets import ConsumerOffsetManager
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


@attrs.frozen
class SyncReport:
    """What one ``sync_all`` changed (tests and logs)."""

    topics: bool = False
    offsets: bool = False
    delay_offsets: bool = False
    groups: bool = False
    errors: tuple[str, ...] = ()


@attrs.define(eq=False)
class SlaveSynchronize:
    controller: Any
    client: Any  # common.remoting.client.RemotingClient
    timeout: float = 3.0
    # use the master's VIP port (port - 2) for the topic config
    vip_channel: bool = True
    # an explicit master address; None -> the registrar's masterAddr
    master_addr: str | None = None
    # completed sync_all rounds that had a master to talk to
    rounds: int = 0

    def current_master(self) -> str | None:
        addr = self.master_addr
        if addr is None:
            registrar = getattr(self.controller, "registrar", None)
            addr = getattr(registrar, "master_addr", None)
        if not addr or addr == self.controller.broker_addr:
            return None
        return addr

    async def _call(self, addr: str, code: int) -> bytes:
        resp = await self.client.invoke(addr, RemotingCommand.request(code), self.timeout)
        if resp.code != ResponseCode.SUCCESS:
            raise RmqError(f"{RequestCode(code).name} answered {resp.code} {resp.remark}")
        return bytes(resp.body or b"")

    async def sync_all(self) -> SyncReport | None:
        addr = self.current_master()
        if addr is None:
            return None
        errors: list[str] = []
        done: dict[str, bool] = {}
        for name, step in (
            ("topics", self.sync_topic_config),
            ("offsets", self.sync_consumer_offset),
            ("delay_offsets", self.sync_delay_offset),
            ("groups", self.sync_subscription_group_config),
        ):
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
        wrapper_type: type,
        manager: Any,
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
        self.controller.consumer_offset_manager.put_all(table)
        self.controller.persist_offsets()
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


async def run_slave_sync(
    controller: Any,
    client: Any,
    *,
    interval: float | None = None,
    initial_delay: float | None = None,
    master_addr: str | None = None,
    task_status: trio.TaskStatus[SlaveSynchronize] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``sync_all`` after ``initial_delay`` and then every ``interval`` until cancelled."""
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
    controller.slave_sync = sync
    task_status.started(sync)
    await trio.sleep(initial_delay)
    while True:
        await sync.sync_all()
        await trio.sleep(interval)


__all__ = ["SlaveSynchronize", "SyncReport", "run_slave_sync", "vip_addr"]
