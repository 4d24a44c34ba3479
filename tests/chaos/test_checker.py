"""The chaos checker on hand-made histories: it finds each kind of broken promise."""

from __future__ import annotations

import pytest

from cli.chaos.checker import Fault, Outcome, Send, Served, check

A, F, U = Outcome.ACKED, Outcome.FAILED, Outcome.UNKNOWN


def sends(*rows: tuple[int, int, int, Outcome]) -> list[Send]:
    return [Send(i, q, seq, seq * 1.0, seq * 1.0 + 0.1, o) for i, q, seq, o in rows]


def test_a_clean_history_passes():
    history = sends((0, 0, 0, A), (4, 0, 1, A), (1, 1, 0, A))
    served = [Served(0, 0, 0), Served(0, 1, 4), Served(1, 0, 1)]
    report = check(7, "sync", history, [], served)
    assert report.ok and report.acked == 3 and not report.duplicates


def test_lost_duplicated_out_of_order_and_unacknowledged_are_reported():
    history = sends((0, 0, 0, A), (4, 0, 1, A), (8, 0, 2, A), (12, 0, 3, U), (16, 0, 4, F))
    served = [Served(0, 0, 8), Served(0, 1, 0), Served(0, 2, 0), Served(0, 3, 12)]
    faults = [Fault("kill", "master", 0.5, 1.5)]
    report = check(42, "sync", history, faults, served)
    assert not report.ok
    assert report.lost == (4,)  # (and 16 failed: not promised)
    assert report.duplicates == (0,)
    assert report.order_violations == ((0, 8, 0),)
    assert report.unacked_delivered == 1  # id 12, timed out but stored
    ((what, seconds),) = report.recovery
    assert what == "kill master" and seconds == pytest.approx(0.6)
    text = report.summary()
    assert "seed 42" in text and "LOST: id 4" in text and "fault kill master" in text


def test_no_acknowledgement_after_a_fault_is_never_recovered():
    history = sends((0, 0, 0, A), (4, 0, 1, F))
    report = check(1, "dledger", history, [Fault("pause", "n0", 0.2, 0.9)], [Served(0, 0, 0)])
    assert report.recovery == (("pause n0", None),)
    assert "pause n0 never" in report.summary()


def test_a_message_in_the_wrong_queue_is_lost_and_unacknowledged_sends_keep_no_order():
    history = sends((0, 0, 0, A), (4, 0, 1, U), (8, 0, 2, A))
    # 8 before 4: allowed, 4 timed out; 0 served in queue 1: lost for queue 0
    served = [Served(1, 0, 0), Served(0, 0, 8), Served(0, 1, 4)]
    report = check(3, "sync", history, [], served)
    assert report.lost == (0,) and not report.order_violations
    assert report.unacked_delivered == 1


def test_a_duplicate_fails_the_run():
    report = check(5, "sync", sends((0, 0, 0, A)), [], [Served(0, 0, 0), Served(0, 1, 0)])
    assert report.duplicates == (0,) and not report.ok
