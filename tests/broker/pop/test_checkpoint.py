"""The in-flight table and its records, sans-I/O: handles round trip, and invariant I2 (a replay
of each revive queue from its safe offset rebuilds exactly the undone checkpoints)."""

from __future__ import annotations

import random

import pytest

from broker.pop.checkpoint import (
    ACK_TAG,
    CK_TAG,
    AckRecord,
    Checkpoint,
    CheckpointTable,
    decode_record_body,
)
from broker.pop.receipt import BadReceiptHandle, ReceiptHandle


def test_receipt_handle_forms() -> None:
    h = ReceiptHandle(5, 1_700_000_000_000, 30_000, 3, True, "broker-a", 2, 7, 4096)
    assert h.encode() == "5 1700000000000 30000 3 1 broker-a 2 7 4096"
    assert h.extra_info() == "5 1700000000000 30000 3 1 broker-a 2 7"
    assert ReceiptHandle.parse(h.encode()) == h
    assert ReceiptHandle.parse(h.extra_info()).commit_log_offset == -1
    assert ReceiptHandle.parse("5 1700000000000 30000 3 1 broker-a 2", offset=7).offset == 7
    assert h.real_topic("T", "G") == "%RETRY%G_T"
    assert h.real_topic("%RETRY%G_T", "G") == "%RETRY%G_T"
    assert h.next_visible_time == 1_700_000_030_000
    for bad in (
        "",
        "x",
        "1 2 3 4 0 b 0",
        "1 2 3 4 2 b 0 0",
        "-1 2 3 4 0 b 0 0",
        "1 2 3 4 0 b 0 0 0 0",
    ):
        with pytest.raises(BadReceiptHandle):
            ReceiptHandle.parse(bad)


def test_records_round_trip() -> None:
    ck = Checkpoint("G", "T", 1, 10, 99, 500, 2, [10, 12, 15], "b", acked={12}, order=True)
    back = decode_record_body(CK_TAG, ck.to_json(), 2)
    assert isinstance(back, Checkpoint)
    assert (back.key, back.offsets, back.acked, back.order) == (ck.key, ck.offsets, {12}, True)
    ack = AckRecord("G", "T", 1, 10, 99, 15, "b")
    assert decode_record_body(ACK_TAG, ack.to_json(), 2) == ack
    assert decode_record_body(CK_TAG, b"{not json", 0) is None
    assert decode_record_body("other", b"{}", 0) is None


@pytest.mark.parametrize("seed", range(30))
def test_replay_from_the_safe_offsets_rebuilds_the_table(seed: int) -> None:
    rng = random.Random(seed)
    queues = 3
    log: list[list[tuple[str, bytes]]] = [[] for _ in range(queues)]
    table = CheckpointTable()
    now = 0
    revived: set[object] = set()
    for _ in range(rng.randrange(20, 120)):
        now += rng.randrange(0, 50)
        op = rng.random()
        if op < 0.4:
            rq = rng.randrange(queues)
            start = rng.randrange(0, 1000)
            offsets = sorted(rng.sample(range(start, start + 40), rng.randrange(1, 5)))
            ck = Checkpoint("G", "T", rng.randrange(2), offsets[0], now, 100, rq, offsets, "b")
            ck.order = rng.random() < 0.2
            if ck.key in {c.key for c in table}:
                continue
            table.add(ck)
            ck.revive_offset = len(log[rq])
            log[rq].append((CK_TAG, ck.to_json()))
        elif op < 0.8:
            live = [(c, o) for c in table for o in c.unacked()]
            if live:
                c, o = rng.choice(live)
                hits = table.ack_order(c.group, c.topic, c.queue_id, o) if c.order else []
                if not c.order and table.ack(c.key, o):
                    hits = [c]
                for h in hits:
                    rec = AckRecord(
                        h.group, h.topic, h.queue_id, h.start_offset, h.pop_time, o, "b"
                    )
                    log[h.revive_qid].append((ACK_TAG, rec.to_json()))
        else:
            for ck in table.pop_due(now):
                assert not ck.order  # FIFO checkpoints are never revived
                revived.add(ck.key)
    safe = table.safe_revive_offsets({q: len(log[q]) for q in range(queues)})
    rebuilt = CheckpointTable()
    for q in range(queues):
        for i in range(safe[q], len(log[q])):
            tag, body = log[q][i]
            got_rec = decode_record_body(tag, body, q)
            if isinstance(got_rec, Checkpoint):
                got_rec.revive_offset = i
                rebuilt.add(got_rec)
            elif isinstance(got_rec, AckRecord):
                rebuilt.ack(got_rec.key, got_rec.ack_offset)

    def state(t: CheckpointTable) -> dict[object, list[int]]:
        return {c.key: c.unacked() for c in t}

    # every undone CK comes back as it was; a CK revived since the last commit comes back too
    # (nothing logs a revive: its messages are delivered again, at least once, never lost)
    got, want = state(rebuilt), state(table)
    assert {k: v for k, v in got.items() if k in want} == want
    assert set(got) - set(want) <= revived


def test_replay_takes_a_fifo_ck_written_again_as_its_new_invisible_time() -> None:
    """I5: the second record of a FIFO CK changes its invisible time only; its acks and its
    revive offset (I2) stay those of the first record and the ack records."""
    t = CheckpointTable()
    first = Checkpoint("G", "T", 0, 4, 1000, 10_000, 1, [4, 5], "b", order=True)
    first.revive_offset = 3
    t.replay(first)
    assert t.ack(first.key, 4)
    again = decode_record_body(
        CK_TAG,
        Checkpoint("G", "T", 0, 4, 1000, 70_000, 1, [4, 5], "b", order=True).to_json(),
        1,
    )
    assert isinstance(again, Checkpoint)
    again.revive_offset = 9
    t.replay(again)
    (held,) = t.order_checkpoints()
    assert (held.invisible_time, held.acked, held.revive_offset) == (70_000, {4}, 3)
    assert t.safe_revive_offsets({1: 20}) == {1: 3}
    # a plain CK of the same key is no change of anything (duplicates are ignored)
    plain = Checkpoint("G", "T", 1, 4, 1000, 10_000, 1, [4], "b")
    t.replay(plain)
    t.replay(Checkpoint("G", "T", 1, 4, 1000, 99_000, 1, [4], "b"))
    assert t.get(plain.key) is plain and plain.invisible_time == 10_000
    assert t.change_order_invisible(plain.key, 5) is None
