"""A master and a slave in one process over memory streams: the slave catches up byte-identical."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from broker.ha.protocol import encode_report
from broker.ha.service import HAService
from broker.store import PutMessageStatus

SEG = 4096


class ChoppyStream(trio.abc.Stream):
    """Delivers what the peer sent in random small pieces (any split of the byte stream)."""

    def __init__(self, inner, rng):
        self.inner = inner
        self.rng = rng
        self.pending = b""

    async def send_all(self, data):
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self):
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None):
        if not self.pending:
            self.pending = await self.inner.receive_some(65536)
            if not self.pending:
                return b""
        n = self.rng.randint(1, 40)
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    async def aclose(self):
        await self.inner.aclose()


def pair(master_svc, nursery, rng=None):
    """A connect() for the slave that serves the master end in ``nursery``."""

    async def connect(addr):
        a, b = trio.testing.memory_stream_pair()
        nursery.start_soon(master_svc.master.serve_slave, a, "slave-1")
        return ChoppyStream(b, rng) if rng else b

    return connect


async def put_many(store, mk, n, size=300):
    ends = []
    for i in range(n):
        r = await store.put_message(mk(topic=f"T{i % 3}", qid=i % 4, body=bytes([i % 256]) * size))
        assert r.ok
        ends.append(r.append.wrote_offset + r.append.wrote_bytes)
    return ends


async def wait_caught_up(slave, master, timeout=60):
    with trio.fail_after(timeout):
        while slave.get_max_phy_offset() < master.get_max_phy_offset():  # noqa: ASYNC110
            await trio.sleep(0.05)


@pytest.mark.parametrize("choppy", [False, True])
async def test_slave_catches_up_byte_identical_from_scratch(
    open_store, mk, commit_log_bytes, choppy, autojump_clock
):
    async with (
        open_store("m", mapped_file_size_commit_log=SEG, ha_transfer_batch_size=1500) as m,
        open_store("s", mapped_file_size_commit_log=SEG, broker_role="SLAVE") as s,
    ):
        # the master holds several files before the slave ever connects; a slave that reports
        # 0 starts at the master's last file, so give it the earlier ones the way an operator
        # would (copy the old files), then let HA do the rest
        await put_many(m, mk, 60)
        msvc = HAService(m, m.config)
        m.add_arrival_listener(msvc.master.notify_data)
        first_files = commit_log_bytes(m)[: 2 * SEG]
        assert s.append_to_commit_log(0, first_files[:SEG])
        assert s.append_to_commit_log(SEG, first_files[SEG:])
        async with trio.open_nursery() as n:
            ssvc = HAService(
                s,
                s.config,
                is_slave=True,
                connect=pair(msvc, n, random.Random(7) if choppy else None),
            )
            ssvc.update_master_address("127.0.0.1:1")
            assert ssvc.client is not None
            await n.start(ssvc.client.run)
            await wait_caught_up(s, m)
            # live traffic while connected
            await put_many(m, mk, 40)
            await wait_caught_up(s, m)
            await s.wait_dispatched()
            assert commit_log_bytes(s) == commit_log_bytes(m)
            for t in ("T0", "T1", "T2"):
                for q in range(4):
                    assert s.get_max_offset_in_queue(t, q) == m.get_max_offset_in_queue(t, q)
                    mr = m.get_message("g", t, q, 0, 100)
                    sr = s.get_message("g", t, q, 0, 100)
                    assert [bytes(b) for b in sr.buffers] == [bytes(b) for b in mr.buffers]
            info = msvc.slaves()
            assert len(info) == 1 and info[0].lag_bytes == 0
            assert msvc.push2slave_max_offset == m.get_max_phy_offset()
            n.cancel_scope.cancel()


async def test_empty_slave_starts_at_masters_last_file(
    open_store, mk, commit_log_bytes, autojump_clock
):
    async with (
        open_store("m", mapped_file_size_commit_log=SEG) as m,
        open_store("s", mapped_file_size_commit_log=SEG, broker_role="SLAVE") as s,
    ):
        await put_many(m, mk, 50)
        msvc = HAService(m, m.config)
        async with trio.open_nursery() as n:
            ssvc = HAService(s, s.config, is_slave=True, connect=pair(msvc, n))
            ssvc.update_master_address("127.0.0.1:1")
            assert ssvc.client is not None
            await n.start(ssvc.client.run)
            await wait_caught_up(s, m)
            n.cancel_scope.cancel()
        last = m.get_max_phy_offset() - m.get_max_phy_offset() % SEG
        assert s.get_min_phy_offset() == last
        assert commit_log_bytes(s) == commit_log_bytes(m, last)


async def test_sync_master_waits_released_by_slave_acks(open_store, mk, autojump_clock):
    async with (
        open_store("m", broker_role="SYNC_MASTER") as m,
        open_store("s", broker_role="SLAVE") as s,
    ):
        msvc = HAService(m, m.config)
        # no slave yet: SLAVE_NOT_AVAILABLE at once, the message is stored anyway
        (end,) = await put_many(m, mk, 1)
        assert await msvc.wait_for_replica(end) is PutMessageStatus.SLAVE_NOT_AVAILABLE
        assert trio.current_time() == 0
        async with trio.open_nursery() as n:
            ssvc = HAService(s, s.config, is_slave=True, connect=pair(msvc, n))
            ssvc.update_master_address("127.0.0.1:1")
            client_scope = trio.CancelScope()

            async def run_client(task_status=trio.TASK_STATUS_IGNORED):
                with client_scope:
                    assert ssvc.client is not None
                    await ssvc.client.run(task_status=task_status)

            await n.start(run_client)
            await trio.sleep(0.1)
            results = []

            async def send_and_wait(i):
                (e,) = await put_many(m, mk, 1)
                results.append(await msvc.wait_for_replica(e))

            t0 = trio.current_time()
            async with trio.open_nursery() as senders:
                for i in range(50):
                    senders.start_soon(send_and_wait, i)
            assert results == [PutMessageStatus.PUT_OK] * 50
            # released by acks, not by polling
            assert trio.current_time() - t0 < 0.05
            assert s.get_max_phy_offset() == m.get_max_phy_offset()
            # the slave goes away: SLAVE_NOT_AVAILABLE at once once the master noticed
            client_scope.cancel()
            with trio.fail_after(1):
                while msvc.watermark.connections:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            (e,) = await put_many(m, mk, 1)
            t0 = trio.current_time()
            assert await msvc.wait_for_replica(e) is PutMessageStatus.SLAVE_NOT_AVAILABLE
            assert trio.current_time() == t0
            n.cancel_scope.cancel()


async def test_paused_slave_gives_flush_slave_timeout_after_3s(open_store, mk, autojump_clock):
    async with open_store("m", broker_role="SYNC_MASTER") as m:
        msvc = HAService(m, m.config)
        (end0,) = await put_many(m, mk, 1)
        a, b = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as n:
            n.start_soon(msvc.master.serve_slave, a, "paused")
            await b.send_all(encode_report(end0))  # caught up, then never reads nor reports
            await trio.sleep(0.1)
            assert msvc.is_slave_ok()
            (e,) = await put_many(m, mk, 1)
            t0 = trio.current_time()
            assert await msvc.wait_for_replica(e) is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
            assert trio.current_time() - t0 == pytest.approx(3.0)
            # stored on the master in every case
            assert m.get_max_phy_offset() == e
            # a late ack still moves the watermark for the next sends
            await b.send_all(encode_report(e))
            await trio.sleep(0.1)
            assert msvc.push2slave_max_offset == e
            assert await msvc.wait_for_replica(e) is PutMessageStatus.PUT_OK
            n.cancel_scope.cancel()
