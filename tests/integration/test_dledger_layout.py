"""A DLedger group's stores, read as RocketMQ lays them out, with the reader and decoder the Apache
fixture is read with (broker/dledger/broker/dledger_commitlog.py, driver/entry_coder.py).

Three real members take messages, stop, and each member's files are then opened read-only in
place: ``<storePathRootDir>/dledger-<id>/{data,index,currterm,checkpoint}``; every committed
entry is either a no-op (the ROLLBACK record a Java member dispatches nothing for) or one
message whose PHYSICALOFFSET is its entry's ``pos + 48``; each message sent is there once; and
the members' committed entries are the same bytes; the messages are written once (no classic
CommitLog) and the ConsumeQueues point at entry ``pos + 48``, so the reader finds each by its
queue offset.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
import trio

from broker.dledger.broker.dledger_commitlog import DLedgerStorePaths, open_dledger_commitlog
from broker.dledger.driver import entry_coder as ec
from common.message import decode_record
from rmq import Message, Producer
from rmq.producer import SendStatus

if TYPE_CHECKING:
    from common.remoting.client import RemotingClient
    from tests.integration.conftest import DLedgerGroupProcs

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

TOPIC = "RaftLayout"


async def applied(group: DLedgerGroupProcs, client: RemotingClient, node: str) -> int:
    table = await group.runtime(client, node)
    return -1 if not table else int(table["dledgerAppliedIndex"])


async def test_each_members_store_reads_in_rocketmqs_layout(dledger_factory, raft_client):
    group = await dledger_factory(3, mappedFileSizeCommitLog=64 * 1024)
    leader = await group.leader(raft_client, timeout=60)
    await group.create_topic(raft_client, TOPIC, queues=4)
    keys = [f"k{n:04d}" for n in range(300)]
    async with Producer("raft-layout-pg", group.namesrv_addr) as producer:
        for key in keys:
            r = await producer.send(Message(TOPIC, key.encode() * 40, keys=key))
            assert r.status is SendStatus.SEND_OK
    table = await group.runtime(raft_client, leader)
    assert table is not None
    end = int(table["dledgerCommittedIndex"])
    with trio.fail_after(60):
        for node in group.ids:
            while await applied(group, raft_client, node) < end:  # noqa: ASYNC110
                await trio.sleep(0.1)
    for node in group.ids:
        group.nodes[node].stop()  # a clean stop writes the checkpoint's committedIndex

    committed: dict[str, list[bytes]] = {}
    for node in group.ids:
        root = group.nodes[node].data_dir
        assert root is not None
        member = root / f"dledger-{node}"
        # currterm is written when the term or vote changes: a member that followed the
        # first leader of term 0 without a vote has none, as in DLedger
        names = set(os.listdir(member))
        assert (
            {"checkpoint", "data", "index"} <= names <= {"checkpoint", "currterm", "data", "index"}
        )
        reader = open_dledger_commitlog(DLedgerStorePaths(str(root), node))
        try:
            assert reader.committed_index >= end
            bodies, found = [], []
            for entry in reader.entries[: reader.committed_index - reader.begin_index + 1]:
                body = reader.entry_body(entry)
                bodies.append(body)
                record = decode_record(body)
                assert record.commit_log_offset == entry.pos + 48
                if ec.is_noop_body(body):
                    assert record.topic == ec.NOOP_TOPIC
                    continue
                msg = reader.message_at(entry.pos + 48)
                if msg.topic == TOPIC:
                    found.append(msg.keys or "")
            assert sorted(found) == keys
            # written once: no classic CommitLog copy, and the ConsumeQueues point into the
            # data files at entry pos + 48 (what a Java member's reads follow)
            assert not (root / "commitlog").exists()
            by_queue = [
                reader.message(TOPIC, qid, offset).keys or ""
                for qid in range(4)
                for offset in range(reader.max_queue_offset(TOPIC, qid))
            ]
            assert sorted(by_queue) == keys
            assert sum(ec.is_noop_body(b) for b in bodies) >= 1  # the first leader's, at least
            committed[node] = bodies
        finally:
            reader.close()
    lengths = {len(b) for b in committed.values()}
    shortest = min(lengths)
    first = committed[group.ids[0]][:shortest]
    assert all(b[:shortest] == first for b in committed.values())
