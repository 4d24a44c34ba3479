"""The chaos harness, short form: 3 seeded fault schedules per mode against real processes.

Each schedule runs 8 s of load from 4 producers while two faults hit the cluster, then checks
the whole history (cli/chaos/checker.py).  SYNC_MASTER and DLedger must lose no acknowledged
message and keep each queue's order; ASYNC_MASTER must keep order and has its loss reported.
The seeds are chosen per mode so that each mode meets every new fault kind (delay, drop,
slow_disk, full_disk, torn) and the three modes together meet every kind;
``test_the_short_form_meets_every_fault_kind`` checks that from the schedules alone, and the
runs check in the brokers' logs that a full disk and a torn tail really reached the store.
The long form is `rmq chaos --schedules 100` per mode (docs/guarantees.md).  A last test
breaks a broker on purpose (it acknowledges every 5th send without storing it) to prove the
checker can fail.
"""

from __future__ import annotations

import pytest

from cli.chaos.run import run_schedule
from cli.chaos.schedule import FAULT_KINDS, draw, parse_kinds

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NEW_KINDS = {"delay", "drop", "slow_disk", "full_disk", "torn"}
# per mode: the five new kinds and one of kill / partition / pause, a full disk on the master
SHORT_FORM = {"sync": (9, 49, 63), "dledger": (9, 63, 117), "async": (9, 64, 113)}


@pytest.mark.timeout(10)
def test_the_short_form_meets_every_fault_kind():
    seen: set[str] = set()
    for mode, seeds in SHORT_FORM.items():
        plan = [f for seed in seeds for f in draw(seed, mode, 2)]
        kinds = {f.kind for f in plan}
        assert kinds >= NEW_KINDS, (mode, kinds)
        seen |= kinds
        # a power cut is only promised survivable on a slave, or on any DLedger member
        assert all(f.node == "slave" for f in plan if f.kind == "torn" and mode != "dledger")
    assert seen == set(FAULT_KINDS)


@pytest.mark.timeout(10)
def test_kinds_are_parsed_and_the_old_kinds_draw_the_old_schedules():
    assert parse_kinds("all") == parse_kinds("") == FAULT_KINDS
    assert parse_kinds(" torn,kill ") == ("kill", "torn")
    with pytest.raises(ValueError, match="unknown fault kind bogus"):
        parse_kinds("kill,bogus")
    # the long form in docs/guarantees.md ran before the new kinds: its seeds still draw it
    plan = draw(1000, "sync", 2, ("kill", "pause", "partition"))
    assert [(f.kind, f.node) for f in plan] == [("partition", "master"), ("kill", "slave")]


@pytest.mark.parametrize(
    ("mode", "seed"), [(mode, seed) for mode, seeds in SHORT_FORM.items() for seed in seeds]
)
async def test_schedule_keeps_the_promises_of_its_mode(tmp_path, mode, seed, record_property):
    root = tmp_path / mode
    report = await run_schedule(root, mode, seed)
    record_property("chaos", report.summary())
    print(report.summary())
    assert report.acked > 100, report.summary()
    assert not report.order_violations, report.summary()
    if mode != "async":
        assert not report.lost, report.summary()
    # the disk faults reached the broker, not just the control file
    for f in report.faults:
        if f.kind not in ("full_disk", "torn"):
            continue
        log = (root / f"{f.node}.log").read_text()
        if f.kind == "full_disk" and f.node == "master":
            assert "the disk is full" in log or "refusing puts" in log, f
            assert "accepting puts again" in log, f
        if f.kind == "torn":
            assert "bytes before" in f.detail, f
            # recovery cut the damage: a record that fails its checks, queue units pointing
            # past the new end, or (DLedger) entries found torn
            cuts = ("recovery: end at", "truncated to", "torn, cutting")
            assert any(c in log for c in cuts), f


async def test_the_checker_catches_a_broker_that_acknowledges_before_storing(tmp_path):
    report = await run_schedule(
        tmp_path / "broken",
        "async",
        99,
        faults=0,
        duration=2.0,
        broker_extra={"chaosAckBeforeStore": "true"},
    )
    assert not report.ok
    assert len(report.lost) >= report.acked // 10, report.summary()
    text = report.summary()
    assert "seed 99" in text and "LOST: id" in text


async def test_a_cluster_that_takes_no_write_ends_as_a_failed_schedule(tmp_path):
    # a read-only broker (brokerPermission 4) refuses every send: the harness must say so in
    # its report, with the nodes' logs, instead of dying of a timeout
    report = await run_schedule(
        tmp_path / "readonly",
        "async",
        98,
        faults=0,
        duration=1.0,
        broker_extra={"brokerPermission": "4"},
        writable_wait=8.0,  # time for the broker to start and refuse, on a busy host too
    )
    assert report.failure.startswith("the fresh cluster took no write within 8 s ("), report.failure
    assert "answered 16" in report.failure, report.failure  # NO_PERMISSION
    assert not report.ok and report.acked == 0
    text = report.summary()
    assert "FAILED, not checked" in text and "master (running)" in text, text
