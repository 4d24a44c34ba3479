"""A DLedger member stranded by a forced clean rebuilds itself and serves within a minute of
starting (issue 27's acceptance), with real processes.

Needs the write-once store (consume queues pointing into the DLedger data files) and its
``on_log_reset`` hook passed to ``run_dledger_node`` (broker/dledger/driver/node.py): without
the hook a member refuses the reset and stays stranded, and this test fails at its wait.

The group runs with 64 KiB files, a clean round every 300 ms and a forced clean on
(``cleanFileForciblyEnable``, ``diskSpaceCleanForciblyRatio`` below any real disk's use): the
leader drops its head files up to what is committed and applied, whatever the followers hold.

* A follower goes down; the leader's first entry moves past everything that follower holds.
* Restarted, the follower finds itself behind the leader's first entry: the leader resets its
  log there (raft/entry_handler.py, "Reset"), it catches up, and within a minute of its start
  it serves exactly what the leader serves (what was below the leader's first entry is gone
  from the group).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from tests.integration.test_dledger_retention import (
    FILE_SIZE,
    TOPIC,
    info,
    send_keys,
    served_keys,
    wait_begin_above,
    wait_caught_up,
)

if TYPE_CHECKING:
    from common.remoting.client import RemotingClient
    from tests.integration.conftest import DLedgerGroupProcs

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

# the acceptance: serving within a minute of starting
REBUILD_LIMIT_S = 60.0


async def rebuilt(
    group: DLedgerGroupProcs, client: RemotingClient, node: str, leader: str, floor: int
) -> dict[str, str]:
    """Wait until ``node``'s log begins at the leader's first entry (above ``floor``: it was
    reset), it applied the leader's end and no longer says it is rebuilding."""
    while True:
        lead = await info(group, client, leader)
        mine = await info(group, client, node)
        if (
            int(mine["dledgerLedgerBeginIndex"]) > floor
            and mine["dledgerLedgerBeginIndex"] == lead["dledgerLedgerBeginIndex"]
            and int(mine["dledgerAppliedIndex"]) >= int(lead["dledgerLedgerEndIndex"])
            and mine.get("dledgerRebuilding") == "false"
        ):
            return mine
        await trio.sleep(0.2)


async def test_a_member_stranded_by_a_forced_clean_rebuilds_itself_and_serves(
    dledger_factory, raft_client
):
    group = await dledger_factory(
        3,
        mappedFileSizeCommitLog=FILE_SIZE,
        cleanResourceInterval=300,
        fileReservedTime=1,
        diskMaxUsedSpaceRatio=1,
        cleanFileForciblyEnable="true",
        diskSpaceCleanForciblyRatio=0.0001,
    )
    leader = await group.leader(raft_client, timeout=60)
    await group.create_topic(raft_client, TOPIC, queues=4)
    first = [f"a{n:05d}" for n in range(600)]
    await send_keys(group.namesrv_addr, first)

    down = next(i for i in group.ids if i != leader)
    await wait_caught_up(group, raft_client, down, 600)
    down_end = int((await info(group, raft_client, down))["dledgerLedgerEndIndex"])
    group.kill(down)
    second = [f"b{n:05d}" for n in range(1800)]
    await send_keys(group.namesrv_addr, second)
    # the forced clean strands it: the leader's first entry is past its end + 1
    begin = await wait_begin_above(group, raft_client, leader, down_end + 1, timeout=60)

    started = trio.current_time()
    group.restart(down)
    with trio.fail_after(REBUILD_LIMIT_S):
        mine = await rebuilt(group, raft_client, down, leader, down_end + 1)
        # it serves what the group serves: the leader's messages from its first entry on
        want = await served_keys(group, raft_client, leader)
        while await served_keys(group, raft_client, down) != want:  # noqa: ASYNC110 - polling a process
            await trio.sleep(0.2)
    took = trio.current_time() - started
    assert int(mine["dledgerLedgerBeginIndex"]) >= begin
    assert want and set(want) <= set(first + second)
    assert second[-1] in want  # the newest message is there (the last file is never cleaned)
    print(f"stranded member {down} rebuilt and serving {took:.1f} s after its start")

    # and it goes on following: the same messages as the leader (the forced clean goes on
    # dropping every file but the last on every member meanwhile, so older ones of these may
    # go from both), the newest among them, in the last file, which no clean touches
    third = [f"c{n:05d}" for n in range(100)]
    await send_keys(group.namesrv_addr, third)
    end = int((await info(group, raft_client, leader))["dledgerLedgerEndIndex"])
    await wait_caught_up(group, raft_client, down, end)
    with trio.fail_after(30):
        while True:
            want = await served_keys(group, raft_client, leader)
            if await served_keys(group, raft_client, down) == want:
                break
            await trio.sleep(0.2)
    assert third[-1] in want
