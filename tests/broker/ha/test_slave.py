"""The slave's HAClient against a hand-driven fake master over memory streams."""

from __future__ import annotations

import socket
import struct

import pytest
import trio
import trio.testing

from broker.ha.protocol import ReportDecoder, encode_header
from broker.ha.slave import HAClient

SEG = 4096


class FakeMasterNet:
    """connect(addr) hands out memory streams; the test receives the master ends."""

    def __init__(self, refuse=()):
        self.send, self.recv = trio.open_memory_channel(100)
        self.attempts = []  # (trio time, addr)
        self.refuse = set(refuse)

    async def connect(self, addr):
        self.attempts.append((trio.current_time(), addr))
        if addr in self.refuse:
            raise OSError("connection refused")
        a, b = trio.testing.memory_stream_pair()
        await self.send.send((addr, b))
        return a

    async def accept(self, timeout=60.0):
        with trio.fail_after(timeout):
            addr, stream = await self.recv.receive()
        return addr, MasterEnd(stream)


class MasterEnd:
    def __init__(self, stream):
        self.stream = stream
        self.decoder = ReportDecoder()

    async def report(self, timeout=60.0):
        """The next report (None on EOF) and when it came."""
        with trio.fail_after(timeout):
            while True:
                data = await self.stream.receive_some(8)
                if not data:
                    return None, trio.current_time()
                off = self.decoder.feed(data)
                if off is not None:
                    return off, trio.current_time()

    async def push(self, offset, body=b""):
        await self.stream.send_all(encode_header(offset, len(body)) + body)


@pytest.fixture
def client_for():
    def make(store, net, addr="master:10912"):
        return HAClient(store, store.config, connect=net.connect, master_addr=addr)

    return make


async def test_reports_on_connect_after_append_and_every_5s(
    open_store, mk, client_for, commit_log_bytes, autojump_clock
):
    async with open_store("m") as m, open_store("s", broker_role="SLAVE") as s:
        for i in range(3):
            await m.put_message(mk(body=b"%d" % i * 100))
        data = commit_log_bytes(m)
        net = FakeMasterNet()
        client = client_for(s, net)
        async with trio.open_nursery() as n:
            await n.start(client.run)
            _, master = await net.accept()
            assert await master.report() == (0, 0.0)  # at once on connect
            assert client.connected
            await master.push(0, data[:100])
            assert await master.report() == (100, 0.0)  # after the append
            await master.push(100, data[100:])
            assert await master.report() == (len(data), 0.0)
            # idle: one report per 5 s (master heartbeats keep the slave's housekeeping quiet)
            for k in (1, 2, 3):
                off, when = await master.report()
                assert (off, when) == (len(data), 5.0 * k)
                await master.push(len(data))
            n.cancel_scope.cancel()
        await s.wait_dispatched()
        assert commit_log_bytes(s) == data
        assert s.get_max_offset_in_queue("T", 0) == 3


async def test_offset_mismatch_closes_and_re_reports(
    open_store, mk, client_for, commit_log_bytes, autojump_clock
):
    async with open_store("m") as m, open_store("s", broker_role="SLAVE") as s:
        for _ in range(2):
            await m.put_message(mk(body=b"y" * 50))
        data = commit_log_bytes(m)
        net = FakeMasterNet()
        client = client_for(s, net)
        async with trio.open_nursery() as n:
            await n.start(client.run)
            _, master = await net.accept()
            await master.report()
            await master.push(0, data[:40])
            await master.report()
            await master.push(41, data[41:])  # not where the slave is
            off, when = await master.report()
            assert off is None  # the slave hung up
            assert s.get_max_phy_offset() == 40  # nothing appended from the bad frame
            _, master2 = await net.accept()
            off, when2 = await master2.report()
            assert off == 40  # re-reports its real max offset
            assert when2 - net.attempts[0][0] == 5.0  # at most one connect per 5 s
            await master2.push(40, data[40:])
            assert (await master2.report())[0] == len(data)
            n.cancel_scope.cancel()
        assert commit_log_bytes(s) == data


async def test_heartbeat_offset_mismatch_also_closes(open_store, mk, client_for, autojump_clock):
    async with open_store("s", broker_role="SLAVE") as s:
        assert s.append_to_commit_log(0, b"\0" * 64)
        net = FakeMasterNet()
        async with trio.open_nursery() as n:
            await n.start(client_for(s, net).run)
            _, master = await net.accept()
            assert (await master.report())[0] == 64
            await master.push(128)
            assert (await master.report())[0] is None
            n.cancel_scope.cancel()


async def test_empty_slave_accepts_any_start_offset(
    open_store, mk, client_for, commit_log_bytes, autojump_clock
):
    async with open_store("m") as m, open_store("s", broker_role="SLAVE") as s:
        for i in range(30):
            await m.put_message(mk(qid=i % 2, body=b"z" * 400))
        start = m.get_max_phy_offset() - m.get_max_phy_offset() % SEG
        assert start > 0
        tail = commit_log_bytes(m, start)
        net = FakeMasterNet()
        async with trio.open_nursery() as n:
            await n.start(client_for(s, net).run)
            _, master = await net.accept()
            assert (await master.report())[0] == 0
            await master.push(start, tail)
            assert (await master.report())[0] == start + len(tail)
            n.cancel_scope.cancel()
        assert s.get_min_phy_offset() == start
        assert commit_log_bytes(s) == tail


async def test_silent_master_is_dropped_after_20s_and_reconnected(
    open_store, client_for, autojump_clock
):
    async with open_store("s", broker_role="SLAVE") as s:
        net = FakeMasterNet()
        client = client_for(s, net)
        async with trio.open_nursery() as n:
            await n.start(client.run)
            _, master = await net.accept()
            seen = []
            while True:
                off, when = await master.report()
                if off is None:
                    break
                seen.append(when)
            assert seen == [0.0, 5.0, 10.0, 15.0]
            assert when == 20.0
            _, master2 = await net.accept()
            assert (await master2.report()) == (0, 20.0)
            n.cancel_scope.cancel()


async def test_refused_connects_retry_every_5s(open_store, client_for, autojump_clock):
    async with open_store("s", broker_role="SLAVE") as s:
        net = FakeMasterNet(refuse={"master:10912"})
        client = client_for(s, net)
        async with trio.open_nursery() as n:
            await n.start(client.run)
            await trio.sleep(21)
            assert [t for t, _ in net.attempts] == [0.0, 5.0, 10.0, 15.0, 20.0]
            assert not client.connected
            n.cancel_scope.cancel()


async def test_follows_a_changed_master_address_at_once(open_store, client_for, autojump_clock):
    async with open_store("s", broker_role="SLAVE") as s:
        net = FakeMasterNet()
        client = client_for(s, net, addr=None)
        async with trio.open_nursery() as n:
            await n.start(client.run)
            await trio.sleep(30)
            assert net.attempts == []  # no address, no connect
            client.update_master_address("old:10912")
            addr, old = await net.accept()
            assert addr == "old:10912"
            await old.report()
            await trio.sleep(1)
            client.update_master_address("old:10912")  # same address: nothing happens
            client.update_master_address(None)  # a registration without a master: ignored
            await trio.sleep(1)
            assert len(net.attempts) == 1
            client.update_master_address("new:20912")
            assert (await old.report())[0] is None  # the old connection is dropped
            addr, new = await net.accept()
            assert addr == "new:20912"
            assert (await new.report()) == (0, 32.0)  # immediately, no 5 s wait
            n.cancel_scope.cancel()


async def test_garbage_from_master_closes(open_store, client_for, autojump_clock):
    async with open_store("s", broker_role="SLAVE") as s:
        net = FakeMasterNet()
        async with trio.open_nursery() as n:
            await n.start(client_for(s, net).run)
            _, master = await net.accept()
            await master.report()
            await master.stream.send_all(struct.pack(">qi", 0, -7))
            assert (await master.report())[0] is None
            n.cancel_scope.cancel()
        assert s.get_max_phy_offset() == 0


async def test_connect_listeners_hear_every_connection(open_store, client_for, autojump_clock):
    # the slave's metadata sync runs at once when its master (re)appears (broker/slave_sync.py)
    async with open_store("s", broker_role="SLAVE") as s:
        net = FakeMasterNet()
        client = client_for(s, net)
        heard: list[tuple[str, float]] = []
        client.connect_listeners.append(lambda addr: heard.append((addr, trio.current_time())))
        async with trio.open_nursery() as n:
            await n.start(client.run)
            _, master = await net.accept()
            await master.report()
            assert heard == [("master:10912", 0.0)]
            await master.stream.aclose()  # the master goes away; the slave comes back at once
            _, master2 = await net.accept()
            await master2.report()
            assert heard == [("master:10912", 0.0), ("master:10912", 0.0)]
            n.cancel_scope.cancel()


async def test_lost_connection_retries_with_bounded_backoff(open_store, client_for, autojump_clock):
    """A master that restarts is back within a second or two: after the master ended the
    connection, the slave retries at once, then every 0.1 s for 2 s, then doubling up to 1 s
    until 30 s have passed, then every 5 s again (RocketMQ's interval)."""
    async with open_store("s", broker_role="SLAVE") as s:
        net = FakeMasterNet()
        client = client_for(s, net)
        async with trio.open_nursery() as n:
            await n.start(client.run)
            _, master = await net.accept()
            await master.report()
            await trio.sleep(6)
            net.refuse.add("master:10912")  # the master dies and is not listening yet
            await master.stream.aclose()
            await trio.sleep(40)
            times = [round(t, 6) for t, _ in net.attempts]
            assert times[:4] == [0.0, 6.0, 6.1, 6.2]
            gaps = [round(b - a, 6) for a, b in zip(times[1:], times[2:], strict=False)]
            flat = [g for t, g in zip(times[1:], gaps, strict=False) if t < 7.95]
            assert len(flat) >= 19 and set(flat) == {0.1}  # a restarted master is found at once
            later = [g for t, g in zip(times[1:], gaps, strict=False) if 8.05 < t < 36.0]
            assert later == sorted(later) and later[-1] == 1.0  # then the bounded backoff
            assert max(gaps) == 5.0 and gaps[-1] == 5.0  # back to one attempt per 5 s
            assert all(t - 6.0 < 30.0 for t, g in zip(times[1:], gaps, strict=False) if g < 5)
            net.refuse.clear()  # the master listens again
            _, master2 = await net.accept()
            assert (await master2.report())[0] == 0
            n.cancel_scope.cancel()


async def test_a_master_that_accepts_and_drops_cannot_make_the_slave_spin(
    open_store, client_for, autojump_clock
):
    async with open_store("s", broker_role="SLAVE") as s:
        net = FakeMasterNet()
        client = client_for(s, net)
        async with trio.open_nursery() as n:
            await n.start(client.run)
            while trio.current_time() < 60:
                _, master = await net.accept()
                await master.stream.aclose()
            times = [round(t, 6) for t, _ in net.attempts]
            # five windows at once (five restarts), then the backoff of the last one
            assert times[:10] == [0.0] * 6 + [0.1, 0.3, 0.7, 1.5]
            assert len(times) <= 80  # about one attempt per second, at worst
            n.cancel_scope.cancel()


async def test_a_second_restart_soon_after_the_first_is_found_as_fast(
    open_store, client_for, autojump_clock
):
    """Restarts 10 s apart: each loss retries every 0.1 s again (one window per 30 s would leave
    the second one on the grown backoff)."""
    async with open_store("s", broker_role="SLAVE") as s:
        net = FakeMasterNet()
        client = client_for(s, net)
        async with trio.open_nursery() as n:
            await n.start(client.run)
            _, master = await net.accept()
            await master.report()
            for restart_at in (6.0, 16.0, 26.0):
                await trio.sleep_until(restart_at)
                net.refuse.add("master:10912")
                await master.stream.aclose()
                await trio.sleep(1.0)  # the master is down for a second
                net.refuse.clear()
                _, master = await net.accept()
                await master.report()
                back = [round(t, 6) for t, _ in net.attempts if t >= restart_at]
                assert back[:3] == [restart_at, restart_at + 0.1, restart_at + 0.2]
                assert back[-1] - restart_at <= 1.1  # found within 0.1 s of listening again
            n.cancel_scope.cancel()


def test_a_report_written_straight_to_the_socket() -> None:
    # the slave's ack skips send_all: what the socket takes, 0 when it takes nothing (or the
    # stream is not a socket), BrokenResourceError when the peer is gone
    from broker.ha.slave import _write_nowait

    a, b = socket.socketpair()
    try:
        a.setblocking(False)
        assert _write_nowait(a.fileno(), b"12345678") == 8
        assert b.recv(8) == b"12345678"
        assert _write_nowait(-1, b"12345678") == 0
        while _write_nowait(a.fileno(), b"x" * 65536):
            pass  # fill the buffer: then nothing more is taken
        assert _write_nowait(a.fileno(), b"12345678") == 0
        b.close()
        with pytest.raises(trio.BrokenResourceError):
            _write_nowait(a.fileno(), b"12345678")
    finally:
        a.close()
        b.close()
