"""Issue 27's acceptance, over the wire: a store in Apache RocketMQ 4.9's DLedger layout (built
byte by byte, tests/broker/dledger/apache_store_fixture.py) opens in place in our broker, a
one-member group: every message is read back by PULL at its queue offset and by
VIEW_MESSAGE_BY_ID at its offset msgId's CommitLog offset; new sends append after it; after a
restart everything reads again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.config import BrokerConfig
from broker.service import run_broker
from broker.store import MessageStoreConfig
from cli.chaos.port_blocks import free_port_block
from cli.chaos.queue_readback import pull_queue
from common.message import decode_records
from common.message_id import decode_offset_msg_id
from common.model import MessageQueue
from common.remoting.client import RemotingClient, open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from namesrv.config import NamesrvConfig
from namesrv.service import run_namesrv
from rmq import Message, Producer
from rmq.producer import SendStatus
from tests.broker.dledger.apache_store_fixture import ApacheDLedgerStore, Sent

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FILE = 16 * 1024
CQ_FILE = 20 * 1000
QUEUES = [("TopicA", 0), ("TopicA", 1), ("TopicB", 0), ("TopicB", 3)]


def broker_config(root: Path, namesrv_port: int, raft_port: int) -> BrokerConfig:
    return BrokerConfig(
        listen_port=0,
        broker_name="broker-a",
        namesrv_addr=f"127.0.0.1:{namesrv_port}",
        store=MessageStoreConfig(
            store_path_root_dir=str(root),
            mapped_file_size_commit_log=FILE,
            mapped_file_size_consume_queue=CQ_FILE,
            enable_dleger_commit_log=True,
            dleger_group="broker-a",
            dleger_peers=f"n0-127.0.0.1:{raft_port}",
            dleger_self_id="n0",
        ),
    )


async def view(client: RemotingClient, addr: str, offset: int) -> bytes:
    r = await client.invoke(
        addr, RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
    )
    assert r.code == ResponseCode.SUCCESS, (offset, r.code, r.remark)
    (msg,) = decode_records(r.body_bytes())
    assert msg.commit_log_offset == offset
    return msg.body


async def read_all(client: RemotingClient, addr: str, sent: list[Sent]) -> None:
    for topic, qid in QUEUES:
        want = [s for s in sent if (s.topic, s.queue_id) == (topic, qid)]
        got = await pull_queue(client, addr, topic, qid)
        assert [(m.queue_offset, m.body, m.msg_id) for m in got] == [
            (s.queue_offset, s.body, s.msg_id) for s in want
        ], (topic, qid)
    for s in sent:
        _host, offset = decode_offset_msg_id(s.msg_id)
        assert await view(client, addr, offset) == s.body


async def master_addr(port: int, namesrv_port: int, client: RemotingClient) -> str:
    """The broker's address once it serves as master and the name server routes to it."""
    addr = f"127.0.0.1:{port}"
    with trio.fail_after(60):
        while True:
            r = await client.invoke(
                f"127.0.0.1:{namesrv_port}",
                RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"}),
            )
            if r.code == ResponseCode.SUCCESS and f'"0":"{addr}"'.encode() in r.body_bytes():
                return addr
            await trio.sleep(0.1)


async def test_an_apache_dledger_store_opens_in_place_in_our_broker(tmp_path: Path) -> None:
    root = tmp_path / "store"
    apache = ApacheDLedgerStore(root, file_size=FILE, cq_file_size=CQ_FILE)
    for i in range(60):
        topic, qid = QUEUES[i % len(QUEUES)]
        apache.send(topic, qid, bytes([65 + i % 26]) * (50 + (i * 131) % 1500), tags=f"t{i % 3}")
        if i == 29:
            apache.new_term()
    apache.close()
    sent: list[Sent] = list(apache.sent)
    raft_port = free_port_block(1)
    async with trio.open_nursery() as nursery, open_remoting_client() as client:
        ns = await nursery.start(
            run_namesrv, NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kv.json"))
        )
        for round_ in range(2):
            async with trio.open_nursery() as inner:
                handle = await inner.start(run_broker, broker_config(root, ns.port, raft_port))
                addr = await master_addr(handle.port, ns.port, client)
                await read_all(client, addr, sent)
                async with Producer(f"in-place-{round_}", f"127.0.0.1:{ns.port}") as producer:
                    for i in range(10):
                        topic, qid = QUEUES[i % len(QUEUES)]
                        body = f"new {round_} {i}".encode()
                        r = await producer.send(
                            Message(topic, body), queue=MessageQueue(topic, "broker-a", qid)
                        )
                        assert r.status is SendStatus.SEND_OK
                        want_q = sum(1 for s in sent if (s.topic, s.queue_id) == (topic, qid))
                        assert r.queue_offset == want_q
                        _host, offset = decode_offset_msg_id(r.offset_msg_id)
                        assert offset > sent[-1].offset  # after the Apache entries
                        sent.append(
                            Sent(topic, qid, want_q, body, offset, 0, r.offset_msg_id, -1, True)
                        )
                await read_all(client, addr, sent)
                inner.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
