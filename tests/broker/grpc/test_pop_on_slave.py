"""A 5.x client that reaches a slave's gRPC endpoint is served pop by the master (RocketMQ 5's
proxy routes pop to the master: broker/grpc/master_pop.py); the slave's remoting port refuses
pop with SERVICE_NOT_AVAILABLE; with the master gone the slave answers an error status, never
messages it could not record."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from google.protobuf.duration_pb2 import Duration

from broker.config import BrokerConfig
from broker.pop.service import PopMessageService
from broker.service import BrokerHandle, run_broker
from broker.store import MessageStoreConfig, run_memory_store
from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import service_pb2 as spb
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from namesrv.config import NamesrvConfig
from namesrv.service import run_namesrv
from tests.broker.grpc.support import GrpcClient, create_topic, run_sync
from tests.broker.grpc.test_messaging_service import message

pytestmark = pytest.mark.timeout(120)


async def start(
    nursery: trio.Nursery, root: Path, ns: str, scope: trio.CancelScope, **kw: Any
) -> BrokerHandle:
    """A broker of ``broker-a`` that runs until ``scope`` is cancelled."""
    role = "SLAVE" if kw.get("broker_id") else "ASYNC_MASTER"
    config = BrokerConfig(
        listen_port=0,
        broker_name="broker-a",
        namesrv_addr=ns,
        store=MessageStoreConfig(store_path_root_dir=str(root), broker_role=role),
        **kw,
    )

    async def run(task_status: trio.TaskStatus[BrokerHandle]) -> None:
        with scope:
            await run_broker(config, store_factory=run_memory_store, task_status=task_status)

    handle: BrokerHandle = await nursery.start(run)
    return handle


def receive_request(**kw: Any) -> spb.ReceiveMessageRequest:
    return spb.ReceiveMessageRequest(
        group=pb.Resource(name="G"),
        message_queue=pb.MessageQueue(
            topic=pb.Resource(name="Pop"), id=-1, broker=pb.Broker(name="broker-a")
        ),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        invisible_duration=Duration(seconds=20),
        long_polling_timeout=Duration(seconds=1),
        **kw,
    )


def ack_request(m: pb.Message, handle: str = "") -> spb.AckMessageRequest:
    return spb.AckMessageRequest(
        group=pb.Resource(name="G"),
        topic=pb.Resource(name="Pop"),
        entries=[
            spb.AckMessageEntry(
                message_id=m.system_properties.message_id,
                receipt_handle=handle or m.system_properties.receipt_handle,
            )
        ],
    )


async def test_receive_at_a_slave_is_served_by_the_master(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        ns = await nursery.start(
            run_namesrv, NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kv.json"))
        )
        ns_addr = f"127.0.0.1:{ns.port}"
        master_scope = trio.CancelScope()
        master = await start(nursery, tmp_path / "m", ns_addr, master_scope)
        slave = await start(nursery, tmp_path / "s", ns_addr, trio.CancelScope(), broker_id=1)
        await create_topic(master, "Pop", queues=2)
        registrar = slave.controller.registrar
        assert registrar is not None
        with trio.fail_after(20):
            while registrar.master_addr != master.addr:  # noqa: ASYNC110 - the registration
                await trio.sleep(0.1)
        to_master = GrpcClient(f"127.0.0.1:{master.grpc_port}")
        to_slave = GrpcClient(f"127.0.0.1:{slave.grpc_port}")
        try:
            for i in range(2):
                req = spb.SendMessageRequest(messages=[message("Pop", b"m%d" % i, f"01S{i}")])
                sent = await run_sync(partial(to_master.unary, "SendMessage", req))
                assert sent.status.code == pb.OK

            # received at the slave, popped on the master: its checkpoint holds them
            answers = await run_sync(partial(to_slave.receive, receive_request(batch_size=2)))
            assert answers[0].status.code == pb.OK, answers[0].status
            got = sorted(
                (a.message for a in answers if a.HasField("message")), key=lambda m: m.body
            )
            assert [(m.body, m.system_properties.delivery_attempt) for m in got] == [
                (b"m0", 1), (b"m1", 1)
            ]  # fmt: skip
            mpop = master.controller.pop
            assert isinstance(mpop, PopMessageService)
            assert mpop.inflight("G", "Pop") == 2
            assert "POP_CK" not in got[0].user_properties
            # ack and change invisible time at the slave: done on the master
            acked = await run_sync(partial(to_slave.unary, "AckMessage", ack_request(got[0])))
            assert acked.entries[0].status.code == pb.OK, acked
            change = spb.ChangeInvisibleDurationRequest(
                group=pb.Resource(name="G"),
                topic=pb.Resource(name="Pop"),
                receipt_handle=got[1].system_properties.receipt_handle,
                invisible_duration=Duration(seconds=0),
                message_id=got[1].system_properties.message_id,
            )
            changed = await run_sync(partial(to_slave.unary, "ChangeInvisibleDuration", change))
            assert changed.status.code == pb.OK and changed.receipt_handle, changed
            assert mpop.inflight("G", "Pop") == 1
            # visible again at once; its second attempt, again through the slave
            with trio.fail_after(30):
                again: list[pb.Message] = []
                while not again:
                    answers = await run_sync(partial(to_slave.receive, receive_request()))
                    again = [a.message for a in answers if a.HasField("message")]
            assert [(m.body, m.system_properties.delivery_attempt) for m in again] == [(b"m1", 2)]
            # the handle the slave passed on acks at the master itself too
            acked = await run_sync(partial(to_master.unary, "AckMessage", ack_request(again[0])))
            assert acked.entries[0].status.code == pb.OK, acked
            assert mpop.inflight("G", "Pop") == 0
            spop = slave.controller.pop
            assert isinstance(spop, PopMessageService) and not spop.table

            # the slave's remoting port refuses pop as a RocketMQ slave's checkpoint write fails
            async with open_remoting_client() as client:
                fields = {
                    "consumerGroup": "G", "topic": "Pop", "queueId": -1, "maxMsgNums": 1,
                    "invisibleTime": 20_000, "pollTime": 0, "bornTime": 0, "initMode": 1,
                    "expType": "TAG", "exp": "*", "order": "false",
                }  # fmt: skip
                r = await client.invoke(
                    slave.addr, RemotingCommand.request(RequestCode.POP_MESSAGE, fields)
                )
                assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE, (r.code, r.remark)

            # the master gone: the slave hands out nothing, it says why
            master_scope.cancel()
            to_master.close()
            await trio.sleep(0.5)
            answers = await run_sync(partial(to_slave.receive, receive_request()))
            assert [a.status.code for a in answers] == [pb.INTERNAL_SERVER_ERROR]
            why = answers[0].status.message
            assert "cannot be reached" in why or "knows no live master" in why, why
            ack = await run_sync(partial(to_slave.unary, "AckMessage", ack_request(again[0])))
            assert ack.entries[0].status.code == pb.INTERNAL_SERVER_ERROR
        finally:
            to_master.close()
            to_slave.close()
        nursery.cancel_scope.cancel()


async def test_a_master_serves_pop_itself(tmp_path: Path) -> None:
    """On a master the wrapper is the local service: nothing is forwarded."""
    async with trio.open_nursery() as nursery:
        ns = await nursery.start(
            run_namesrv, NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kv.json"))
        )
        master = await start(nursery, tmp_path / "m", f"127.0.0.1:{ns.port}", trio.CancelScope())
        await create_topic(master, "Pop", queues=1)
        client = GrpcClient(f"127.0.0.1:{master.grpc_port}")
        try:
            req = spb.SendMessageRequest(messages=[message("Pop", b"x", "01X")])
            assert (await run_sync(partial(client.unary, "SendMessage", req))).status.code == pb.OK
            answers = await run_sync(partial(client.receive, receive_request()))
            assert [a.message.body for a in answers if a.HasField("message")] == [b"x"]
        finally:
            client.close()
        nursery.cancel_scope.cancel()


async def test_a_dledger_follower_forwards_pop_to_the_new_leader(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """After a leader change the old leader (now a follower) serves a stale route's receive
    from the new leader, with the new leader's handles."""
    from broker.grpc.master_pop import MasterPop
    from broker.pop.api import AckStatus, ConsumeInitMode, PopRequest, PopStatus
    from common.message import MessageExtBrokerInner
    from common.model import TopicConfig
    from tests.broker.dledger.test_broker_dledger import eventually, start_group

    group = await start_group(nursery, tmp_path)
    leader = await group.wait_master()
    leader.up.controller.topic_config_manager.update_topic_config(
        TopicConfig(topicName="T", readQueueNums=1, writeQueueNums=1)
    )
    for i in range(2):
        msg = MessageExtBrokerInner(
            topic="T", queue_id=0, body=b"d%d" % i, properties={"UNIQ_KEY": f"D{i}"}
        )
        assert (await leader.up.store.put_message(msg)).ok
    await trio.sleep(6)  # a follower sync round: the topic config reaches the followers
    # the leader steps down (its node leaves the group for a moment, as in a partition)
    old_id = leader.raft.config.self_id
    group.kill(old_id)
    new = await group.wait_master()
    await group.start(old_id)
    old = group.members[old_id]
    await eventually(lambda: old.up.controller.is_slave)
    registrar = old.up.controller.registrar
    assert registrar is not None
    await eventually(lambda: registrar.master_addr == new.up.addr)
    local = old.up.controller.pop
    assert local is not None
    async with open_remoting_client(network=group.network) as client:
        pop = MasterPop(local, old.up.controller, client)
        req = PopRequest(
            group="G", topic="T", max_msgs=2, invisible_time_ms=30_000,
            init_mode=ConsumeInitMode.MIN,
        )  # fmt: skip
        with trio.fail_after(30):
            while True:
                r = await pop.pop(req)
                if r.status is PopStatus.FOUND:
                    break
                await trio.sleep(1)  # the new leader may still be rebuilding
        assert [p.msg.body for p in r.messages] == [b"d0", b"d1"]
        assert pop.forwarded >= 1
        npop = new.up.controller.pop
        assert isinstance(npop, PopMessageService) and npop.inflight("G", "T") == 2
        for p in r.messages:
            assert (await pop.ack("G", "T", p.receipt_handle)).status is AckStatus.OK
        assert npop.inflight("G", "T") == 0
