"""One conformance suite for every MessageStore implementation (memory and file).

Expected values come from RocketMQ's store rules (``store/DefaultMessageStore.java``,
``CommitLog.java``, ``ConsumeQueue.java`` in 4.9), written out by hand here, so both
implementations are held to the same answers.
"""

from __future__ import annotations

import struct

import pytest

from broker.store import GetMessageStatus, PutMessageStatus
from broker.store import PutMessageResult as PutResult
from common.message import (
    BLANK_MAGIC_CODE,
    MessageExtBrokerInner,
    MessageSysFlag,
    decode_record,
    decode_records,
    tags_code,
)
from common.message_id import decode_offset_msg_id
from common.message_properties import MessageConst

STORE_HOST = ("127.0.0.1", 10911)


def mk(topic="T", qid=0, body=b"x", **props):
    return MessageExtBrokerInner(
        topic=topic,
        queue_id=qid,
        body=body,
        properties={k: str(v) for k, v in props.items()},
        born_timestamp=1,
        born_host=("10.0.0.1", 1234),
        store_host=STORE_HOST,
    )


def bodies(result):
    return [decode_record(b).body for b in result.buffers]


class FakeClock:
    def __init__(self, start=1_700_000_000_000):
        self.now = start

    def __call__(self):
        return self.now


async def test_put_get_order_and_offsets(open_store):
    async with open_store() as store:
        results = []
        for i in range(10):
            results.append(await store.put_message(mk(qid=0, body=b"a%d" % i)))
        for i in range(5):
            await store.put_message(mk(qid=1, body=b"b%d" % i))
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        assert [r.append.logics_offset for r in results] == list(range(10))
        phys = [r.append.wrote_offset for r in results]
        assert phys[0] == 0
        for a, b, r in zip(phys, phys[1:], results, strict=False):
            assert b == a + r.append.wrote_bytes
        for r in results:
            host, off = decode_offset_msg_id(r.append.msg_id)
            assert host == STORE_HOST and off == r.append.wrote_offset
        got = store.get_message("g", "T", 0, 0, 32)
        assert got.status is GetMessageStatus.FOUND
        assert got.message_count == 10 and got.next_begin_offset == 10
        assert (got.min_offset, got.max_offset) == (0, 10)
        recs = decode_records(b"".join(bytes(b) for b in got.buffers), check_crc=True)
        assert [m.body for m in recs] == [b"a%d" % i for i in range(10)]
        assert [m.queue_offset for m in recs] == list(range(10))
        assert [m.commit_log_offset for m in recs] == phys
        assert got.buffer_total_size == sum(len(b) for b in got.buffers)
        got = store.get_message("g", "T", 1, 2, 2)
        assert bodies(got) == [b"b2", b"b3"] and got.next_begin_offset == 4
        assert store.get_max_offset_in_queue("T", 0) == 10
        assert store.get_min_offset_in_queue("T", 0) == 0
        assert store.get_max_offset_in_queue("T", 7) == 0
        assert store.get_max_offset_in_queue("nope", 0) == 0
        assert store.get_commit_log_offset_in_queue("T", 0, 3) == phys[3]
        assert store.get_max_phy_offset() == phys[-1] + results[-1].append.wrote_bytes + 5 * (
            results[0].append.wrote_bytes
        )
        assert store.get_min_phy_offset() == 0
        assert store.topic_queues() == {"T": [0, 1]}


async def test_get_status_rules(open_store):
    async with open_store() as store:
        r = store.get_message("g", "T", 0, 5, 32)
        assert r.status is GetMessageStatus.NO_MESSAGE_IN_QUEUE
        assert r.next_begin_offset == 0 and (r.min_offset, r.max_offset) == (0, 0)
        for _ in range(3):
            await store.put_message(mk())
        r = store.get_message("g", "T", 0, 3, 32)
        assert r.status is GetMessageStatus.OFFSET_OVERFLOW_ONE and r.next_begin_offset == 3
        assert r.buffers == []
        r = store.get_message("g", "T", 0, 9, 32)
        # min offset is 0, so RocketMQ corrects to the min offset
        assert r.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY and r.next_begin_offset == 0
        r = store.get_message("g", "T", 0, 1, 32)
        assert r.status is GetMessageStatus.FOUND and r.message_count == 2


async def test_slave_keeps_offsets_and_refuses_puts(open_store):
    async with open_store(broker_role="SLAVE") as store:
        r = await store.put_message(mk())
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        r = store.get_message("g", "T", 0, 5, 32)
        assert r.status is GetMessageStatus.NO_MESSAGE_IN_QUEUE and r.next_begin_offset == 5


async def test_put_rejections(open_store):
    async with open_store(max_message_size=2000) as store:
        r = await store.put_message(mk(topic="T" * 128))
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL
        r = await store.put_message(mk(K="v" * 33000))
        assert r.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
        r = await store.put_message(mk(body=b"z" * 3000))
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert store.get_max_phy_offset() == 0
        assert (await store.put_message(mk(body=b"z" * 1000))).status is PutMessageStatus.PUT_OK


async def test_transfer_limits(open_store):
    async with open_store() as store:
        for i in range(40):
            await store.put_message(mk(body=b"%d" % i))
        r = store.get_message("g", "T", 0, 0, 64)
        assert r.message_count == 32 and r.next_begin_offset == 32  # count in memory
        r = store.get_message("g", "T", 0, 32, 64)
        assert r.message_count == 8 and r.next_begin_offset == 40
        for _ in range(4):
            await store.put_message(mk(qid=1, body=b"y" * 100_000))
        r = store.get_message("g", "T", 1, 0, 32)
        assert r.message_count == 2 and r.next_begin_offset == 2  # 256 KiB in memory
    async with open_store(root=None, max_transfer_bytes_on_message_in_memory=10) as store:
        # the first message is always returned, however big
        await store.put_message(mk(body=b"y" * 100))
        await store.put_message(mk(body=b"y" * 100))
        r = store.get_message("g", "T", 0, 0, 32)
        assert r.message_count == 1 and r.next_begin_offset == 1


async def test_tag_filtering_skips_units(open_store, tags_filter):
    async with open_store() as store:
        tags = ["A", "B", "A", "C", "B", "A"]
        for i, t in enumerate(tags):
            await store.put_message(mk(body=b"%d" % i, TAGS=t))
        await store.put_message(mk(body=b"none"))
        f = tags_filter(tags_code("A"))
        r = store.get_message("g", "T", 0, 0, 32, f)
        assert bodies(r) == [b"0", b"2", b"5"] and r.next_begin_offset == 7
        r = store.get_message("g", "T", 0, 0, 2, f)
        assert bodies(r) == [b"0", b"2"] and r.next_begin_offset == 3
        r = store.get_message("g", "T", 0, 3, 32, tags_filter(tags_code("Z")))
        assert r.status is GetMessageStatus.NO_MATCHED_MESSAGE
        assert r.message_count == 0 and r.next_begin_offset == 7
        r = store.get_message("g", "T", 0, 0, 32, tags_filter(0))
        assert bodies(r) == [b"none"]


async def test_blank_rollover_small_segments(open_store):
    seg = 1024
    async with open_store(mapped_file_size_commit_log=seg) as store:
        res = [await store.put_message(mk(body=bytes([i]) * 200)) for i in range(12)]
        size = res[0].append.wrote_bytes
        assert size + 8 <= seg
        expect = 0
        for r in res:
            if seg - expect % seg < size + 8:
                expect += seg - expect % seg  # BLANK filler fills the rest of the file
            assert r.append.wrote_offset == expect
            assert expect // seg == (expect + size - 1) // seg  # never crosses a file
            expect += size
        got = store.get_message("g", "T", 0, 0, 32)
        assert bodies(got) == [bytes([i]) * 200 for i in range(12)]
        # HA view: a file's bytes end with the BLANK filler
        data = bytes(store.get_commit_log_data(0))
        assert len(data) == seg
        blank_at = 3 * size
        assert struct.unpack_from(">ii", data, blank_at) == (seg - blank_at, BLANK_MAGIC_CODE)
        assert store.get_commit_log_data(res[4].append.wrote_offset + 10) is not None
        assert store.get_commit_log_data(store.get_max_phy_offset()) is None
        # a message that cannot fit any file is refused, not looped on
        r = await store.put_message(mk(body=b"q" * 1100))
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL


async def test_search_by_time_and_earliest(open_store):
    async with open_store() as store:
        clock = FakeClock()
        store.clock = clock
        assert store.get_earliest_message_time("T", 0) == -1
        assert store.get_offset_in_queue_by_time("T", 0, clock.now) == 0
        times = [0, 1000, 1000, 2000, 5000]
        for t in times:
            clock.now = 1_700_000_000_000 + t
            await store.put_message(mk())
        base = 1_700_000_000_000
        assert store.get_earliest_message_time("T", 0) == base
        assert store.get_offset_in_queue_by_time("T", 0, base) == 0
        assert store.get_offset_in_queue_by_time("T", 0, base + 1000) == 1  # first of equals
        assert store.get_offset_in_queue_by_time("T", 0, base + 2000) == 3
        assert store.get_offset_in_queue_by_time("T", 0, base + 2400) == 3  # closest
        assert store.get_offset_in_queue_by_time("T", 0, base + 4000) == 4
        assert store.get_offset_in_queue_by_time("T", 0, base + 3500) == 3  # tie -> earlier
        assert store.get_offset_in_queue_by_time("T", 0, base - 10) == 0
        assert store.get_offset_in_queue_by_time("T", 0, base + 99999) == 4


async def test_query_by_key(open_store):
    async with open_store() as store:
        clock = FakeClock()
        store.clock = clock
        offs = {}
        for i in range(5):
            clock.now += 10_000
            r = await store.put_message(
                mk(body=b"%d" % i, KEYS=f"k{i} common", UNIQ_KEY=f"U{i:04d}")
            )
            offs[i] = r.append.wrote_offset
        await store.put_message(mk(topic="Other", KEYS="common"))
        q = store.query_message("T", "common", 32, 0, 2**62)
        assert [decode_record(b).body for b in q.buffers] == [b"%d" % i for i in range(5)]
        assert q.index_last_update_timestamp == clock.now
        q = store.query_message("T", "common", 2, 0, 2**62)  # newest two, ascending
        assert [decode_record(b).body for b in q.buffers] == [b"3", b"4"]
        q = store.query_message("T", "k3", 32, 0, 2**62)
        assert [decode_record(b).commit_log_offset for b in q.buffers] == [offs[3]]
        q = store.query_message("T", "U0002", 32, 0, 2**62)
        assert [decode_record(b).body for b in q.buffers] == [b"2"]
        t0 = 1_700_000_000_000
        q = store.query_message("T", "common", 32, t0 + 15_000, t0 + 35_000)
        assert [decode_record(b).body for b in q.buffers] == [b"1", b"2"]
        assert store.query_message("T", "missing", 32, 0, 2**62).buffers == []


async def test_batch_put(open_store):
    async with open_store() as store:
        await store.put_message(mk(qid=2))
        batch = [mk(qid=2, body=b"m%d" % i, KEYS=f"bk{i}") for i in range(5)]
        r = await store.put_messages(batch)
        assert r.status is PutMessageStatus.PUT_OK
        assert r.append.logics_offset == 1 and r.append.msg_num == 5
        ids = r.append.msg_id.split(",")
        assert len(ids) == 5
        got = store.get_message("g", "T", 2, 1, 32)
        recs = [decode_record(b) for b in got.buffers]
        assert [m.queue_offset for m in recs] == [1, 2, 3, 4, 5]
        assert [m.msg_id for m in recs] == ids
        assert recs[0].commit_log_offset == r.append.wrote_offset
        assert sum(m.store_size for m in recs) == r.append.wrote_bytes
        assert store.query_message("T", "bk3", 32, 0, 2**62).buffers[0] == got.buffers[3]
        bad = await store.put_messages([mk(qid=2), mk(qid=2, DELAY=2)])
        assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert store.get_max_offset_in_queue("T", 2) == 6


async def test_sync_append_is_final_and_visible_at_once(open_store):
    # ASYNC_FLUSH (default): append_message(s) append and dispatch before returning, no await
    async with open_store() as store:
        arrivals = []
        store.add_arrival_listener(lambda *a: arrivals.append(a))
        r = store.append_message(mk(qid=1, body=b"one", KEYS="k1"))
        assert isinstance(r, PutResult) and r.status is PutMessageStatus.PUT_OK
        assert r.append is not None and r.append.logics_offset == 0
        assert bodies(store.get_message("g", "T", 1, 0, 32)) == [b"one"]
        assert arrivals == [("T", 1, 1, 0)]
        rb = store.append_messages([mk(qid=1, body=b"b%d" % i) for i in range(3)])
        assert isinstance(rb, PutResult) and rb.append is not None and rb.append.msg_num == 3
        assert rb.append.logics_offset == 1
        assert rb.append.wrote_offset == r.append.wrote_offset + r.append.wrote_bytes
        assert bodies(store.get_message("g", "T", 1, 0, 32)) == [b"one", b"b0", b"b1", b"b2"]
        assert store.query_message("T", "k1", 32, 0, 2**62).buffers
        # failures are final results too, and leave no trace
        bad = store.append_messages([mk(qid=1), mk(qid=1, DELAY=2)])
        assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL and bad.append is None
        assert store.get_max_offset_in_queue("T", 1) == 4


async def test_a_write_listener_hears_of_each_put_before_its_dispatch(open_store):
    # the HA master sends a put's bytes to its slaves from here, before the master dispatches
    async with open_store() as store:
        heard: list[tuple[str, int, int]] = []
        store.add_write_listener(
            lambda: heard.append(("write", store.get_max_phy_offset(), store.dispatch_behind_bytes))
        )
        store.add_arrival_listener(lambda *a: heard.append(("arrival", 0, 0)))
        r = store.append_message(mk(qid=1, body=b"one", KEYS="k1"))
        assert r.append is not None
        end = r.append.wrote_offset + r.append.wrote_bytes
        # the bytes are in the CommitLog, not yet in a queue
        assert heard == [("write", end, r.append.wrote_bytes), ("arrival", 0, 0)]
        heard.clear()
        r = store.append_messages([mk(qid=1, body=b"b%d" % i) for i in range(3)])
        assert r.append is not None
        end = r.append.wrote_offset + r.append.wrote_bytes
        assert heard[0] == ("write", end, r.append.wrote_bytes)
        assert [h[0] for h in heard] == ["write", "arrival", "arrival", "arrival"]


async def test_batch_put_rolls_over_as_a_whole(open_store):
    async with open_store(mapped_file_size_commit_log=2048) as store:
        await store.put_message(mk(body=b"a" * 1200))
        r = await store.put_messages([mk(body=b"b" * 300) for _ in range(3)])
        assert r.append.wrote_offset == 2048  # the batch went whole into the next file
        assert store.get_message("g", "T", 0, 0, 32).message_count == 4


async def test_delay_rewrite(open_store):
    async with open_store() as store:
        clock = FakeClock()
        store.clock = clock
        r = await store.put_message(mk(topic="Real", qid=3, body=b"d", DELAY=3, TAGS="t"))
        assert r.status is PutMessageStatus.PUT_OK
        assert store.get_max_offset_in_queue("Real", 3) == 0
        got = store.get_message("g", "SCHEDULE_TOPIC_XXXX", 2, 0, 32)
        (m,) = [decode_record(b) for b in got.buffers]
        assert m.topic == "SCHEDULE_TOPIC_XXXX" and m.queue_id == 2
        assert m.properties[MessageConst.REAL_TOPIC] == "Real"
        assert m.properties[MessageConst.REAL_QID] == "3"
        assert m.properties[MessageConst.DELAY] == "3"
        assert m.body == b"d"

        class All:
            seen = []

            def is_matched_by_consume_queue(self, code):
                self.seen.append(code)
                return True

            def is_matched_by_commit_log(self, record):
                return True

        f = All()
        store.get_message("g", "SCHEDULE_TOPIC_XXXX", 2, 0, 32, f)
        assert f.seen == [clock.now + 10_000]  # tagsCode = deliver time (level 3 = 10s)
        await store.put_message(mk(topic="Real", DELAY=99))
        got = store.get_message("g", "SCHEDULE_TOPIC_XXXX", 17, 0, 32)
        (m,) = [decode_record(b) for b in got.buffers]
        assert m.properties[MessageConst.DELAY] == "18"  # clamped to the max level
        await store.put_message(mk(topic="Real", DELAY=0))
        assert store.get_max_offset_in_queue("Real", 0) == 1


async def test_prepared_transaction_not_in_queue(open_store):
    async with open_store() as store:
        m = mk(KEYS="tx")
        m.sys_flag = MessageSysFlag.TRANSACTION_PREPARED
        r = await store.put_message(m)
        assert r.status is PutMessageStatus.PUT_OK and r.append.logics_offset == 0
        assert store.get_max_offset_in_queue("T", 0) == 0
        rec = store.look_message_by_offset(r.append.wrote_offset)
        assert rec.queue_offset == 0 and rec.sys_flag & MessageSysFlag.TRANSACTION_PREPARED
        assert len(store.query_message("T", "tx", 32, 0, 2**62).buffers) == 1  # indexed
        r2 = await store.put_message(mk())
        assert r2.append.logics_offset == 0  # prepared did not advance the counter
        assert store.get_max_offset_in_queue("T", 0) == 1


async def test_lookup_by_offset(open_store):
    async with open_store() as store:
        r = await store.put_message(mk(body=b"look", TAGS="tg"))
        m = store.look_message_by_offset(r.append.wrote_offset)
        assert m.body == b"look" and m.tags == "tg" and m.msg_id == r.append.msg_id
        raw = store.select_one_message_by_offset(r.append.wrote_offset)
        assert decode_record(raw).body == b"look"
        assert store.look_message_by_offset(10**9) is None
        assert store.select_one_message_by_offset(10**9) is None
        assert store.look_message_by_offset(r.append.wrote_offset + 3) is None


async def test_arrival_listener(open_store):
    async with open_store() as store:
        seen = []
        store.add_arrival_listener(lambda *a: seen.append(a))
        await store.put_message(mk(qid=1, TAGS="A"))
        await store.put_message(mk(qid=1))
        await store.put_messages([mk(qid=2), mk(qid=2)])
        await wait_dispatched(store)
        assert seen == [
            ("T", 1, 1, tags_code("A")),
            ("T", 1, 2, 0),
            ("T", 2, 1, 0),
            ("T", 2, 2, 0),
        ]


async def test_delete_topics_and_runtime_info(open_store):
    async with open_store() as store:
        await store.put_message(mk(topic="A"))
        await store.put_message(mk(topic="B", qid=4))
        assert store.topic_queues() == {"A": [0], "B": [4]}
        store.delete_topics(["A"])
        assert store.topic_queues() == {"B": [4]}
        assert store.get_max_offset_in_queue("A", 0) == 0
        info = store.runtime_info()
        for k in ("commitLogMinOffset", "commitLogMaxOffset", "dispatchBehindBytes", "putTps"):
            assert isinstance(info[k], str)
        assert info["commitLogMaxOffset"] == str(store.get_max_phy_offset())
        assert store.dispatch_behind_bytes == 0


async def wait_dispatched(store):
    # put_* return after their dispatch in every implementation
    assert store.dispatch_behind_bytes == 0
    await store.wait_dispatched()


@pytest.mark.parametrize("chunk", [7, 100, 4096])
async def test_ha_replication_round_trip(open_store, tmp_path, chunk):
    seg = 4096
    async with (
        open_store(root=tmp_path / "m", mapped_file_size_commit_log=seg) as master,
        open_store(
            root=tmp_path / "s", mapped_file_size_commit_log=seg, broker_role="SLAVE"
        ) as slave,
    ):
        for i in range(30):
            await master.put_message(mk(qid=i % 3, body=b"%d" % i * 20, KEYS=f"k{i}", TAGS="A"))
        assert not slave.append_to_commit_log(5, b"xx")  # not at a file start
        off = 0
        while off < master.get_max_phy_offset():
            data = bytes(master.get_commit_log_data(off))[:chunk]
            assert slave.append_to_commit_log(off, data)
            off += len(data)
        assert not slave.append_to_commit_log(off + 1, b"x")  # gap
        await slave.wait_dispatched()
        assert slave.get_max_phy_offset() == master.get_max_phy_offset()
        for q in range(3):
            assert slave.get_max_offset_in_queue("T", q) == master.get_max_offset_in_queue("T", q)
            a = master.get_message("g", "T", q, 0, 32)
            b = slave.get_message("g", "T", q, 0, 32)
            assert [bytes(x) for x in a.buffers] == [bytes(x) for x in b.buffers]
        assert len(slave.query_message("T", "k7", 32, 0, 2**62).buffers) == 1


async def test_replicated_bytes_dispatched_on_the_callers_turn(open_store, tmp_path):
    # a slave's HA reader appends without waking the reput task, acknowledges, then dispatches
    # on its own turn: the units are there with no await in between
    async with (
        open_store(root=tmp_path / "m") as master,
        open_store(root=tmp_path / "s", broker_role="SLAVE") as slave,
    ):
        for i in range(5):
            await master.put_message(mk(qid=1, body=b"%d" % i * 20, KEYS=f"k{i}"))
        data = bytes(master.get_commit_log_data(0))
        assert slave.append_to_commit_log(0, data, wake_reput=False)
        slave.dispatch_appended()
        assert slave.get_max_offset_in_queue("T", 1) == 5
        assert slave.dispatch_behind_bytes == 0
        assert len(slave.query_message("T", "k3", 32, 0, 2**62).buffers) == 1
        await slave.wait_dispatched()  # nothing left for the task either


async def test_ha_slave_starting_mid_log(open_store, tmp_path):
    seg = 2048
    async with (
        open_store(root=tmp_path / "m", mapped_file_size_commit_log=seg) as master,
        open_store(
            root=tmp_path / "s", mapped_file_size_commit_log=seg, broker_role="SLAVE"
        ) as slave,
    ):
        for i in range(20):
            await master.put_message(mk(body=b"%d" % i * 50))
        start = master.get_max_phy_offset() - master.get_max_phy_offset() % seg
        data = master.get_commit_log_data(start)
        assert slave.append_to_commit_log(start, bytes(data))
        await slave.wait_dispatched()
        first_q = decode_record(bytes(data)).queue_offset
        assert first_q > 0
        assert slave.get_min_offset_in_queue("T", 0) == first_q
        assert slave.get_max_offset_in_queue("T", 0) == 20
        r = slave.get_message("g", "T", 0, 0, 32)
        assert r.status is GetMessageStatus.OFFSET_TOO_SMALL
        assert r.next_begin_offset == 0  # a slave keeps the consumer's offset
        r = slave.get_message("g", "T", 0, first_q, 32)
        assert r.status is GetMessageStatus.FOUND and r.message_count == 20 - first_q


async def test_role_switch_at_runtime(open_store):
    async with open_store(broker_role="SLAVE") as store:
        assert (await store.put_message(mk())).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        store.broker_role = "SYNC_MASTER"  # e.g. a DLedger election made this node leader
        assert (await store.put_message(mk())).status is PutMessageStatus.PUT_OK
        r = store.get_message("g", "T", 0, 5, 32)
        assert r.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY and r.next_begin_offset == 0
        store.broker_role = "SLAVE"
        r = store.get_message("g", "T", 0, 5, 32)
        assert r.next_begin_offset == 5


async def test_put_path_and_replicated_bytes_dispatch_alike(open_store, tmp_path):
    # The put path dispatches the messages it has in hand (the file store's fast path when reput
    # is caught up); a slave parses the same records from bytes. Both must apply dispatch.py's
    # rules the same way: units (phys, size, tagsCode), queue ends and index entries.
    async with (
        open_store(root=tmp_path / "m") as master,
        open_store(root=tmp_path / "s", broker_role="SLAVE") as slave,
    ):
        clock = FakeClock()
        master.clock = clock
        batch = [
            mk(qid=i % 2, body=b"b%d" % i, TAGS=f"t{i % 3}", KEYS=f"k{i} kk") for i in range(6)
        ]
        batch[3].properties.pop("TAGS")
        batch[4].properties[MessageConst.UNIQ_KEY] = "U4"
        assert (await master.put_messages(batch)).ok
        assert (await master.put_message(mk(topic="Real", DELAY=2, TAGS="d", KEYS="dk"))).ok
        half = mk(KEYS="prep")
        half.sys_flag = MessageSysFlag.TRANSACTION_PREPARED
        assert (await master.put_message(half)).ok
        gone = mk(KEYS="rolled")
        gone.sys_flag = MessageSysFlag.TRANSACTION_ROLLBACK
        assert (await master.put_message(gone)).ok
        clock.now += 5_000  # a later store time: the slave indexes each record at its own
        late = clock.now
        assert (await master.put_message(mk(qid=1, TAGS="last", KEYS="k9"))).ok

        data = master.get_commit_log_data(0)
        assert slave.append_to_commit_log(0, bytes(data))
        await slave.wait_dispatched()

        queues = master.topic_queues()
        assert queues == {"T": [0, 1], "SCHEDULE_TOPIC_XXXX": [1]}
        assert slave.topic_queues() == queues
        for topic, qids in queues.items():
            for q in qids:
                n = master.get_max_offset_in_queue(topic, q)
                assert slave.get_max_offset_in_queue(topic, q) == n
                units = [master._queue_unit(topic, q, i) for i in range(n)]
                assert [slave._queue_unit(topic, q, i) for i in range(n)] == units
        # tagsCode: the tags' hash (0 without tags), the deliver time in SCHEDULE_TOPIC
        t0 = [master._queue_unit("T", 0, i)[2] for i in range(3)]
        assert t0 == [tags_code("t0"), tags_code("t2"), tags_code("t1")]
        assert master._queue_unit("T", 1, 1)[2] == 0  # batch[3], no TAGS
        # (delay level 2 is 5 s, and it was stored 5 s before `late`)
        assert master._queue_unit("SCHEDULE_TOPIC_XXXX", 1, 0)[2] == late
        for key, found in [("k0", 1), ("kk", 6), ("U4", 1), ("prep", 1), ("rolled", 0)]:
            for store in (master, slave):
                assert len(store.query_message("T", key, 32, 0, 2**62).buffers) == found, key
        assert len(slave.query_message("Real", "dk", 32, 0, 2**62).buffers) == 0
        for store in (master, slave):  # index entries keep their record's store time
            assert len(store.query_message("T", "k9", 32, late, 2**62).buffers) == 1
            assert len(store.query_message("T", "kk", 32, late, 2**62).buffers) == 0
            assert len(store.query_message("T", "kk", 32, 0, late - 1_000).buffers) == 6
        for store in (master, slave):
            assert len(store.query_message("SCHEDULE_TOPIC_XXXX", "dk", 32, 0, 2**62).buffers) == 1
