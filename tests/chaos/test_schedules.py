"""The chaos harness, short form: 3 seeded fault schedules per mode against real processes.

Each schedule runs 8 s of load from 4 producers while two faults (SIGKILL and restart,
SIGSTOP/SIGCONT, or a partition of a node's replication links, on any node including the
nameserver) hit the cluster, then checks the whole history (cli/chaos_checker.py).  SYNC_MASTER
and DLedger must lose no acknowledged message and keep each queue's order; ASYNC_MASTER must
keep order and has its loss reported.  The long form is `rmq chaos --schedules 100` per mode
(docs/guarantees.md).  A last test breaks a broker on purpose (it acknowledges every 5th send
without storing it) to prove the checker can fail.
"""

from __future__ import annotations

import pytest

from cli.chaos_run import run_schedule

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize("mode", ["sync", "dledger", "async"])
async def test_schedule_keeps_the_promises_of_its_mode(tmp_path, mode, seed, record_property):
    report = await run_schedule(tmp_path / mode, mode, seed)
    record_property("chaos", report.summary())
    print(report.summary())
    assert report.acked > 100, report.summary()
    assert not report.order_violations, report.summary()
    if mode != "async":
        assert not report.lost, report.summary()


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
