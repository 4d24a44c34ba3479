"""Registration with the nameservers (RocketMQ ``BrokerController.registerBrokerAll`` +
``BrokerOuterAPI.registerBrokerAll`` / ``unregisterBrokerAll``).

Theory of operation
-------------------
A broker is routable only while nameservers hear from it: it sends REGISTER_BROKER with its
whole topic table (RegisterBrokerBody JSON, ``bodyCrc32`` = CRC32 masked to 31 bits like
``UtilAll.crc32``, version 407) to every nameserver in ``namesrvAddr`` in parallel, at start
and then every ``register_name_server_period`` (30 s; nameservers drop a broker after 120 s of
silence).  A topic change (auto-creation, admin update) asks for an immediate extra round
through :meth:`BrokerRegistrar.request_register`; requests that pile up while a round is in
flight collapse into one more round.

A nameserver that did not take a registration (not listening yet, timed out, refused) is
retried on its own, quickly: ``first_retry`` (0.2 s) after the failure, doubling up to the
period.  So a broker started together with (or before) its nameserver is routable as soon as
the nameserver listens, not 30 s later, and a nameserver that stays down costs one cheap
connect attempt per period after the first few seconds.  Nameservers that answered keep the
plain period.  A slave that has no master yet also retries this way while the nameservers answer
without a master address (the master has not registered yet): that answer is how it finds
its master, so its doubling stops at ``no_master_retry_cap`` (2 s) instead of the period.

Each nameserver is tried independently under its own timeout, so one dead nameserver neither
delays nor fails the others.  A slave learns its master's address and HA address from the
answer (``masterAddr`` / ``haServerAddr``); they are kept in ``master_addr`` /
``ha_master_addr`` and reported through ``on_result`` (the HA client and the slave sync hook in
there).  A DLedger member registers nothing while its brokerId is -1 (its Raft role is not known
yet) and calls :meth:`forget_master` on every role change.  On clean shutdown the service calls :meth:`unregister_all` under a shielded, bounded
cancel scope.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from typing import Protocol

import attrs
import trio

from common.errors import RmqError
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand

log = logging.getLogger(__name__)


def body_crc32(body: bytes) -> int:
    """``UtilAll.crc32``: java.util.zip.CRC32 masked to a non-negative int."""
    return zlib.crc32(body) & 0x7FFFFFFF


class Invoker(Protocol):
    """What the registrar and the slave sync ask of a remoting client
    (``common.remoting.client.RemotingClient``; tests hand in loopbacks)."""

    async def invoke(
        self, addr: str, cmd: RemotingCommand, timeout: float = ...
    ) -> RemotingCommand: ...


@attrs.frozen
class RegisterResult:
    namesrv_addr: str
    master_addr: str | None
    ha_server_addr: str | None


@attrs.define(eq=False)
class BrokerRegistrar:
    client: Invoker
    namesrv_addrs: list[str]
    # () -> dict of REGISTER_BROKER headers (brokerName, brokerAddr, clusterName, haServerAddr,
    # brokerId) and () -> RegisterBrokerBody JSON bytes; read fresh for every round
    header_fn: Callable[[], dict[str, str]]
    body_fn: Callable[[], bytes]
    period: float = 30.0
    timeout: float = 6.0
    on_result: Callable[[RegisterResult], None] | None = None
    # delay before the first retry of a nameserver that failed; doubles up to `period`
    first_retry: float = 0.2
    # a slave that registered but heard of no master doubles only up to this: the answer is the
    # only way it finds its master, and a master that starts a few seconds late (a loaded
    # machine, a slow disk) must not leave its slave unreplicated for half a period
    no_master_retry_cap: float = 2.0
    # set to ask the run loop for an immediate round
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    # addr -> (trio time of its next retry, delay used for it): exactly the nameservers whose
    # last registration failed; an address leaves it on its next success
    _retry: dict[str, tuple[float, float]] = attrs.field(factory=dict, init=False)
    # number of completed REGISTER_BROKER rounds
    rounds: int = attrs.field(default=0, init=False)
    master_addr: str | None = attrs.field(default=None, init=False)
    ha_master_addr: str | None = attrs.field(default=None, init=False)

    def request_register(self) -> None:
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.register_all()
        task_status.started()
        next_round = trio.current_time() + self.period
        while True:
            retry_at = min((at for at, _ in self._retry.values()), default=next_round)
            with trio.move_on_at(min(next_round, retry_at)):
                await self._wake.wait()
            now = trio.current_time()
            if self._wake.is_set() or now >= next_round:
                self._wake = trio.Event()
                await self.register_all()
                next_round = trio.current_time() + self.period
            else:
                due = [addr for addr, (at, _) in self._retry.items() if at <= now]
                await self.register_all(due)

    async def register_all(self, addrs: list[str] | None = None) -> list[RegisterResult]:
        """One round: every nameserver, or only `addrs` (the retries that are due)."""
        addrs = self.namesrv_addrs if addrs is None else addrs
        headers = self.header_fn()
        if not addrs or int(headers.get("brokerId", "0")) < 0:
            # (brokerId -1: a DLedger member that does not know its role yet registers nothing)
            self.rounds += 1
            return []
        body = self.body_fn()
        is_slave = int(headers.get("brokerId", "0")) > 0
        fields: dict[str, object] = {
            **headers,
            "compressed": False,
            "bodyCrc32": body_crc32(body),
        }
        results: list[RegisterResult] = []

        async def one(addr: str) -> None:
            cmd = RemotingCommand.request(RequestCode.REGISTER_BROKER, fields, body)
            try:
                resp = await self.client.invoke(addr, cmd, self.timeout)
            except RmqError as exc:
                self._failed(addr, f"register to name server {addr} failed: {exc}")
                return
            if resp.code != ResponseCode.SUCCESS:
                self._failed(
                    addr, f"name server {addr} refused registration: {resp.code} {resp.remark}"
                )
                return
            r = RegisterResult(
                addr, resp.ext_fields.get("masterAddr"), resp.ext_fields.get("haServerAddr")
            )
            results.append(r)

        async with trio.open_nursery() as nursery:
            for addr in addrs:
                nursery.start_soon(one, addr)
        self.rounds += 1
        if is_slave and not any(r.master_addr for r in results) and self.master_addr is None:
            # registered, but no nameserver knows the master yet (they often start together):
            # ask again soon instead of a period later, since the answer is how we find it
            for r in results:
                self._failed(
                    r.namesrv_addr,
                    f"name server {r.namesrv_addr} knows no master yet",
                    cap=self.no_master_retry_cap,
                )
        else:
            for r in results:
                self._retry.pop(r.namesrv_addr, None)
        for r in results:
            if r.master_addr or r.ha_server_addr:
                self.master_addr = r.master_addr
                self.ha_master_addr = r.ha_server_addr
            if self.on_result is not None:
                self.on_result(r)
        return results

    def forget_master(self) -> None:
        """The master may have changed (a DLedger role change): learn it from the next answers,
        retrying quickly while they name none, as at start."""
        self.master_addr = None
        self.ha_master_addr = None

    def _failed(self, addr: str, why: str, *, cap: float | None = None) -> None:
        previous = self._retry.get(addr)
        cap = self.period if cap is None else min(cap, self.period)
        delay = self.first_retry if previous is None else min(previous[1] * 2, cap)
        self._retry[addr] = (trio.current_time() + delay, delay)
        # the first failure is worth a warning; quick retries of a nameserver that is not up
        # yet would only repeat it
        level = logging.WARNING if previous is None or delay >= self.period else logging.DEBUG
        log.log(level, "%s; retrying in %.1f s", why, delay)

    async def unregister_all(self) -> None:
        headers = self.header_fn()
        if int(headers.get("brokerId", "0")) < 0:
            return  # never registered
        fields = {k: headers[k] for k in ("brokerName", "brokerAddr", "clusterName", "brokerId")}

        async def one(addr: str) -> None:
            cmd = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, fields)
            try:
                await self.client.invoke(addr, cmd, self.timeout)
            except RmqError as exc:
                log.warning("unregister from name server %s failed: %s", addr, exc)

        async with trio.open_nursery() as nursery:
            for addr in self.namesrv_addrs:
                nursery.start_soon(one, addr)
