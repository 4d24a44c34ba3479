"""A DLedger group of real processes deletes its old Raft log files (DLedger mode cleans its own
files too) and stays whole through it.

The group runs with 64 KiB files, a clean round every 300 ms, ``diskMaxUsedSpaceRatio=1`` (so a
round is always due) and ``fileReservedTime=1`` (Raft files kept 2 h, classic files 1 h).  The
test ages the Raft data files by their mtime, as three hours passing would.

* With a follower down, the leader (all but its newest three files aged) deletes only files
  that follower already holds: restarted, it catches up by replication.
* Then every member deletes its own old files (its log's first entry moves past 0): all but
  its newest three are aged, and the test waits until exactly those are gone, so no file is
  left for a later round to delete.
* A SIGKILL of the whole group and a restart: each member's apply resumes although its log no
  longer starts at 0, and every member serves every message its log still holds.  The log's
  data files are the store's CommitLog (written once): the messages of the dropped files are
  gone, as RocketMQ's CommitLog retention drops them, so what a member serves is a suffix of
  what was sent (each queue read from its min offset), and not all of it.  The reads see one
  state of the log: had a round still been deleting files while the four queues were read one
  after another, a queue read later would start later, and the union would be no suffix.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from cli.chaos.queue_readback import pull_queue
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from rmq import Message, Producer
from rmq.producer import SendStatus

if TYPE_CHECKING:
    from common.remoting.client import RemotingClient
    from tests.integration.conftest import DLedgerGroupProcs

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

TOPIC = "RaftRetention"
FILE_SIZE = 64 * 1024


def raft_data(group: DLedgerGroupProcs, node: str) -> Path:
    data_dir = group.nodes[node].data_dir
    assert data_dir is not None
    return data_dir / f"dledger-{node}" / "data"


def age_raft_files(
    group: DLedgerGroupProcs, node: str, hours: float = 3.0, *, keep_newest: int = 0
) -> set[str]:
    """Age a member's data files as ``hours`` passing would, all but the newest ``keep_newest``
    (their mtime set to now: a file aged before is young again); returns the kept names."""
    names = sorted(os.listdir(raft_data(group, node)))  # named by offset, zero-padded
    cut = len(names) - keep_newest
    old = time.time() - hours * 3600
    for name in names[:cut]:
        os.utime(raft_data(group, node) / name, (old, old))
    for name in names[cut:]:
        os.utime(raft_data(group, node) / name, None)
    return set(names[cut:])


async def wait_files(group: DLedgerGroupProcs, node: str, names: set[str]) -> None:
    """Until retention has deleted every file of a member but ``names``."""
    with trio.fail_after(30):
        while set(os.listdir(raft_data(group, node))) != names:  # noqa: ASYNC110 - another process
            await trio.sleep(0.2)


async def send_keys(namesrv: str, keys: list[str]) -> None:
    async with Producer("raft-retention-pg", namesrv) as producer:
        for key in keys:
            r = await producer.send(Message(TOPIC, key.encode() * 12, keys=key))
            assert r.status is SendStatus.SEND_OK


async def info(group: DLedgerGroupProcs, client: RemotingClient, node: str) -> dict[str, str]:
    with trio.fail_after(30):
        while True:
            got = await group.runtime(client, node)
            if got:
                return got
            await trio.sleep(0.1)


async def wait_begin_above(
    group: DLedgerGroupProcs, client: RemotingClient, node: str, floor: int, timeout: float = 30
) -> int:
    with trio.fail_after(timeout):
        while True:
            begin = int((await info(group, client, node))["dledgerLedgerBeginIndex"])
            if begin > floor:
                return begin
            await trio.sleep(0.2)


async def wait_caught_up(
    group: DLedgerGroupProcs, client: RemotingClient, node: str, end: int
) -> None:
    """Applied up to ``end`` and dispatched: every applied message is in its queue."""
    with trio.fail_after(60):
        while True:
            table = await info(group, client, node)
            if int(table["dledgerAppliedIndex"]) >= end and table["dispatchBehindBytes"] == "0":
                return
            await trio.sleep(0.2)


async def served_keys(group: DLedgerGroupProcs, client: RemotingClient, node: str) -> list[str]:
    """Every message a member serves, each queue read from its min offset (retention moves it:
    a pull below it is refused, on a slave without a new offset, as RocketMQ's slave does)."""
    keys = []
    for q in range(4):
        r = await client.invoke(
            group.addr(node),
            RemotingCommand.request(RequestCode.GET_MIN_OFFSET, {"topic": TOPIC, "queueId": q}),
        )
        assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
        start = int(r.ext_fields["offset"])
        got = await pull_queue(client, group.addr(node), TOPIC, q, start=start)
        keys += [m.keys or "" for m in got]
    return sorted(keys)


async def test_old_raft_files_go_and_the_group_stays_whole(dledger_factory, raft_client):
    group = await dledger_factory(
        3,
        mappedFileSizeCommitLog=FILE_SIZE,
        cleanResourceInterval=300,
        fileReservedTime=1,
        diskMaxUsedSpaceRatio=1,
    )
    leader = await group.leader(raft_client, timeout=60)
    await group.create_topic(raft_client, TOPIC, queues=4)
    first = [f"a{n:05d}" for n in range(1200)]
    await send_keys(group.namesrv_addr, first)

    # a follower goes down; the leader may delete only what that follower holds
    down = next(i for i in group.ids if i != leader)
    await wait_caught_up(group, raft_client, down, 1200)
    down_end = int((await info(group, raft_client, down))["dledgerLedgerEndIndex"])
    group.kill(down)
    second = [f"b{n:05d}" for n in range(1200)]
    await send_keys(group.namesrv_addr, second)
    files_before = len(os.listdir(raft_data(group, leader)))
    assert files_before >= 6
    age_raft_files(group, leader, keep_newest=3)
    begin = await wait_begin_above(group, raft_client, leader, 0)
    await trio.sleep(1.0)  # more rounds: the bound holds, it is not just slow
    begin = int((await info(group, raft_client, leader))["dledgerLedgerBeginIndex"])
    assert 0 < begin <= down_end + 1
    assert len(os.listdir(raft_data(group, leader))) < files_before

    group.restart(down)
    end = int((await info(group, raft_client, leader))["dledgerLedgerEndIndex"])
    await wait_caught_up(group, raft_client, down, end)

    # every member cleans its own files, all but its newest three, and is done with it (the
    # leader's own were aged above: with its follower back it went on past that follower's end)
    kept = {node: age_raft_files(group, node, keep_newest=3) for node in group.ids}
    for node in group.ids:
        await wait_files(group, node, kept[node])
        assert int((await info(group, raft_client, node))["dledgerLedgerBeginIndex"]) > 0, node

    # the whole group is SIGKILLed: the applies resume on logs that do not start at 0
    for node in group.ids:
        group.kill(node)
    for node in group.ids:
        group.restart(node)
    leader = await group.leader(raft_client, timeout=60)
    end = int((await info(group, raft_client, leader))["dledgerLedgerEndIndex"])
    sent = first + second
    for node in group.ids:
        await wait_caught_up(group, raft_client, node, end)
        first_kept = int((await info(group, raft_client, node))["dledgerLedgerBeginIndex"])
        assert first_kept > 0
        served = await served_keys(group, raft_client, node)
        # (a new term's first entry may open a file: nothing kept went)
        assert kept[node] <= set(os.listdir(raft_data(group, node))), node
        assert int((await info(group, raft_client, node))["dledgerLedgerBeginIndex"]) == first_kept
        # everything from the first message still in the log on, nothing before it
        assert 0 < len(served) < len(sent), node
        assert served == sorted(sent[len(sent) - len(served) :]), node
