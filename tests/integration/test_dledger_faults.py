"""A DLedger group of real processes under a partition and a whole-group crash.

* Partition: every Raft link to and from the leader goes through a proxy that the test cuts
  (tests/integration/conftest.py).  The old leader keeps its client port, so sends still reach
  it, and it must not acknowledge them; the other two elect a leader that serves writes; after
  the heal the old leader's uncommitted tail (what it appended while cut off) is truncated: no
  node serves it, and every node ends with the same ledger end and committed index.
* Whole-group crash: SIGKILL all three, start them again from their stores: the same
  committed log (ledger end, committed index) and the same queues, readable message by message.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest
import trio

from cli.chaos.queue_readback import pull_queue
from rmq import Message, Producer
from rmq.client_api import ClientAPI
from rmq.producer import SendStatus

if TYPE_CHECKING:
    from common.remoting.client import RemotingClient
    from tests.integration.conftest import DLedgerFactory, DLedgerGroupProcs

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def raft_state(
    group: DLedgerGroupProcs, client: RemotingClient
) -> dict[str, tuple[int, int, int, bool]]:
    """node -> (term, ledger end index, committed index, whether its queues hold all it
    committed: applied to the store and dispatched) of every live node."""
    out = {}
    for i in group.ids:
        if group.nodes[i].proc.poll() is not None:
            continue
        info = await group.runtime(client, i)
        if info:
            committed = int(info["dledgerCommittedIndex"])
            out[i] = (
                int(info["dledgerTerm"]),
                int(info["dledgerLedgerEndIndex"]),
                committed,
                int(info["dledgerAppliedIndex"]) >= committed
                and info.get("dispatchBehindBytes") == "0",
            )
    return out


async def converged(
    group: DLedgerGroupProcs, client: RemotingClient, *, timeout: float = 30.0
) -> tuple[int, int]:
    """Wait until every node has the same ledger end and committed index (and they are equal),
    and serves all of it from its queues; returns (end index, committed index)."""
    with trio.fail_after(timeout):
        while True:
            state = await raft_state(group, client)
            ends = {(end, committed) for _, end, committed, _ in state.values()}
            served = all(caught_up for *_, caught_up in state.values())
            if len(state) == len(group.ids) and len(ends) == 1 and served:
                (end, committed) = ends.pop()
                if end == committed:
                    return end, committed
            await trio.sleep(0.1)


async def send_keys(namesrv: str, topic: str, keys: list[str]) -> None:
    async with Producer("raft-fault-pg", namesrv) as producer:
        for key in keys:
            r = await producer.send(Message(topic, key.encode(), keys=key))
            assert r.status is SendStatus.SEND_OK


async def stored_keys(
    group: DLedgerGroupProcs, client: RemotingClient, node: str, topic: str
) -> list[str]:
    """Every key in ``topic`` as ``node`` serves it (pull straight from that node)."""
    keys: list[str] = []
    for q in range(4):
        got = await pull_queue(client, group.addr(node), topic, q, group="raft-fault-check")
        keys += [m.keys or "" for m in got]
    return keys


async def test_partitioned_leader_stops_acking_and_its_tail_is_truncated(
    dledger_factory: DLedgerFactory, raft_client: RemotingClient
) -> None:
    topic = "RaftPartition"
    group = await dledger_factory(3)
    old = await group.leader(raft_client, timeout=60)
    await group.create_topic(raft_client, topic, queues=4)
    await send_keys(group.namesrv_addr, topic, [f"before-{n}" for n in range(20)])

    group.isolate(old)
    # Straight to the old leader: while it still believes it leads it appends, but can never
    # reach a quorum, so it must not answer SEND_OK.
    async with Producer("raft-iso-pg", group.namesrv_addr) as producer:
        api = producer.client.api
        acked = 0
        for n in range(5):
            header = ClientAPI.send_header(
                group="raft-iso-pg",
                topic=topic,
                queue_id=n % 4,
                properties={"KEYS": f"iso-{n}"},
                born_timestamp=int(time.time() * 1000),
            )
            try:
                await api.send_message(group.addr(old), header, f"iso-{n}".encode(), timeout=5.0)
                acked += 1
            except Exception:
                pass
        assert acked == 0, "a leader cut off from both followers acknowledged a write"

    others = [i for i in group.ids if i != old]
    new = await group.leader(raft_client, among=others, timeout=30)
    assert new != old
    await send_keys(group.namesrv_addr, topic, [f"after-{n}" for n in range(20)])

    group.heal()
    await converged(group, raft_client)
    for node in group.ids:
        keys = await stored_keys(group, raft_client, node, topic)
        assert not [k for k in keys if k.startswith("iso-")], f"{node} serves the cut-off tail"
        assert sorted(k for k in keys if not k.startswith("iso-")) == sorted(
            [f"before-{n}" for n in range(20)] + [f"after-{n}" for n in range(20)]
        ), node


async def test_whole_group_sigkill_restarts_with_the_same_log_and_queues(
    dledger_factory: DLedgerFactory, raft_client: RemotingClient
) -> None:
    topic = "RaftCrash"
    group = await dledger_factory(3)
    await group.leader(raft_client, timeout=60)
    await group.create_topic(raft_client, topic, queues=4)
    sent = [f"crash-{n}" for n in range(200)]
    await send_keys(group.namesrv_addr, topic, sent)
    end, committed = await converged(group, raft_client)
    leader = await group.leader(raft_client)
    before = await stored_keys(group, raft_client, leader, topic)
    assert sorted(before) == sorted(sent)

    for i in group.ids:
        group.kill(i)
    for i in group.ids:
        group.restart(i)
    leader = await group.leader(raft_client, timeout=60)
    end2, committed2 = await converged(group, raft_client)
    # the new leader may add its term's no-op entry: nothing committed is gone or changed
    assert end2 >= end and committed2 >= committed
    for node in group.ids:
        assert await stored_keys(group, raft_client, node, topic) == before, node
