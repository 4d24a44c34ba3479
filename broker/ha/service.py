"""The broker's HA service (RocketMQ ``HAService``): acceptor, HA client and replica waiters.

Theory of operation
-------------------
``run_ha_service(controller)`` is ``run_broker``'s ``ha_factory``: it binds the HA port
(``listenPort + 1``, ephemeral when ``listenPort`` is 0), reports the bound port through
``task_status``, sets ``controller.ha`` to the :class:`HAService`, and serves until cancelled:

* on every role the acceptor serves slaves (``master.HAMaster.serve_slave`` per connection), as
  Java's ``AcceptSocketService`` does; the store's arrival listener wakes idle write tasks;
* on a SLAVE the :class:`~broker.ha.slave.HAClient` follows the master's HA address: the
  configured ``haMasterAddress`` when it is set (length >= 6, like Java), else the
  ``haServerAddr`` of every REGISTER_BROKER answer (``controller.register_listeners``); a changed
  address reconnects at once.

What the service needs from its broker is :class:`HABroker` (the ``BrokerController`` keeps it):
typed here, so HA does not import the controller, which holds the HA service.

For the send path (SYNC_MASTER), the processor calls, after the message is stored and flushed::

    status = await controller.ha.wait_for_replica(result.append.wrote_offset
                                                  + result.append.wrote_bytes)
    # PutMessageStatus.PUT_OK | FLUSH_SLAVE_TIMEOUT (code 12) | SLAVE_NOT_AVAILABLE (code 11)

only when ``store.broker_role == "SYNC_MASTER"`` and the message's WAIT property is absent or
"true".  It wakes the transfer tasks, answers SLAVE_NOT_AVAILABLE at once when no slave is
connected or the watermark is ``haSlaveFallbehindMax`` behind the message end, and otherwise
waits at most ``slaveTimeout`` (3 s) for a slave's ack (see ``watermark.py``).  The send
processor uses :meth:`HAService.watch_replica`, the same wait as a callback, so a waiting send
holds no task.

Observability: :meth:`HAService.slaves` (address, ack offset, lag in bytes and seconds, next
transfer offset) and :meth:`HAService.runtime_info` (the same flattened to strings, plus
``push2SlaveMaxOffset`` and the HA client's state on a slave) for GET_BROKER_RUNTIME_INFO.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import attrs
import trio

from broker.config import BrokerConfig
from broker.ha.master import HAMaster
from broker.ha.slave import Connect, HAClient, tcp_connect
from broker.ha.watermark import ReplicaWatermark
from broker.registrar import RegisterResult
from broker.store import MessageStoreConfig, PutMessageStatus
from broker.store.api import MessageStore
from common.remoting.network import Network

log = logging.getLogger(__name__)


@attrs.frozen
class SlaveInfo:
    addr: str
    # newest offset the slave reported (-1 before its first report)
    ack_offset: int
    # master max offset - ack offset
    lag_bytes: int
    # seconds since the slave last held everything the master had (0 when caught up)
    lag_seconds: float
    next_transfer: int
    bytes_sent: int


def configured_master_address(config: MessageStoreConfig) -> str | None:
    """``haMasterAddress`` counts only when it looks like an address (Java: length >= 6)."""
    addr = (config.ha_master_address or "").strip()
    return addr if len(addr) >= 6 else None


@attrs.define(eq=False)
class HAService:
    store: MessageStore
    config: MessageStoreConfig
    is_slave: bool = False
    connect: Connect = tcp_connect
    watermark: ReplicaWatermark = attrs.field(init=False)
    master: HAMaster = attrs.field(init=False)
    # the HA client; only on a SLAVE
    client: HAClient | None = attrs.field(init=False, default=None)
    port: int | None = None

    def __attrs_post_init__(self) -> None:
        self.watermark = ReplicaWatermark(fallbehind_max=self.config.ha_slave_fallbehind_max)
        self.master = HAMaster(self.store, self.config, self.watermark)
        if self.is_slave:
            self.client = HAClient(
                self.store,
                self.config,
                connect=self.connect,
                master_addr=configured_master_address(self.config),
            )

    # --- send path (SYNC_MASTER) ------------------------------------------------------------
    async def wait_for_replica(
        self, end_offset: int, timeout: float | None = None
    ) -> PutMessageStatus:
        """Wait until a slave holds the CommitLog up to ``end_offset`` (module docstring)."""
        self.master.notify_data()
        if timeout is None:
            timeout = self.config.slave_timeout
        return await self.watermark.wait_for(end_offset, timeout, end_offset)

    def watch_replica(
        self, end_offset: int, on_done: Callable[[PutMessageStatus], None]
    ) -> PutMessageStatus | None:
        """``wait_for_replica`` without a task: the status now when it is decided, else None
        and ``on_done(status)`` once later (``ReplicaWatermark.watch``; the service's own task
        keeps the ``slaveTimeout`` deadlines)."""
        self.master.notify_data()
        return self.watermark.watch(end_offset, self.config.slave_timeout, on_done, end_offset)

    @property
    def push2slave_max_offset(self) -> int:
        return self.watermark.value

    def is_slave_ok(self) -> bool:
        return self.watermark.is_slave_ok(self.store.get_max_phy_offset())

    # --- slave ------------------------------------------------------------------------------
    def update_master_address(self, addr: str | None) -> None:
        if self.client is not None:
            self.client.update_master_address(addr)

    def on_register_result(self, result: RegisterResult) -> None:
        """REGISTER_BROKER answer hook: follow the nameserver's ``haServerAddr``."""
        if result.ha_server_addr:
            self.update_master_address(result.ha_server_addr)

    # --- observability ----------------------------------------------------------------------
    def slaves(self) -> list[SlaveInfo]:
        now = trio.current_time()
        master_max = self.store.get_max_phy_offset()
        out = []
        for c in self.master.connections:
            ack = c.ack_offset
            behind = master_max - ack if ack >= 0 else master_max
            lag_s = 0.0 if behind <= 0 else now - max(c.caught_up_at, c.connected_at)
            out.append(SlaveInfo(c.addr, ack, max(behind, 0), lag_s, c.next_transfer, c.bytes_sent))
        return out

    def runtime_info(self) -> dict[str, str]:
        info = {
            "push2SlaveMaxOffset": str(self.watermark.value),
            "haConnectionCount": str(self.watermark.connections),
            "haWaitingSends": str(self.watermark.waiting),
        }
        for i, s in enumerate(self.slaves()):
            info[f"haSlave{i}Addr"] = s.addr
            info[f"haSlave{i}AckOffset"] = str(s.ack_offset)
            info[f"haSlave{i}LagBytes"] = str(s.lag_bytes)
            info[f"haSlave{i}LagMillis"] = str(int(s.lag_seconds * 1000))
        if self.client is not None:
            info["haMasterAddress"] = self.client.master_addr or ""
            info["haClientConnected"] = str(self.client.connected).lower()
            info["haClientReportedOffset"] = str(self.client.reported)
        return info


class HARegistrar(Protocol):
    # the master's HA address from the last REGISTER_BROKER answer (None before one)
    @property
    def ha_master_addr(self) -> str | None: ...


class HABroker(Protocol):
    """What the HA service needs from its broker (``broker.controller.BrokerController``)."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def store(self) -> MessageStore: ...

    # how the HA port is bound and the master reached
    @property
    def network(self) -> Network: ...

    @property
    def registrar(self) -> HARegistrar | None: ...

    # called with every REGISTER_BROKER answer
    @property
    def register_listeners(self) -> list[Callable[[RegisterResult], None]]: ...

    # set to the HA service once it serves (the send path waits on it)
    @property
    def ha(self) -> object: ...

    @ha.setter
    def ha(self, value: HAService) -> None: ...


async def run_ha_service(
    controller: HABroker,
    *,
    connect: Connect | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``run_broker``'s HA hook: bind, ``started(port)``, serve until cancelled.

    The HA port is bound and the master reached on the broker's network (``controller.network``)
    unless ``connect`` is given."""
    config = controller.config
    store = controller.store
    network = controller.network
    ha = HAService(
        store, config.store, is_slave=config.is_slave, connect=connect or network.connect
    )
    bound = await network.listen(config.listen_host, config.ha_port)
    ha.port = bound.port
    store.add_arrival_listener(ha.master.notify_data)
    store.add_write_listener(ha.master.notify_written)
    controller.ha = ha

    async def handle(stream: trio.abc.Stream) -> None:
        await ha.master.serve_slave(stream, network.peer_addr(stream))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, bound.listeners)
        await nursery.start(ha.watermark.run_expiry)
        if ha.client is not None:
            if configured_master_address(config.store) is None:
                controller.register_listeners.append(ha.on_register_result)
                registrar = controller.registrar
                if registrar is not None and registrar.ha_master_addr:
                    ha.update_master_address(registrar.ha_master_addr)
            await nursery.start(ha.client.run)
        log.info("HA service on port %d (%s)", ha.port, "slave" if ha.is_slave else "master")
        task_status.started(ha.port)


__all__ = ["HAService", "SlaveInfo", "configured_master_address", "run_ha_service"]
