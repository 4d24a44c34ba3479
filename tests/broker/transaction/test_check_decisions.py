"""The check's decisions (broker/transaction/check.py), with fake clocks: which half records are
checked, skipped, requeued or discarded, and when an end still ends something."""

from __future__ import annotations

from broker.transaction.check import (
    CheckConfig,
    HalfAction,
    TransactionLedger,
    decide_half,
    immunity_ms,
    transaction_key,
)

CFG = CheckConfig(transaction_timeout_ms=6000, transaction_check_max=15, file_reserved_hours=72)
NOW = 1_700_000_000_000


def decide(props=None, *, age_ms=10_000, stored_ago_ms=10_000, ended=False, round_ago_ms=0):
    return decide_half(
        props or {},
        NOW - age_ms,
        NOW - stored_ago_ms,
        ended=ended,
        now_ms=NOW,
        round_start_ms=NOW - round_ago_ms,
        config=CFG,
    )


def test_a_record_older_than_the_timeout_is_checked() -> None:
    assert decide(age_ms=6001) is HalfAction.CHECK
    assert decide(age_ms=5999) is HalfAction.WAIT
    assert decide(age_ms=0) is HalfAction.WAIT


def test_an_ended_record_is_done_whatever_its_age_or_count() -> None:
    assert decide(ended=True, age_ms=1) is HalfAction.DONE
    assert decide({"TRANSACTION_CHECK_TIMES": "99"}, ended=True) is HalfAction.DONE


def test_check_max_discards_after_that_many_checks() -> None:
    assert decide({"TRANSACTION_CHECK_TIMES": "14"}) is HalfAction.CHECK
    assert decide({"TRANSACTION_CHECK_TIMES": "15"}) is HalfAction.DISCARD
    assert decide({"TRANSACTION_CHECK_TIMES": "junk"}) is HalfAction.CHECK


def test_older_than_the_files_are_kept_is_discarded() -> None:
    assert decide(age_ms=72 * 3600 * 1000 + 1) is HalfAction.DISCARD


def test_stored_after_the_round_began_stops_the_round() -> None:
    assert decide(stored_ago_ms=0, round_ago_ms=0) is HalfAction.WAIT
    assert decide(stored_ago_ms=5, round_ago_ms=10) is HalfAction.WAIT


def test_immunity_requeues_until_it_passed_then_checks() -> None:
    props = {"CHECK_IMMUNITY_TIME_IN_SECONDS": "30"}
    assert decide(props, age_ms=29_000) is HalfAction.REQUEUE
    assert decide(props, age_ms=30_001) is HalfAction.CHECK
    assert immunity_ms({"CHECK_IMMUNITY_TIME_IN_SECONDS": "-1"}, 6000) == 6000
    assert immunity_ms({"CHECK_IMMUNITY_TIME_IN_SECONDS": "x"}, 6000) == 6000
    assert immunity_ms({}, 6000) is None


def test_born_in_the_future_is_checked() -> None:
    # the producer's clock is ahead of the broker's: RocketMQ checks at once
    assert decide(age_ms=-5000) is HalfAction.CHECK


def test_key_is_the_uniq_key_else_the_first_copy() -> None:
    assert transaction_key({"UNIQ_KEY": "U"}, 7) == "U"
    assert transaction_key({}, 7) == "@7"
    assert transaction_key({"TRAN_PREPARED_QUEUE_OFFSET": "3"}, 7) == "@3"


def test_ledger_an_op_ends_every_copy_of_the_key() -> None:
    led = TransactionLedger.starting_at(0, 0)
    led.add_half(0, "A")
    led.add_half(1, "B")
    led.add_half(2, "A")  # a re-put copy of A
    assert not led.is_ended("A", 0) and not led.is_ended("A", 2)
    led.add_op(0, 2, None)  # the producer ended the copy it was asked about
    assert led.is_ended("A", 0) and led.is_ended("A", 2)
    assert not led.is_ended("B", 1)


def test_ledger_below_the_cursor_with_no_live_copy_is_ended() -> None:
    led = TransactionLedger.starting_at(0, 0)
    led.add_half(0, "A")
    led.add_half(1, "B")
    led.add_half(2, "B")  # B was re-put when checked
    led.advance(2)
    assert led.is_ended("A", 0)  # handled (ended or discarded) and nothing left of it
    assert not led.is_ended("B", 1)  # a late answer to the first copy still ends B
    led.mark_ended(1, "B")
    assert led.is_ended("B", 2)
    assert led.window == 1


def test_ledger_copy_put_by_the_check_is_live_before_it_is_read() -> None:
    led = TransactionLedger.starting_at(0, 0)
    led.add_half(0, "A")
    led.add_half(5, "A")  # just re-put at 5; 1..4 not read yet
    assert led.half_read == 1  # the reading cursor does not jump over 1..4
    led.advance(1)
    assert not led.is_ended("A", 0)


def test_ledger_op_cursor_waits_for_the_half_cursor() -> None:
    led = TransactionLedger.starting_at(0, 0)
    for off, key in enumerate("ABC"):
        led.add_half(off, key)
    led.add_op(0, 2, None)  # C ended first
    led.add_op(1, 0, None)
    led.advance(1)
    assert led.op_progress == 0  # the op for C (half 2) is still needed
    led.advance(3)
    assert led.op_progress == 2 and led.window == 0
    led.add_op(1, 0, None)  # read again: ignored
    assert led.op_read == 2
