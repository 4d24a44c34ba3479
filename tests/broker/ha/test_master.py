"""The master's HA connection against a hand-driven fake slave over memory streams."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator

import trio
import trio.testing

from broker.ha.master import HAMaster, SlaveConnection
from broker.ha.protocol import TransferDecoder, encode_report
from broker.ha.watermark import ReplicaWatermark
from broker.store import DefaultMessageStore
from common.remoting.deferred_answer import flush_batch

SEG = 4096


class FakeSlave:
    def __init__(self, stream):
        self.stream = stream
        self.decoder = TransferDecoder()
        self.frames = []  # (trio time, Transfer)

    async def report(self, offset):
        await self.stream.send_all(encode_report(offset))

    async def next_frame(self, timeout=60.0):
        with trio.fail_after(timeout):
            while True:
                if self.frames:
                    return self.frames.pop(0)
                data = await self.stream.receive_some(65536)
                if not data:
                    return None
                now = trio.current_time()
                self.frames += [(now, t) for t in self.decoder.feed(data)]


async def fill(store, mk, n, size=500):
    for i in range(n):
        r = await store.put_message(mk(qid=i % 4, body=bytes([i % 256]) * size))
        assert r.ok


def master_for(store, **kw):
    return HAMaster(store, store.config, ReplicaWatermark(fallbehind_max=1 << 30), **kw)


async def test_offset_zero_starts_at_last_file_and_chunks_never_cross_files(
    open_store, mk, commit_log_bytes, autojump_clock
):
    async with open_store(mapped_file_size_commit_log=SEG, ha_transfer_batch_size=1000) as store:
        await fill(store, mk, 30)
        max_off = store.get_max_phy_offset()
        assert max_off > 3 * SEG
        master = master_for(store)
        a, b = trio.testing.memory_stream_pair()
        slave = FakeSlave(b)
        async with trio.open_nursery() as n:
            n.start_soon(master.serve_slave, a, "fake")
            # nothing before the first report
            with trio.move_on_after(2.0):
                await b.receive_some(1)
                raise AssertionError("master wrote before the first report")
            await slave.report(0)
            start = max_off - max_off % SEG
            got = bytearray()
            pos = start
            while pos < max_off:
                _, t = await slave.next_frame()
                assert t.offset == pos
                assert 0 < len(t.body) <= 1000
                # never across a file boundary
                assert t.offset // SEG == (t.offset + len(t.body) - 1) // SEG
                got += t.body
                pos += len(t.body)
            assert bytes(got) == commit_log_bytes(store, start)
            assert master.connections[0].request_offset == 0
            assert master.watermark.connections == 1
            n.cancel_scope.cancel()
        assert master.watermark.connections == 0 and not master.connections


async def test_resumes_from_reported_offset_and_follows_new_data(
    open_store, mk, commit_log_bytes, autojump_clock
):
    async with open_store(mapped_file_size_commit_log=SEG) as store:
        await fill(store, mk, 20)
        master = master_for(store)
        store.add_arrival_listener(master.notify_data)
        a, b = trio.testing.memory_stream_pair()
        slave = FakeSlave(b)
        async with trio.open_nursery() as n:
            n.start_soon(master.serve_slave, a, "fake")
            await slave.report(SEG)  # a slave that holds exactly the first file
            pos = SEG
            while pos < store.get_max_phy_offset():
                _, t = await slave.next_frame()
                assert t.offset == pos
                pos += len(t.body)
            # new data is pushed promptly (woken, not polled at the heartbeat period)
            t0 = trio.current_time()
            await fill(store, mk, 1)
            when, t = await slave.next_frame()
            assert t.offset == pos and len(t.body) > 0
            assert when - t0 <= 0.1
            n.cancel_scope.cancel()


async def test_heartbeat_after_five_idle_seconds(open_store, mk, autojump_clock):
    async with open_store() as store:
        await fill(store, mk, 2)
        end = store.get_max_phy_offset()
        master = master_for(store)
        a, b = trio.testing.memory_stream_pair()
        slave = FakeSlave(b)
        async with trio.open_nursery() as n:
            n.start_soon(master.serve_slave, a, "fake")
            await slave.report(end)  # caught up: nothing to send
            t0 = trio.current_time()
            beats = []
            for _ in range(3):
                when, t = await slave.next_frame()
                assert t.is_heartbeat and t.offset == end
                beats.append(when - t0)
                await slave.report(end)  # keep the master's housekeeping happy
            assert beats == [5.0, 10.0, 15.0]
            n.cancel_scope.cancel()


async def test_housekeeping_closes_a_silent_slave(open_store, mk, autojump_clock):
    async with open_store() as store:
        await fill(store, mk, 1)
        master = master_for(store)
        a, b = trio.testing.memory_stream_pair()
        slave = FakeSlave(b)
        with trio.fail_after(100):
            async with trio.open_nursery() as n:
                n.start_soon(master.serve_slave, a, "fake")
                await trio.sleep(1.0)
                await slave.report(store.get_max_phy_offset())
                t0 = trio.current_time()
                while (await slave.next_frame()) is not None:
                    pass  # heartbeats until the master hangs up
                assert trio.current_time() - t0 == 20.0
        assert master.watermark.connections == 0


async def test_report_beyond_master_max_closes(open_store, mk, autojump_clock):
    async with open_store() as store:
        await fill(store, mk, 1)
        master = master_for(store)
        a, b = trio.testing.memory_stream_pair()
        slave = FakeSlave(b)
        with trio.fail_after(1):
            async with trio.open_nursery() as n:
                n.start_soon(master.serve_slave, a, "fake")
                await slave.report(store.get_max_phy_offset() + 1)
                assert await slave.next_frame() is None
        assert master.watermark.value == 0


async def test_reports_raise_the_watermark_last_word_wins(open_store, mk, autojump_clock):
    async with open_store() as store:
        await fill(store, mk, 3)
        end = store.get_max_phy_offset()
        master = master_for(store)
        a, b = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as n:
            n.start_soon(master.serve_slave, a, "fake")
            # two reports and a partial third in one read: the last complete word counts,
            # also as slaveRequestOffset (like Java, which only looks at the newest word)
            await b.send_all(encode_report(10) + encode_report(20) + encode_report(30)[:2])
            await trio.sleep(0.5)
            conn = master.connections[0]
            assert master.watermark.value == 20
            assert (conn.request_offset, conn.ack_offset) == (20, 20)
            await b.send_all(encode_report(30)[2:])  # completes the word started above
            await trio.sleep(0.5)
            assert conn.ack_offset == 30 and master.watermark.value == 30
            assert end > 30
            n.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def parked_over_a_socket(
    store: DefaultMessageStore, master: HAMaster, report: int
) -> AsyncIterator[tuple[SlaveConnection, FakeSlave, socket.socket]]:
    """``master`` serving a FakeSlave over a real socket pair, the slave having reported
    ``report``, its writer parked; yields (connection, slave, the master's stdlib socket)."""
    ours, theirs = socket.socketpair()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    slave = FakeSlave(trio.SocketStream(trio.socket.from_stdlib_socket(theirs)))
    async with trio.open_nursery() as n:
        n.start_soon(master.serve_slave, stream, "fake")
        await slave.report(report)
        with trio.fail_after(10):
            while not (master.connections and master.connections[0].parked):  # noqa: ASYNC110
                await trio.sleep(0.01)
        try:
            yield master.connections[0], slave, ours
        finally:
            await slave.stream.aclose()
            n.cancel_scope.cancel()


async def test_inline_transfer_leaves_without_waking_the_writer(open_store, mk, commit_log_bytes):
    """A parked writer's connection gets new bytes from the put itself (notify_data writes them
    to the socket), and inside a flush batch the batch's puts leave as one write at its end."""
    async with open_store(mapped_file_size_commit_log=1 << 20) as store:
        await fill(store, mk, 3)
        master = master_for(store)
        store.add_arrival_listener(master.notify_data)
        end = store.get_max_phy_offset()
        async with parked_over_a_socket(store, master, end) as (conn, slave, _):
            pos = store.get_max_phy_offset()
            await fill(store, mk, 1)
            assert conn.parked  # the writer never ran: the put sent the transfer itself
            _, t = await slave.next_frame(10)
            assert (t.offset, bytes(t.body)) == (pos, commit_log_bytes(store, pos))
            # three puts inside one flush batch (a channel's chunk): one transfer, at its end
            pos = store.get_max_phy_offset()
            with flush_batch():
                for i in range(3):
                    assert store.append_message(mk(qid=i, body=b"y" * 100)).ok
                assert conn.next_transfer == pos  # nothing left before the batch ended
            assert conn.parked and conn.next_transfer == store.get_max_phy_offset()
            _, t = await slave.next_frame(10)
            assert (t.offset, bytes(t.body)) == (pos, commit_log_bytes(store, pos))


async def test_inline_transfer_tail_the_kernel_refuses_goes_first(open_store, mk, commit_log_bytes):
    """What an inline write cannot hand to the kernel is sent by the writer before anything
    newer: the slave sees one unbroken stream of transfers, in order."""
    async with open_store(mapped_file_size_commit_log=1 << 20) as store:
        master = master_for(store)
        store.add_arrival_listener(master.notify_data)
        async with parked_over_a_socket(store, master, 0) as (conn, slave, ours):
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            # the slave does not read yet: the kernel takes a part, the rest is the tail
            assert store.append_message(mk(body=b"a" * 150_000)).ok
            assert conn.unsent
            for i in range(5):  # newer bytes while the tail waits: the writer sends them after
                assert store.append_message(mk(qid=i % 4, body=bytes([i]) * 20_000)).ok
            got = bytearray()
            with trio.fail_after(20):
                while len(got) < store.get_max_phy_offset():
                    _, t = await slave.next_frame(20)
                    assert t.offset == len(got)
                    got += t.body
            assert bytes(got) == commit_log_bytes(store, 0)
            assert not conn.unsent


async def test_inline_transfer_crosses_a_file_boundary(open_store, mk, commit_log_bytes):
    """A put that starts a new CommitLog file: the inline transfer sends the end of the old
    file (its BLANK filler) and the new file's bytes, without waiting for the writer's poll."""
    async with open_store(mapped_file_size_commit_log=SEG) as store:
        await fill(store, mk, 2, size=1500)
        master = master_for(store)
        store.add_arrival_listener(master.notify_data)
        end = store.get_max_phy_offset()
        async with parked_over_a_socket(store, master, end) as (conn, slave, _):
            pos = store.get_max_phy_offset()
            with flush_batch():
                for _ in range(2):  # the second does not fit the first file
                    assert store.append_message(mk(body=b"z" * 1500)).ok
            end = store.get_max_phy_offset()
            assert end > SEG > pos
            assert conn.parked and conn.next_transfer == end
            got = bytearray()
            with trio.fail_after(10):
                while pos + len(got) < end:
                    _, t = await slave.next_frame(10)
                    assert t.offset == pos + len(got)
                    got += t.body
            assert bytes(got) == commit_log_bytes(store, pos)
