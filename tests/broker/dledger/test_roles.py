"""The broker's role follows the DLedger role (broker/dledger/broker/roles.py), on a fake node.

A real broker (``run_broker`` in DLedger mode, in-memory classic store) and a real nameserver
run on an in-memory network; the test moves the fake node between roles and checks what the
broker does: brokerId, role, which of the schedule service and the slave sync run, and what the
nameserver lists for the group.
"""

from __future__ import annotations

import functools
import logging

import pytest
import trio

from broker.config import BrokerConfig
from broker.dledger.broker.roles import slave_broker_id
from broker.dledger.raft.messages import Role
from broker.service import run_broker
from broker.store import (
    MessageStoreConfig,
    PutMessageResult,
    PutMessageStatus,
    run_memory_store,
)
from common import serde
from common.model import KVTable
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from namesrv.config import NamesrvConfig
from namesrv.service import NamesrvHandle, run_namesrv
from tests.support.memory_network import MemoryNetwork

PEERS = "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913"


@pytest.fixture
async def world(nursery, tmp_path, new_node):
    """(network, nameserver handle, start(node) -> broker handle)."""
    network = MemoryNetwork()
    ns = await nursery.start(
        functools.partial(run_namesrv, network=network),
        NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kv.json")),
    )

    async def start(node, **store_kw):
        config = BrokerConfig(
            listen_port=0,
            namesrv_addr=ns.addr,
            store=MessageStoreConfig(
                store_path_root_dir=str(tmp_path / node.config.self_id),
                enable_dleger_commit_log=True,
                dleger_peers=PEERS,
                dleger_self_id=node.config.self_id,
                **store_kw,
            ),
        )
        return await nursery.start(
            functools.partial(
                run_broker,
                config,
                store_factory=run_memory_store,
                network=network,
                io_threads=False,
                dledger_node=node,
            )
        )

    return network, ns, start


def addrs(ns: NamesrvHandle) -> dict[int, str]:
    table = ns.routes.get_all_cluster_info().broker_addr_table
    return dict(table["broker-a"].broker_addrs) if "broker-a" in table else {}


def test_slave_broker_id():
    assert [slave_broker_id(f"n{k}") for k in (0, 1, 2, 10)] == [1, 2, 3, 11]


async def test_no_role_no_registration(world, new_node, mk, autojump_clock):
    _, ns, start = world
    node = new_node(role=Role.CANDIDATE, leader_id=None)
    broker = await start(node)
    await trio.sleep(40)  # past the registrar's period
    c = broker.controller
    assert (c.broker_id, c.broker_role) == (-1, "SLAVE")
    assert addrs(ns) == {}
    r = await broker.store.put_message(mk())
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert node.log.end_index == -1


async def test_follower_leader_candidate_flips(world, new_node, mk, autojump_clock):
    _, ns, start = world
    node = new_node(role=Role.CANDIDATE, leader_id=None, auto_commit=False)
    node.config = type(node.config)(self_id="n2", peers=PEERS)
    broker = await start(node)
    c = broker.controller

    node.change_role(Role.FOLLOWER, term=1, leader_id="n0")
    await trio.sleep(0.5)  # the registration is sent at once, not a period later
    assert (c.broker_id, c.broker_role, c.store.broker_role) == (3, "SLAVE", "SLAVE")
    assert c.slave_sync is not None
    assert addrs(ns) == {3: broker.addr}

    # leader, but an entry of its log is not committed yet: still a slave
    node.log.append(2, b"")
    node.change_role(Role.LEADER, term=2, leader_id="n2")
    await trio.sleep(2)
    assert c.broker_id == 3 and addrs(ns) == {3: broker.addr}
    node.commit(0)
    await trio.sleep(0.5)
    assert (c.broker_id, c.broker_role) == (0, "SYNC_MASTER")
    assert c.slave_sync is None
    assert addrs(ns) == {0: broker.addr}  # the nameserver dropped the old id of this address
    # a master now: puts go through the log, and the schedule service delivers delayed ones
    node.auto_commit = True
    assert (await broker.store.put_message(mk(topic="D", DELAY=1))).ok
    await trio.sleep(3)
    assert broker.store.get_max_offset_in_queue("D", 0) == 1

    node.change_role(Role.CANDIDATE, term=3, leader_id=None)
    await trio.sleep(0.5)
    assert (c.broker_id, c.broker_role) == (3, "SLAVE")
    assert addrs(ns) == {3: broker.addr}
    assert c.slave_sync is not None
    r = await broker.store.put_message(mk())
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE


async def test_a_leader_that_loses_its_term_while_catching_up_does_not_become_master(
    world, new_node, mk, autojump_clock
):
    _, ns, start = world
    node = new_node(role=Role.CANDIDATE, leader_id=None, auto_commit=False)
    broker = await start(node)
    c = broker.controller
    node.log.append(1, b"")
    node.change_role(Role.LEADER, term=1, leader_id="n0")
    await trio.sleep(1)
    node.change_role(Role.FOLLOWER, term=2, leader_id="n1")
    node.commit(0)
    await trio.sleep(1)
    assert (c.broker_id, c.broker_role) == (1, "SLAVE")
    assert addrs(ns) == {1: broker.addr}


async def test_a_one_member_group_is_master_at_start(world, new_node, mk, autojump_clock):
    _, ns, start = world
    broker = await start(new_node())  # leader already when the broker starts
    await trio.sleep(0.5)
    assert broker.controller.broker_id == 0 and addrs(ns) == {0: broker.addr}
    assert (await broker.store.put_message(mk())).ok


async def test_the_node_telling_of_the_role_it_had_at_start_changes_nothing(
    world, new_node, mk, autojump_clock, caplog
):
    """The node takes a role at once but tells its listeners only after the term's vote is
    persisted: a handler started in between seeds the role, then hears of it.  The second is
    a no-op; a put in flight keeps its queue offset and the next one gets the next."""
    caplog.set_level(logging.INFO, logger="broker.dledger.broker.roles")
    _, ns, start = world
    node = new_node(auto_commit=False)
    broker = await start(node)
    await trio.sleep(0.5)
    assert broker.controller.broker_id == 0
    in_flight = broker.store.append_message(mk(body=b"in flight"))
    node.change_role(Role.LEADER, term=1, leader_id="n0")
    await trio.sleep(0.5)
    assert "master already in term 1" in caplog.text
    assert broker.controller.broker_id == 0 and addrs(ns) == {0: broker.addr}
    next_put = broker.store.append_message(mk(body=b"next"))
    node.commit(node.log.end_index)
    offsets = []
    for put in (in_flight, next_put):
        assert not isinstance(put, PutMessageResult)
        r = await put.wait()
        assert r.ok and r.append is not None
        offsets.append(r.append.logics_offset)
    assert offsets == [0, 1]


async def test_runtime_info_has_the_raft_state(world, new_node, autojump_clock):
    network, _, start = world
    broker = await start(new_node(term=4))
    async with open_remoting_client(network=network) as client:
        resp = await client.invoke(
            broker.addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
        )
    assert resp.code == ResponseCode.SUCCESS
    table = serde.from_json(resp.body_bytes(), KVTable).table
    assert table["dledgerRole"] == "LEADER" and table["dledgerTerm"] == "4"
    assert table["dledgerGroup"] == "broker-a" and table["dledgerLeaderId"] == "n0"
    for key in ("dledgerSelfId", "dledgerLedgerEndIndex", "dledgerCommittedIndex", "dledgerPeers"):
        assert key in table


async def test_timer_service_runs_on_the_leader_only(world, new_node, mk, autojump_clock):
    # the timer service (broker/timer) starts and stops with the role, like the schedule
    # service; a leader again resumes from the log: the timer is delivered once, when due
    _, _, start = world
    node = new_node(role=Role.CANDIDATE, leader_id=None)
    broker = await start(node)
    c = broker.controller
    timers = c.timer_service
    node.change_role(Role.FOLLOWER, term=1, leader_id="n0")
    await trio.sleep(0.5)
    assert not timers.running
    node.change_role(Role.LEADER, term=2, leader_id="n1")
    await trio.sleep(0.5)
    assert c.broker_role == "SYNC_MASTER" and timers.running
    due = timers.clock_ms() + 10_000
    props = {"TIMER_OUT_MS": due - 1000, "REAL_TOPIC": "TT", "REAL_QID": 0, "UNIQ_KEY": "U"}
    assert (await broker.store.put_message(mk(topic="rmq_sys_wheel_timer", **props))).ok
    await trio.sleep(1)
    node.change_role(Role.FOLLOWER, term=3, leader_id="n0")
    await trio.sleep(0.5)
    assert not timers.running
    await trio.sleep(12)  # due while a follower: nothing delivered here
    assert broker.store.get_max_offset_in_queue("TT", 0) == 0
    node.change_role(Role.LEADER, term=4, leader_id="n1")
    await trio.sleep(1)
    assert timers.running
    assert broker.store.get_max_offset_in_queue("TT", 0) == 1
    node.change_role(Role.FOLLOWER, term=5, leader_id="n0")
    await trio.sleep(0.5)
    node.change_role(Role.LEADER, term=6, leader_id="n1")
    await trio.sleep(2)
    assert broker.store.get_max_offset_in_queue("TT", 0) == 1  # once


async def test_a_master_that_loses_its_quorum_stops_at_once_and_says_so(
    world, new_node, mk, autojump_clock, caplog
):
    # the core made the leader a candidate (its lease ran out, broker/dledger/raft/election.py):
    # the very next put is refused with 14, the route loses brokerId 0, and the log says so;
    # when it leads again, the log says that too
    _, ns, start = world
    node = new_node(role=Role.CANDIDATE, leader_id=None)
    broker = await start(node)
    c = broker.controller
    node.change_role(Role.LEADER, term=2, leader_id="n0")
    await trio.sleep(0.5)
    assert c.broker_id == 0 and addrs(ns) == {0: broker.addr}
    with caplog.at_level(logging.INFO, logger="broker.dledger.broker.roles"):
        node.change_role(Role.CANDIDATE, term=2, leader_id=None)
        # no checkpoint yet: the role handler has not run, the store already refuses
        r = await broker.store.put_message(mk())
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        await trio.sleep(0.5)
        assert (c.broker_id, c.broker_role) == (1, "SLAVE")
        assert addrs(ns) == {1: broker.addr}
        node.change_role(Role.LEADER, term=3, leader_id="n0")
        await trio.sleep(0.5)
        assert c.broker_id == 0 and addrs(ns) == {0: broker.addr}
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "broker.dledger.broker.roles"
    ]
    assert warned == [
        "broker broker-a (DLedger n0) stopped serving as master: it lost its quorum and is a "
        "candidate in term 2; writes are refused with SERVICE_NOT_AVAILABLE, reads are served "
        "as slave 1 (committed entries only)",
        "broker broker-a (DLedger n0) serves as master again (leader of term 3)",
    ]
