"""Helpers shared by the tests of several packages (test modules cannot import each other).

:class:`MemoryNetwork` is a :class:`common.remoting.network.Network` made of in-memory streams:
hand it to ``run_namesrv``, ``run_broker`` and ``open_remoting_client`` and the real servers and
the real client run in one process, under ``autojump_clock``, with no socket.  It can refuse
connections to a port (a dead or partitioned node) and cut the open ones.

Ports for servers a test starts as separate processes: those processes bind fixed ports the
test chooses beforehand, so a chosen port must stay free until they bind it. Ports inside the
kernel's ephemeral range (`net.ipv4.ip_local_port_range`, 32768-60999 by default) can be taken
at any moment by an outgoing connection of any process on the machine (seen in CI: a broker's
port grabbed between the check and the bind), so blocks are drawn only outside that range.

:func:`small_tmpfs` mounts a tmpfs of a few MiB for the tests of a full disk (as root, or through
`sudo -n` as CI's package installs do; a mount that fails fails the test, it never skips it).

For tests and the chaos harness that speak the wire themselves: :func:`send_v2` builds a plain
SEND_MESSAGE_V2, :func:`pull_queue` reads one queue back from offset 0 and :func:`wait_serving`
waits for a broker process to serve.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import socket
import subprocess
import time
import weakref
from collections.abc import Collection, Iterator
from pathlib import Path

import attrs
import trio
import trio.testing

from common.message import MessageExt, decode_records
from common.remoting.client import RemotingClient
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.network import Bound, parse_addr

_LOW = 20000  # below: well-known and registered services


def ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# port -> monotonic time until which this process will not hand it out again. A block is drawn
# before anything binds it, so without this two draws made back to back (a master's and its
# slave's) could return overlapping blocks; the loser then dies of EADDRINUSE.
_issued: dict[int, float] = {}
_ISSUED_FOR = 600.0


def free_port_block(width: int = 10) -> int:
    """A base port B such that B-2 .. B+width are all free now, outside the ephemeral range
    (a broker needs B-2 for its VIP channel and B+1 for HA), and overlap no block this process
    handed out in the last ten minutes. Drawn at random so concurrent test runs rarely collide."""
    low, high = ephemeral_range()
    spans = [(lo, hi) for lo, hi in ((_LOW, low - 1), (high + 1, 65535)) if hi - lo > width + 12]
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    now = time.monotonic()
    for port in [p for p, until in _issued.items() if until <= now]:
        del _issued[port]
    for _ in range(500):
        lo, hi = rng.choice(spans)
        base = rng.randrange(lo + 2, hi - width, 10)
        span = range(base - 2, base + width + 1)
        if not any(p in _issued for p in span) and all(_bindable(p) for p in span):
            _issued.update(dict.fromkeys(span, now + _ISSUED_FOR))
            return base
    raise RuntimeError("no free block of loopback ports outside the ephemeral range")


@attrs.define(eq=False)
class _MemoryListener(trio.abc.Listener[trio.abc.Stream]):
    network: MemoryNetwork
    port: int
    # server ends of new connections, handed out by accept()
    _send: trio.MemorySendChannel[trio.abc.Stream]
    _recv: trio.MemoryReceiveChannel[trio.abc.Stream]

    async def accept(self) -> trio.abc.Stream:
        try:
            return await self._recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise trio.ClosedResourceError("listener closed") from None

    async def aclose(self) -> None:
        self.network._unbind(self)
        self._send.close()
        self._recv.close()
        await trio.lowlevel.checkpoint()


@attrs.define(eq=False)
class MemoryNetwork:
    """Loopback without sockets: ``listen``/``connect`` by port, any host name.

    Invariants: a port has at most one listener; ``connect`` to a port with none, or to a refused
    one, raises ``ConnectionRefusedError`` (what TCP's ECONNREFUSED looks like to our code); every
    connection's two ends are kept until closed so :meth:`cut` can end them.
    """

    first_port: int = 30000
    _next_port: int = attrs.field(init=False)
    _listeners: dict[int, _MemoryListener] = attrs.field(factory=dict)
    # ports whose connects are refused although something listens (a partition)
    refused: set[int] = attrs.field(factory=set)
    # port -> both ends of every connection made to it (weak: closed streams go away)
    _open: dict[int, weakref.WeakSet[trio.abc.Stream]] = attrs.field(factory=dict)
    # accepted stream -> the peer address the server sees
    _peers: weakref.WeakKeyDictionary[trio.abc.Stream, str] = attrs.field(
        factory=weakref.WeakKeyDictionary
    )
    connects: int = 0

    def __attrs_post_init__(self) -> None:
        self._next_port = self.first_port

    def _free_port(self) -> int:
        while self._next_port in self._listeners:
            self._next_port += 1
        port, self._next_port = self._next_port, self._next_port + 1
        return port

    async def listen(self, host: str, port: int) -> Bound:
        await trio.lowlevel.checkpoint()
        if port == 0:
            port = self._free_port()
        if port in self._listeners:
            raise OSError(errno.EADDRINUSE, f"address already in use: {host}:{port}")
        send, recv = trio.open_memory_channel[trio.abc.Stream](1000)
        listener = _MemoryListener(self, port, send, recv)
        self._listeners[port] = listener
        return Bound([listener], port)

    def _unbind(self, listener: _MemoryListener) -> None:
        if self._listeners.get(listener.port) is listener:
            del self._listeners[listener.port]

    async def connect(self, addr: str) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        _, port = parse_addr(addr)
        listener = self._listeners.get(port)
        if listener is None or port in self.refused:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"connection refused: {addr}")
        client_end, server_end = trio.testing.memory_stream_pair()
        self.connects += 1
        self._peers[server_end] = f"127.0.0.1:{40000 + self.connects}"
        ends = self._open.setdefault(port, weakref.WeakSet())
        ends.add(client_end)
        ends.add(server_end)
        try:
            listener._send.send_nowait(server_end)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            raise ConnectionRefusedError(
                errno.ECONNREFUSED, f"connection refused: {addr}"
            ) from None
        return client_end

    def peer_addr(self, stream: trio.abc.Stream) -> str:
        return self._peers.get(stream, "unknown")

    def listening(self, port: int) -> bool:
        return port in self._listeners

    async def cut(self, port: int) -> None:
        """End every open connection to ``port`` at once: both ends read EOF, as after the
        peer's process died (each end's sending half is closed)."""
        for stream in list(self._open.pop(port, ())):
            assert isinstance(stream, trio.StapledStream)
            await trio.aclose_forcefully(stream.send_stream)


@contextlib.contextmanager
def small_tmpfs(path: Path, mib: int) -> Iterator[Path]:
    """A tmpfs of ``mib`` MiB mounted at ``path`` (made here) until the block ends."""
    path.mkdir()
    # root mounts itself; anyone else through sudo (as CI installs packages), owning the mount
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    options = f"size={mib}m,uid={os.geteuid()},gid={os.getegid()},mode=0755"
    subprocess.run([*sudo, "mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run([*sudo, "umount", "-l", str(path)], check=False)


def send_v2(
    topic: str, queue_id: int, body: bytes, *, group: str = "pg", queues: int = 4
) -> RemotingCommand:
    """A SEND_MESSAGE_V2 of ``body`` to one queue of ``topic``, with no properties, as a
    producer of ``group`` sends it (the topic is created with ``queues`` queues if missing)."""
    return RemotingCommand.request(
        RequestCode.SEND_MESSAGE_V2,
        {"a": group, "b": topic, "c": "TBW102", "d": queues, "e": queue_id}
        | {"f": 0, "g": 0, "h": 0, "i": ""},
        body,
    )


async def pull_queue(
    client: RemotingClient,
    addr: str,
    topic: str,
    queue_id: int,
    *,
    group: str = "check",
    ends: Collection[int] | None = None,
    skip: Collection[int] = (),
) -> list[MessageExt]:
    """Every record of one queue from offset 0 on, by plain PULLs (no suspend, no commit):
    how a test or the chaos harness reads back what a broker holds.

    By default any answer but SUCCESS ends the read quietly.  With ``ends``, the read may end
    only on one of those codes: any other, or a SUCCESS whose nextBeginOffset does not move on,
    fails it (AssertionError).  An answer with a code in ``skip`` (PULL_RETRY_IMMEDIATELY: the
    records there were removed under the read) moves the read on to its nextBeginOffset."""
    out: list[MessageExt] = []
    offset = 0
    while True:
        r = await client.invoke(
            addr,
            RemotingCommand.request(
                RequestCode.PULL_MESSAGE,
                {"consumerGroup": group, "topic": topic, "queueId": queue_id}
                | {"queueOffset": offset, "maxMsgNums": 32, "sysFlag": 4, "commitOffset": 0}
                | {"suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0},
            ),
            timeout=10,
        )
        if r.code == ResponseCode.SUCCESS:
            out.extend(decode_records(bytes(r.body), check_crc=True))
        elif r.code not in skip:
            if ends is not None and r.code not in ends:
                raise AssertionError(f"pull at {offset} answered {r.code}: {r.remark}")
            return out
        nxt = int(r.ext_fields["nextBeginOffset"])
        if nxt <= offset:
            if ends is not None and r.code == ResponseCode.SUCCESS:
                raise AssertionError(f"pull at {offset} found records but moved on to {nxt}")
            return out
        offset = nxt


async def wait_serving(
    client: RemotingClient,
    addr: str,
    proc: subprocess.Popen[bytes] | None = None,
    *,
    timeout: float = 30.0,
) -> None:
    """Until the broker at ``addr`` answers (GET_BROKER_RUNTIME_INFO: it serves once its store
    recovered); a ``proc`` that exits meanwhile fails the wait at once."""
    with trio.fail_after(timeout):
        while True:
            assert proc is None or proc.poll() is None, "the broker exited while starting"
            try:
                r = await client.invoke(
                    addr,
                    RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}),
                    timeout=1.0,
                )
                if r.code == ResponseCode.SUCCESS:
                    return
            except Exception:
                client.close_channel(addr)
            await trio.sleep(0.05)
