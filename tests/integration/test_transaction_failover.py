"""Transactions survive losing the broker that checks them (real processes).

A producer speaking the wire as RocketMQ's Java client does (tests/support/transaction_wire.py)
sends half messages; some it commits or rolls back at once, the rest it leaves unknown and
settles only from the second check-back on (the first is ignored, so checks are under way).
Right after the first check-back arrives, the broker that checks is SIGKILLed:

* SYNC_MASTER + slave: the half and op records are on the slave too; the master is restarted
  on its own store and resumes checking;
* DLedger, 3 members: the leader is killed; the member that takes over checks.

Afterwards every committed message is in its topic exactly once, no rolled-back one is, and
checking goes quiet (nothing is asked again once answered).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
import trio

from cli.chaos.queue_readback import pull_queue
from common.message import MessageExt
from common.remoting.client import RemotingClient, open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.topics import RMQ_SYS_TRANS_HALF_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC
from tests.support.transaction_wire import (
    COMMIT,
    ROLLBACK,
    UNKNOWN,
    HalfSent,
    JavaTxProducer,
    java_tx_producer,
)
from tests.support.wire import wait_node_serving

if TYPE_CHECKING:
    from tests.conftest import ProcessGroup
    from tests.integration.conftest import DLedgerFactory

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

TOPIC = "TxFailover"
N = 24  # a third committed at once, a third rolled back, a third left to the check
# small check times: a failover test in seconds, not minutes
TX_PROPS = {
    "transactionTimeOut": 800,
    "transactionCheckInterval": 500,
    "transactionCheckMax": 30,
    "flushConsumerOffsetInterval": 1000,
}


def plan(i: int) -> tuple[int, int]:
    """(the END sent at once, the final decision) of transaction i."""
    final = COMMIT if i % 2 == 0 else ROLLBACK
    return (final if i % 3 else UNKNOWN), final


async def heartbeats(p: JavaTxProducer, addrs: Callable[[], list[str]]) -> None:
    """The Java client's heartbeat (every 30 s there), fast: brokers that come back learn of
    the producer group within half a second."""
    while True:
        for addr in addrs():
            try:
                with trio.move_on_after(1.0):
                    await p.heartbeat(addr)
            except Exception:
                p.client.close_channel(addr)
        await trio.sleep(0.5)


def settle_on_second_check(decisions: dict[str, int]) -> Callable[[MessageExt], int | None]:
    """Ignore a half message's first check-back, answer its decision from the second on."""

    def answer(m: MessageExt) -> int | None:
        if int(m.properties.get("TRANSACTION_CHECK_TIMES", "0")) < 2:
            return None
        return decisions.get(m.properties.get("UNIQ_KEY", ""), UNKNOWN)

    return answer


async def send_all(p: JavaTxProducer, addr: str) -> tuple[dict[str, int], list[HalfSent]]:
    decisions: dict[str, int] = {}
    halves = []
    for i in range(N):
        h = await p.send_half(addr, TOPIC, f"tx-{i}".encode())
        assert h.code == ResponseCode.SUCCESS, h
        first, final = plan(i)
        decisions[h.uniq] = final
        halves.append(h)
        if first != UNKNOWN:
            await p.end(addr, h, first)
    return decisions, halves


async def delivered(client: RemotingClient, addr: str) -> list[str]:
    """UNIQ_KEYs of everything in the real topic (queue 0), in order."""
    got = await pull_queue(client, addr, TOPIC, 0, group="tx-check")
    return [m.properties.get("UNIQ_KEY", "") for m in got]


async def settled(
    client: RemotingClient, addr: Callable[[], str | None], decisions: dict[str, int]
) -> list[str]:
    """Wait until every commit is delivered, then a few more check rounds (a duplicate or a
    late rolled-back delivery would show up now); the delivered keys."""
    want = sorted(k for k, v in decisions.items() if v == COMMIT)
    with trio.fail_after(90):
        while True:
            a = addr()
            if a is not None:
                try:
                    keys = await delivered(client, a)
                except Exception:
                    client.close_channel(a)
                    keys = []
                if sorted(set(keys)) == want or len(keys) > len(want):
                    break
            await trio.sleep(0.2)
    await trio.sleep(3)  # six check rounds
    a = addr()
    assert a is not None
    return await delivered(client, a)


def assert_exactly_the_commits(keys: list[str], decisions: dict[str, int]) -> None:
    commits = sorted(k for k, v in decisions.items() if v == COMMIT)
    assert sorted(keys) == commits, (len(keys), len(commits))  # once each, none rolled back


def assert_checked_every_undecided(answered: set[str], decisions: dict[str, int]) -> None:
    """Every transaction sent without an END was checked back.

    One whose END was sent may be checked too: RocketMQ's check service asks about any half
    message older than transactionTimeOut whose op record it has not read yet, and a oneway END
    that has not been stored (under load, or waiting for a Raft commit) is no op record yet.  The
    producer answers such a check with its decision; what is delivered is asserted separately.
    """
    undecided = {k for i, k in enumerate(decisions) if i % 3 == 0}
    assert undecided <= answered, sorted(undecided - answered)
    assert answered <= set(decisions)


async def queue_max(client: RemotingClient, addr: str, topic: str) -> int:
    r = await client.invoke(
        addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
    )
    assert r.code == ResponseCode.SUCCESS, r.remark
    return int(r.ext_fields["offset"])


async def same_max(client: RemotingClient, a: str, b: str, topic: str) -> bool:
    """Both brokers' queue 0 of ``topic`` ends at the same offset (polled: no Event crosses
    a process boundary)."""
    return await queue_max(client, a, topic) == await queue_max(client, b, topic)


async def test_sync_master_killed_mid_check_resumes_after_restart(
    procs: ProcessGroup, nursery: trio.Nursery
) -> None:
    ns = procs.namesrv()
    common: dict[str, Any] = {"namesrvAddr": ns.addr, "brokerClusterName": "TxCluster", **TX_PROPS}
    master = procs.broker("tx-master", brokerId=0, brokerRole="SYNC_MASTER", **common)
    slave = procs.broker("tx-slave", brokerId=1, brokerRole="SLAVE", **common)
    live = {"master": master}
    async with open_remoting_client() as client:
        await wait_node_serving(client, master, timeout=60.0)
        await wait_node_serving(client, slave, timeout=60.0)
        async with java_tx_producer("TXFG", "java-1") as p:
            nursery.start_soon(heartbeats, p, lambda: [live["master"].addr])
            with trio.fail_after(60):  # a SYNC_MASTER answers SEND_OK once its slave is there
                h = await p.send_half(master.addr, TOPIC, b"probe")
                while h.code != ResponseCode.SUCCESS:
                    await trio.sleep(0.2)
                    h = await p.send_half(master.addr, TOPIC, b"probe")
            await p.end(master.addr, h, ROLLBACK)
            decisions, _ = await send_all(p, master.addr)
            p.answer = settle_on_second_check(decisions)
            with trio.fail_after(30):
                await p.check_arrived.wait()
            # mid-check: the first check-backs went out, none answered; kill the checker
            master.kill()
            procs.nodes.remove(master)
            restarted = procs.broker(
                "tx-master",
                port=master.port,
                storePathRootDir=master.data_dir,
                brokerId=0,
                brokerRole="SYNC_MASTER",
                **common,
            )
            live["master"] = restarted
            await wait_node_serving(client, restarted, timeout=60.0)
            keys = await settled(client, lambda: restarted.addr, decisions)
            assert_exactly_the_commits(keys, decisions)
            # (probes a SYNC_MASTER stored before its slave was there are checked too)
            answered = {m.properties["UNIQ_KEY"] for _, m in p.checks} & set(decisions)
            assert_checked_every_undecided(answered, decisions)
        # the half and op records are on the slave too: they replicated like any record
        for topic in (RMQ_SYS_TRANS_HALF_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC):
            with trio.fail_after(30):
                while not await same_max(client, slave.addr, restarted.addr, topic):  # noqa: ASYNC110
                    await trio.sleep(0.2)


async def test_dledger_leader_killed_mid_check_the_new_leader_checks(
    dledger_factory: DLedgerFactory, raft_client: RemotingClient, nursery: trio.Nursery
) -> None:
    group = await dledger_factory(3, **TX_PROPS)
    leader = await group.leader(raft_client, timeout=60)
    await group.create_topic(raft_client, TOPIC, queues=1)
    async with java_tx_producer("TXFG", "java-1") as p:
        # heartbeat every member: whichever leads finds the producer group's connection
        nursery.start_soon(heartbeats, p, lambda: [group.addr(i) for i in group.ids])
        decisions, _ = await send_all(p, group.addr(leader))
        p.answer = settle_on_second_check(decisions)
        with trio.fail_after(30):
            await p.check_arrived.wait()
        group.kill(leader)
        new = await group.leader(raft_client, timeout=60)
        assert new != leader
        keys = await settled(raft_client, lambda: group.addr(new), decisions)
        assert_exactly_the_commits(keys, decisions)
        answered = {m.properties["UNIQ_KEY"] for _, m in p.checks}
        assert_checked_every_undecided(answered, decisions)
