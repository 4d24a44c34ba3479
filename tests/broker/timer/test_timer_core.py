"""The sans-I/O timer core: due-time rounding, the send-side verdicts, the wheel's slots and rolls."""

from __future__ import annotations

import random

from broker.timer.checkpoint import TimerCheckpoint, from_ranges, to_ranges
from broker.timer.transform import (
    TimerSettings,
    TimerVerdict,
    fire_ms,
    illegal_remark,
    out_ms,
    transform_timer_message,
)
from broker.timer.wheel import FarAction, TimerEntry, TimerWheel, far_action, is_near
from common import serde
from common.topics import TIMER_TOPIC

NOW = 1_700_000_000_000  # a whole second
S = TimerSettings()


def test_out_ms_rounds_like_rocketmq_and_fires_never_early() -> None:
    assert out_ms(NOW + 1500, 1000) == NOW + 1000
    assert out_ms(NOW + 2000, 1000) == NOW + 1000  # an exact multiple goes one slot down
    for asked in (NOW + 1, NOW + 999, NOW + 1000, NOW + 1001, NOW + 59_999):
        fire = fire_ms(out_ms(asked, 1000), 1000)
        assert asked <= fire < asked + 1000


def test_deliver_ms_becomes_a_timer_record() -> None:
    props = {"TIMER_DELIVER_MS": str(NOW + 10_500)}
    assert transform_timer_message("T", 3, props, NOW, S) is TimerVerdict.TIMER
    assert props["TIMER_OUT_MS"] == str(NOW + 10_000)
    assert props["REAL_TOPIC"] == "T" and props["REAL_QID"] == "3"


def test_delay_sec_and_delay_ms_count_from_now() -> None:
    p1 = {"TIMER_DELAY_SEC": "5"}
    assert transform_timer_message("T", 0, p1, NOW, S) is TimerVerdict.TIMER
    assert p1["TIMER_OUT_MS"] == str(NOW + 4000)  # fires at NOW + 5000
    p2 = {"TIMER_DELAY_MS": "2500"}
    assert transform_timer_message("T", 0, p2, NOW, S) is TimerVerdict.TIMER
    assert p2["TIMER_OUT_MS"] == str(NOW + 2000)


def test_past_time_is_stored_under_its_topic() -> None:
    props = {"TIMER_DELIVER_MS": str(NOW - 5)}
    assert transform_timer_message("T", 0, props, NOW, S) is TimerVerdict.NOT_TIMER
    assert "REAL_TOPIC" not in props


def test_too_far_or_garbage_is_illegal_and_disabled_is_refused() -> None:
    far = {"TIMER_DELIVER_MS": str(NOW + S.max_delay_sec * 1000 + 1)}
    assert transform_timer_message("T", 0, far, NOW, S) is TimerVerdict.ILLEGAL
    edge = {"TIMER_DELIVER_MS": str(NOW + S.max_delay_sec * 1000)}
    assert transform_timer_message("T", 0, edge, NOW, S) is TimerVerdict.TIMER
    assert transform_timer_message("T", 0, {"TIMER_DELAY_SEC": "x"}, NOW, S) is TimerVerdict.ILLEGAL
    off = TimerSettings(enable=False)
    assert transform_timer_message("T", 0, {"TIMER_DELAY_SEC": "1"}, NOW, off) is (
        TimerVerdict.NOT_ENABLED
    )
    assert "259200000ms" in illegal_remark(S)


def test_delay_level_wins_and_records_are_not_transformed_twice() -> None:
    props = {"DELAY": "3", "TIMER_DELAY_SEC": "5"}
    assert transform_timer_message("T", 0, props, NOW, S) is TimerVerdict.NOT_TIMER
    assert props == {"DELAY": "3"}
    again = {"TIMER_DELAY_SEC": "5", "TIMER_OUT_MS": str(NOW)}
    assert transform_timer_message("T", 0, again, NOW, S) is TimerVerdict.NOT_TIMER
    assert transform_timer_message(TIMER_TOPIC, 0, {"TIMER_DELAY_SEC": "5"}, NOW, S) is (
        TimerVerdict.NOT_TIMER
    )


def test_wheel_pops_in_time_order() -> None:
    w = TimerWheel()
    rng = random.Random(7)
    fires = [NOW + 1000 * rng.randrange(1, 200) for _ in range(300)]
    for i, f in enumerate(fires):
        w.add(TimerEntry(phys_offset=i, size=1, queue_offset=i, fire_ms=f))
    assert w.size == 300
    got = w.pop_due(NOW + 60_000)
    assert [e.fire_ms for e in got] == sorted(f for f in fires if f <= NOW + 60_000)
    # same slot: the order added (timer-queue order)
    for a, b in zip(got, got[1:], strict=False):
        if a.fire_ms == b.fire_ms:
            assert a.queue_offset < b.queue_offset
    rest = w.pop_due(NOW + 10**9)
    assert len(got) + len(rest) == 300
    assert w.size == 0 and w.next_fire_ms() is None


def test_wheel_fires_a_slot_at_its_time_only() -> None:
    w = TimerWheel()
    w.add(TimerEntry(1, 1, 1, NOW + 5000))
    w.add(TimerEntry(2, 1, 2, NOW + 3000))
    assert w.next_fire_ms() == NOW + 3000
    assert w.pop_due(NOW + 2999) == []
    assert [e.queue_offset for e in w.pop_due(NOW + 3000)] == [2]
    assert [e.queue_offset for e in w.pop_due(NOW + 10_000)] == [1]


def test_roll_window_near_far_and_roll() -> None:
    window = 60_000
    stored = NOW
    assert is_near(NOW + 60_000, stored, window)
    assert not is_near(NOW + 60_001, stored, window)
    far = NOW + 150_000  # 2.5 windows after it was stored
    assert far_action(far, stored, NOW + 59_999, window) is FarAction.WAIT
    assert far_action(far, stored, NOW + 60_000, window) is FarAction.ROLL
    # rolled at +60 s: its new store time; looked at again at +120 s: within the window now
    assert far_action(far, NOW + 60_000, NOW + 119_000, window) is FarAction.WAIT
    assert far_action(far, NOW + 60_000, NOW + 120_000, window) is FarAction.WHEEL
    # overdue (a master that was down): into the wheel, fires at once
    assert far_action(far, stored, NOW + 10**7, window) is FarAction.WHEEL


def test_checkpoint_round_trip_in_ranges() -> None:
    assert to_ranges({1, 2, 3, 7, 9, 10}) == [[1, 3], [7, 7], [9, 10]]
    assert from_ranges([[1, 3], [7, 7]]) == {1, 2, 3, 7}
    cp = TimerCheckpoint(live=lambda: (5, 1234, {7, 8, 12}))
    cp.freeze()
    assert cp.live is None
    back = TimerCheckpoint()
    back._load_obj(serde.loads(cp.encode()))
    assert (back.commit_offset, back.scan_from_phy, back.done) == (5, 1234, {7, 8, 12})
