"""Pop state over a SYNC_MASTER SIGKILL (real processes): the slave holds the pop records but
serves no pop; the master restarted on its own files (its offsets file never written) has the
state back: what was acked stays acked, what was not comes back as its second attempt, and a
handle given out before the kill acks after it. Raw frames as RocketMQ 5's Java client sends."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
import trio

from common.message import decode_records
from common.remoting.client import RemotingClient, open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from tests.integration.test_transaction_failover import wait_serving
from tests.support.wire import send_v2

if TYPE_CHECKING:
    from tests.conftest import ProcessGroup

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

TOPIC = "PopHA"


def pop_req(invisible_ms: int, poll_ms: int = 0) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.POP_MESSAGE,
        {
            "consumerGroup": "PHG",
            "topic": TOPIC,
            "queueId": -1,
            "maxMsgNums": 32,
            "invisibleTime": invisible_ms,
            "pollTime": poll_ms,
            "bornTime": int(time.time() * 1000),
            "initMode": 1,
            "expType": "TAG",
            "exp": "*",
            "order": False,
        },
    )


def ack_req(pop_ck: str) -> RemotingCommand:
    f = pop_ck.split(" ")
    real = f"%RETRY%PHG_{TOPIC}" if f[4] == "1" else TOPIC
    return RemotingCommand.request(
        RequestCode.ACK_MESSAGE,
        {
            "consumerGroup": "PHG",
            "topic": real,
            "queueId": int(f[6]),
            "extraInfo": pop_ck,
            "offset": int(f[7]),
        },
    )


async def runtime(client: RemotingClient, addr: str) -> dict[str, Any]:
    r = await client.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO))
    import json

    return json.loads(r.body_bytes())["table"]


async def test_sync_master_killed_keeps_pop_state(procs: ProcessGroup) -> None:
    ns = procs.namesrv()
    common: dict[str, Any] = {
        "namesrvAddr": ns.addr,
        "brokerClusterName": "PopCluster",
        "reviveInterval": 200,
        "flushConsumerOffsetInterval": 3_600_000,
    }
    master = procs.broker("pop-master", brokerId=0, brokerRole="SYNC_MASTER", **common)
    slave = procs.broker("pop-slave", brokerId=1, brokerRole="SLAVE", **common)
    async with open_remoting_client() as client:
        await wait_serving(client, master)
        await wait_serving(client, slave)
        with trio.fail_after(60):  # SEND_OK once the slave is attached (another topic)
            while (await client.invoke(master.addr, send_v2("PopProbe", 0, b"p"))).code:  # noqa: ASYNC110 - another process
                await trio.sleep(0.2)
        for i in range(4):
            r = await client.invoke(master.addr, send_v2(TOPIC, 0, b"h%d" % i, queues=1))
            assert r.code == ResponseCode.SUCCESS, r.remark
        r = await client.invoke(master.addr, pop_req(3000))
        assert r.code == ResponseCode.SUCCESS, r.remark
        cks = {m.body: m.properties["POP_CK"] for m in decode_records(r.body_bytes())}
        assert sorted(cks) == [b"h0", b"h1", b"h2", b"h3"]
        for body in (b"h0", b"h1"):
            assert (await client.invoke(master.addr, ack_req(cks[body]))).code == 0

        # a SYNC_MASTER answered once the slave held the records: the slave has every byte
        m_max = (await runtime(client, master.addr))["commitLogMaxOffset"]
        with trio.fail_after(10):
            while (await runtime(client, slave.addr))["commitLogMaxOffset"] != m_max:  # noqa: ASYNC110
                await trio.sleep(0.1)
        master.kill()
        procs.nodes.remove(master)
        # the slave does not serve pop
        r = await client.invoke(slave.addr, pop_req(3000))
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE, (r.code, r.remark)

        restarted = procs.broker(
            "pop-master",
            port=master.port,
            storePathRootDir=master.data_dir,
            brokerId=0,
            brokerRole="SYNC_MASTER",
            **common,
        )
        client.close_channel(master.addr)
        await wait_serving(client, restarted)
        # a handle from before the kill acks after it
        assert (await client.invoke(restarted.addr, ack_req(cks[b"h2"]))).code == 0
        got: list[tuple[bytes, int]] = []
        with trio.fail_after(30):
            while not got:
                r = await client.invoke(restarted.addr, pop_req(60_000, poll_ms=2000))
                if r.code == ResponseCode.SUCCESS:
                    got = [(m.body, m.reconsume_times) for m in decode_records(r.body_bytes())]
                else:
                    assert r.code in (ResponseCode.POLLING_TIMEOUT, 14), (r.code, r.remark)
        assert got == [(b"h3", 1)]  # the one never acked, its second delivery; nothing else
        r = await client.invoke(restarted.addr, pop_req(60_000, poll_ms=1500))
        assert r.code == ResponseCode.POLLING_TIMEOUT
