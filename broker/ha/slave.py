"""The slave side of classic HA (RocketMQ ``HAService.HAClient``).

Theory of operation
-------------------
:meth:`HAClient.run` is one task that keeps at most one connection to the master's HA port.

States: *no address* (wait for :meth:`HAClient.update_master_address`), *disconnected* (connect
attempts at most once per ``reconnect_interval``, 5 s, as RocketMQ, so a master that is down costs
one attempt per 5 s, and one that accepts and drops us cannot make us spin; a *changed* address is
tried at once), *connected* (below).

A connection the *master* ended (EOF or reset, not one we left over a protocol disagreement or its
silence) is different: the master most likely restarts, and a restarted master listens again within
a second or two, while its readiness (``rmq up``/``rmq restart``) and SYNC_MASTER sends wait for
this slave. So the slave tries again at once, then every 0.1 s for ``fast_retry_flat`` (2 s: a
master restarted by a supervisor listens within about a second, and a refused loopback connect
costs microseconds) until a connection opens, then with a bounded backoff (doubling up to
``fast_retry_max``, 1 s) until ``fast_retry_window`` (30 s) has passed, then one attempt per 5 s
again. At most ``fast_retry_windows`` (5) such windows begin in 30 s (a master restarted five
times in a row is found at once each time); past that a lost connection takes the backoff of the
window running, so a master that accepts and drops us cannot make us spin: about one attempt per
second at worst. A connection is left on EOF, on a transport error, on garbage, on an offset
mismatch, when the store refuses an append, after ``haHousekeepingInterval`` (20 s) without a byte
from the master, and when the master address changes.

Connected, two tasks share the connection's nursery:

* *reporter*: sends the slave's CommitLog max offset (8 bytes) on connect, again whenever it grew
  past the last report (after appends), and at least every ``haSendHeartbeatInterval`` (5 s).
* *reader*: decodes 12-byte header + body frames (``protocol.TransferDecoder``, any split).  For
  each frame: if the slave's max offset is not 0 and differs from the frame's offset, the streams
  disagree ("master pushed offset not equal the max phy offset in slave"): close, and the next
  connection re-reports the real max offset so the master resumes from there.  The slave never
  truncates.  A body is appended with ``store.append_to_commit_log(offset, body)`` (then
  dispatched into the slave's own ConsumeQueues and index, see below); a size-0 frame is a
  heartbeat.
  After a read that appended, the reader reports the new max offset itself when the reporter is
  not writing (a lock makes them take turns), as Java's HAClient does: a SYNC_MASTER send waits
  for that report, and going through the reporter task cost a scheduler pass on every ack.  The
  report is written straight to the socket (no ``send_all``, whose checkpoints cost two more
  passes) and only then are the appended records dispatched into the slave's queues and index,
  on the same turn (``dispatch_appended``; the reput task takes over only what one round
  leaves, as in a catch-up): one scheduler pass per transfer instead of three.

Invariants: bytes are appended only at exactly the slave's max offset, in stream order; every
report is a max offset the slave really holds.
"""

from __future__ import annotations

import logging
import math
import os
from collections import deque
from collections.abc import Awaitable, Callable

import attrs
import trio

from broker.ha.protocol import HAProtocolError, TransferDecoder, encode_report
from broker.ha.receive import Receiver
from broker.store import MessageStoreConfig
from broker.store.api import MessageStore

log = logging.getLogger(__name__)

# one read takes whatever the socket holds, up to this: big, so that a catching-up slave gets
# through megabytes per scheduler pass (the reput task gets one small batch per pass)
READ_SIZE = 4 * 1024 * 1024

Connect = Callable[[str], Awaitable[trio.abc.Stream]]


async def tcp_connect(addr: str) -> trio.abc.Stream:
    host, _, port = addr.rpartition(":")
    return await trio.open_tcp_stream(host.strip("[]") or "127.0.0.1", int(port))


def _write_nowait(fd: int, data: bytes) -> int:
    """Bytes of ``data`` the socket ``fd`` took without blocking (0 if none, or not a socket:
    ``fd`` < 0); a dead connection raises ``trio.BrokenResourceError`` as ``send_all`` would.

    An 8-byte report nearly always fits the socket buffer: written like this it costs no
    scheduler pass, where ``send_all`` takes two checkpoints (a pass each)."""
    if fd < 0:
        return 0
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise trio.BrokenResourceError(f"HA socket: {exc}") from exc


class _Close(Exception):
    """Leave the current connection (the reason was logged)."""


@attrs.define(eq=False)
class HAClient:
    store: MessageStore
    config: MessageStoreConfig
    connect: Connect = tcp_connect
    master_addr: str | None = None
    reconnect_interval: float = 5.0
    # retries after the master ended the connection (see the module docstring)
    fast_retry_first: float = 0.1
    fast_retry_flat: float = 2.0
    fast_retry_windows: int = 5
    fast_retry_max: float = 1.0
    fast_retry_window: float = 30.0
    # RemotingUtil.connect's 5 s bound on one TCP connect
    connect_timeout: float = 5.0
    # True while a connection to the master is open
    connected: bool = False
    # connect attempts so far (tests and runtime info)
    attempts: int = 0
    # the offset of the last report sent to the master; -1 before the first
    reported: int = -1
    # Trio time of the last byte received from the master
    last_read: float = 0.0
    # set (and replaced) whenever master_addr changes
    _addr_event: trio.Event = attrs.field(factory=trio.Event)
    # the running connection's scope; cancelled to drop it when the address changes
    _conn_scope: trio.CancelScope | None = None
    # the master ended the current connection (EOF or reset), as opposed to us leaving it
    _master_left: bool = False
    # the reporter parks here; the reader wakes it after appends
    _lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    # one writer of reports at a time: the reader (right after it appended) or the reporter
    _send_lock: trio.Lock = attrs.field(factory=trio.Lock)
    # called with the master's address each time a connection to it opens (the slave's
    # metadata sync runs at once when a master comes back: broker/slave_sync.py)
    connect_listeners: list[Callable[[str], None]] = attrs.field(factory=list)

    def update_master_address(self, addr: str | None) -> None:
        """Follow the master's HA address (config or nameserver answer); a change reconnects."""
        if not addr or addr == self.master_addr:
            return
        log.info("HA master address %s -> %s", self.master_addr, addr)
        self.master_addr = addr
        ev, self._addr_event = self._addr_event, trio.Event()
        ev.set()
        if self._conn_scope is not None:
            self._conn_scope.cancel()

    async def run(
        self, *, task_status: trio.TaskStatus[HAClient] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started(self)
        next_attempt = -math.inf
        last_addr: str | None = None
        lost_at = -math.inf  # when the last fast-retry window began
        windows: deque[float] = deque(maxlen=self.fast_retry_windows)  # when the last began
        flat_until = -math.inf  # retry every fast_retry_first until then (no connection yet)
        backoff = self.fast_retry_first

        def retry_at(attempted: float) -> float:
            nonlocal backoff
            now = trio.current_time()
            if now < flat_until:
                return now + self.fast_retry_first
            if now - lost_at < self.fast_retry_window:
                delay, backoff = backoff, min(backoff * 2, self.fast_retry_max)
                return now + delay
            return attempted + self.reconnect_interval

        while True:
            ev = self._addr_event
            addr = self.master_addr
            if addr is None:
                await ev.wait()
                continue
            now = trio.current_time()
            if addr == last_addr and now < next_attempt:
                with trio.move_on_at(next_attempt):
                    await ev.wait()
                continue
            last_addr = addr
            self.attempts += 1
            stream = None
            try:
                with trio.move_on_after(self.connect_timeout):
                    stream = await self.connect(addr)
            except OSError as exc:
                log.info("HA connect to master %s failed: %s", addr, exc)
                next_attempt = retry_at(now)
                continue
            if stream is None:
                log.info("HA connect to master %s timed out", addr)
                next_attempt = retry_at(now)
                continue
            self._master_left = False
            flat_until = -math.inf  # it listens: a drop from here on takes the backoff
            await self._serve(stream, addr)
            ended = trio.current_time()
            if self._master_left and (
                len(windows) < self.fast_retry_windows
                or ended - windows[0] >= self.fast_retry_window
            ):
                windows.append(ended)
                # the master went away (a restart?): at once, then the bounded backoff
                lost_at, backoff = ended, self.fast_retry_first
                flat_until = ended + self.fast_retry_flat
                next_attempt = ended
            else:
                next_attempt = retry_at(now)

    async def _serve(self, stream: trio.abc.Stream, addr: str) -> None:
        self.connected = True
        self.last_read = trio.current_time()
        self.reported = -1
        try:
            with trio.CancelScope() as scope:
                self._conn_scope = scope
                if self.master_addr != addr:  # changed while we were connecting
                    return
                for listener in self.connect_listeners:
                    listener(addr)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._reporter, stream, nursery.cancel_scope)
                    nursery.start_soon(self._reader, stream, nursery.cancel_scope)
        finally:
            self._conn_scope = None
            self.connected = False
            await trio.aclose_forcefully(stream)
            log.info("HA connection to master %s closed", addr)

    async def _reporter(self, stream: trio.abc.Stream, scope: trio.CancelScope) -> None:
        heartbeat = self.config.ha_send_heartbeat_interval
        try:
            while True:
                async with self._send_lock:
                    offset = self.store.get_max_phy_offset()
                    await stream.send_all(encode_report(offset))
                    self.reported = offset
                last = trio.current_time()
                while self.store.get_max_phy_offset() <= self.reported:
                    left = last + heartbeat - trio.current_time()
                    if left <= 0:
                        break
                    with trio.move_on_after(left):
                        await self._lot.park()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._master_left = True
            log.info("HA report to master failed: %s", exc)
        finally:
            scope.cancel()

    async def _read_transfers(
        self,
        stream: trio.abc.Stream,
        receiver: Receiver,
        decoder: TransferDecoder,
        timer: trio.CancelScope,
    ) -> None:
        """Append every transfer received, report after each read that appended; returns
        only when ``timer``'s deadline (silence) cancels it."""
        store = self.store
        housekeeping = self.config.ha_housekeeping_interval
        while True:
            data = await receiver.receive()
            if not data:
                self._master_left = True
                raise _Close("master closed the connection")
            self.last_read = now = trio.current_time()
            timer.deadline = now + housekeeping
            appended = False
            try:
                for t in decoder.feed(data):
                    mine = store.get_max_phy_offset()
                    if mine != 0 and t.offset != mine:
                        raise _Close(
                            f"master pushed offset {t.offset} not equal the max phy offset "
                            f"in slave {mine}"
                        )
                    if t.body:
                        # dispatched after the ack below (wake_reput=False)
                        if not store.append_to_commit_log(t.offset, t.body, wake_reput=False):
                            raise _Close(f"store refused {len(t.body)} bytes at {t.offset}")
                        appended = True
            except BaseException:
                if appended:
                    store.dispatch_appended()  # what was appended before the error, all the same
                raise
            if not appended:
                continue
            if self._send_lock.locked():
                store.dispatch_appended()
                if len(self._lot):
                    self._lot.unpark_all()  # the reporter is writing; it sends again after
                continue
            # report from here, as Java's HAClient does after each read: a SYNC_MASTER send
            # waits for this; a hop through the reporter task, or send_all, costs a pass
            offset = store.get_max_phy_offset()
            report = encode_report(offset)
            try:
                sent = _write_nowait(receiver.fd, report)
            finally:
                # the ack is out (unless the socket was full or gone): the queues and index
                # come after it, before the next await (append_to_commit_log's contract)
                store.dispatch_appended()
            if sent < len(report):
                async with self._send_lock:
                    await stream.send_all(report[sent:])
            self.reported = offset

    async def _reader(self, stream: trio.abc.Stream, scope: trio.CancelScope) -> None:
        decoder = TransferDecoder()
        housekeeping = self.config.ha_housekeeping_interval
        receiver = Receiver(stream, READ_SIZE)
        try:
            # one deadline, moved on by every read (not a scope per read: see receive.py)
            with trio.CancelScope(deadline=trio.current_time() + housekeeping) as timer:
                await self._read_transfers(stream, receiver, decoder, timer)
            raise _Close(f"master silent for {housekeeping:.0f} s")
        except _Close as why:
            log.warning("HA leaving master connection: %s", why)
        except (trio.BrokenResourceError, trio.ClosedResourceError, HAProtocolError) as exc:
            self._master_left = not isinstance(exc, HAProtocolError)
            log.info("HA read from master failed: %s", exc)
        finally:
            scope.cancel()


__all__ = ["Connect", "HAClient", "tcp_connect"]
