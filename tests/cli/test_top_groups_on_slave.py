"""`rmq top` keeps its consumer-group section while a master is down and its slave serves.

The collector runs over the real Admin client against an in-process master + slave on the
in-memory network (autojump clock: the slave's metadata sync, 3 s after start then every
60 s, copies the group and its offsets). The master is then stopped as SIGTERM stops it (it
unregisters: the nameserver lists the slave alone), or while the nameserver still lists it.
"""

from __future__ import annotations

import pytest
import trio

from cli.top.model import AdminSource, TopCollector, TopSnapshot
from rmq import Admin, Message, Producer, PullConsumer
from tests.conftest import InProcessCluster

pytestmark = pytest.mark.timeout(60)

TOPIC = "TopSlave"
GROUP = "cg-top-slave"


async def _cluster_with_a_consumed_group(cluster: InProcessCluster) -> None:
    await cluster.start_broker(
        "broker-a-s1", broker_name="broker-a", broker_id=1, store=dict(broker_role="SLAVE")
    )
    await cluster.create_topic(TOPIC, 2)
    async with Producer("pg-top", cluster.namesrv, network=cluster.network) as producer:
        for i in range(6):
            await producer.send(Message(TOPIC, f"m{i}".encode()))
    async with PullConsumer(GROUP, cluster.namesrv, network=cluster.network) as consumer:
        for mq in await consumer.fetch_queues(TOPIC):
            result = await consumer.pull(mq, 0)
            await consumer.commit_offset(mq, result.messages[0].queue_offset + 1)
    await trio.sleep(70)  # the slave's sync has copied the group and its offsets


async def _groups(cluster: InProcessCluster) -> TopSnapshot:
    async with Admin(cluster.namesrv, network=cluster.network, timeout=2.0) as admin:
        snap = await TopCollector(AdminSource(admin, 2.0), cluster.namesrv).collect()
    return snap


async def test_the_groups_stay_when_the_master_is_gone_from_the_nameserver(
    memory_cluster, autojump_clock
):
    await _cluster_with_a_consumed_group(memory_cluster)
    before = await _groups(memory_cluster)
    [up] = [g for g in before.groups if g.group == GROUP]
    assert up.error is None and up.lag == 4, up
    await memory_cluster.stop_broker("broker-a")
    snap = await _groups(memory_cluster)
    assert snap.groups_error is None, snap.groups_error
    [g] = [g for g in snap.groups if g.group == GROUP]
    assert g.error is None, g.error
    assert g.topics == (TOPIC,) and g.lag == 4, g


async def test_the_groups_stay_while_a_listed_master_does_not_answer(
    memory_cluster, autojump_clock, monkeypatch
):
    # the nameserver still lists the master (it has not noticed yet): the reads try it, get no
    # connection, and go on to the slave
    await _cluster_with_a_consumed_group(memory_cluster)
    master = memory_cluster.addr("broker-a")
    async with Admin(memory_cluster.namesrv, network=memory_cluster.network, timeout=2.0) as admin:
        listed = await admin.cluster_info()
    await memory_cluster.stop_broker("broker-a")

    async def stale_cluster_info(self: Admin) -> object:
        return listed

    monkeypatch.setattr(Admin, "cluster_info", stale_cluster_info)
    assert listed.brokerAddrTable["broker-a"].brokerAddrs[0] == master
    snap = await _groups(memory_cluster)
    assert snap.groups_error is None, snap.groups_error
    [g] = [g for g in snap.groups if g.group == GROUP]
    assert g.error is None and g.topics == (TOPIC,) and g.lag == 4, g
