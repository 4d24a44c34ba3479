"""The driver's side of a reset (raft/entry_handler.py, "Reset"): a member that was down while
the leader's retention dropped the head of its log comes back behind the leader's first entry,
is reset there, tells the broker's hook, shows as rebuilding, and catches up."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio

from broker.dledger.driver.memory_transport import MemoryDLedgerNetwork
from broker.dledger.driver.mmap_file_store import FileLog, open_file_log
from broker.dledger.driver.node import DLedgerConfig, DLedgerNode, run_dledger_node
from broker.dledger.driver.node_storage import MemoryStorage
from broker.dledger.raft.log import MemoryLog, RaftLog
from broker.dledger.raft.messages import Role
from common.remoting.codes import DLedgerResponseCode as RC
from tests.broker.dledger.test_node import eventually, peers_string

pytestmark = pytest.mark.timeout(60)

FILE = 256  # a few entries a data file: the head goes in small steps


def config(member: str) -> DLedgerConfig:
    return DLedgerConfig(
        group="g",
        self_id=member,
        peers=peers_string(3),
        store_base_dir="/nonexistent",
        heart_beat_time_interval_ms=200,
        max_push_time_out_ms=100,
    )


@pytest.mark.parametrize("follower_log", ["memory", "file", "no hook"])
async def test_a_member_down_during_a_forced_clean_is_reset_and_catches_up(
    autojump_clock: trio.abc.Clock, tmp_path: Path, follower_log: str
) -> None:
    """... and without an ``on_log_reset`` hook it refuses the reset and stays behind (a broker
    keeping a copy of the log it cannot drop must not be reset)."""
    net = MemoryDLedgerNetwork(seed=11, min_delay=0.001, max_delay=0.003)
    logs: dict[str, RaftLog] = {m: MemoryLog(file_size=FILE) for m in ("n0", "n1", "n2")}
    storages = {m: MemoryStorage() for m in logs}
    scopes: dict[str, trio.CancelScope] = {}
    nodes: dict[str, DLedgerNode] = {}
    resets: list[tuple[str, int, int]] = []

    async with trio.open_nursery() as nursery:

        async def start(member: str, *, hook: bool = True) -> None:
            scope = scopes[member] = trio.CancelScope()

            async def run(*, task_status: trio.TaskStatus[DLedgerNode]) -> None:
                with scope:
                    await run_dledger_node(
                        config(member),
                        net,
                        log=logs[member],
                        storage=storages[member],
                        rng=random.Random(member),
                        on_log_reset=(lambda b, p: resets.append((member, b, p))) if hook else None,
                        task_status=task_status,
                    )

            nodes[member] = await nursery.start(run)

        for member in logs:
            await start(member)
        await eventually(lambda: sum(n.role is Role.LEADER for n in nodes.values()) == 1)
        leader = next(n for n in nodes.values() if n.role is Role.LEADER)
        lead_id = leader.config.self_id
        assert await leader.propose([b"early"]).wait() is RC.SUCCESS
        down = next(m for m in logs if m != lead_id)
        await eventually(lambda: nodes[down].committed_index >= leader.committed_index)
        scopes[down].cancel()
        del nodes[down]
        if follower_log == "file":
            # it comes back on a file log holding what it had (the reset must remove it all)
            flog = open_file_log(str(tmp_path / down), data_file_size=FILE, index_file_size=256)
            old = logs[down]
            for i in range(old.end_index + 1):
                entry = old.get(i)
                assert entry is not None and flog.append_entry(entry)
            logs[down] = flog
        for i in range(40):
            assert await leader.propose([b"m%02d" % i]).wait() is RC.SUCCESS
        held_end = logs[down].end_index
        # the forced clean: the leader's head goes past everything the down member holds
        lead_log = leader.log
        assert isinstance(lead_log, MemoryLog)
        lead_log.drop_head(leader.committed_index)
        begin = lead_log.begin_index
        assert begin > held_end + 1
        first = lead_log.get(begin)
        assert first is not None

        started = trio.current_time()
        await start(down, hook=follower_log != "no hook")
        back = nodes[down]
        if follower_log == "no hook":
            await trio.sleep(3.0)
            assert back.log.end_index == held_end and back.leader_id == lead_id
            assert resets == [] and not back.status().rebuilding
            nursery.cancel_scope.cancel()
            return
        seen_rebuilding = False

        def caught_up() -> bool:
            nonlocal seen_rebuilding
            seen_rebuilding |= back.status().rebuilding
            return (
                back.log.end_index == leader.log.end_index
                and back.committed_index >= leader.committed_index
            )

        await eventually(caught_up, timeout=10, step=0.001)
        took = trio.current_time() - started
        # a restarted member waits for the leader's next heartbeat or push: well within 2 s
        assert took < 2.0, took
        assert resets == [(down, begin, first.pos)]
        assert seen_rebuilding and not back.status().rebuilding
        assert back.log.begin_index == begin
        for i in range(begin, leader.log.end_index + 1):
            assert back.log.get(i) == leader.log.get(i)
        assert back.log.get(begin - 1) is None
        # and it keeps following
        assert await leader.propose([b"after"]).wait() is RC.SUCCESS
        end = leader.log.end_index
        await eventually(lambda: back.log.get(end) == leader.log.get(end))
        nursery.cancel_scope.cancel()
    if follower_log == "file":
        closing = logs[down]
        assert isinstance(closing, FileLog)
        closing.close()
        reopened = open_file_log(str(tmp_path / down), data_file_size=FILE, index_file_size=256)
        try:
            assert reopened.begin_index == begin and reopened.get(begin) == first
        finally:
            reopened.close()
