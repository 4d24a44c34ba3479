"""rmq.sync and rmq.aio TransactionProducer: the local transaction runs in the caller's world
(thread / asyncio loop), the broker's check-back reaches check_local there too."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from common.message import MessageExt
from rmq import LocalTransactionState, Message, aio, sync

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster

pytestmark = pytest.mark.timeout(60)

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


@pytest.fixture
def broker_fields() -> dict[str, Any]:
    return {"transaction_timeout": 0.5, "transaction_check_interval": 0.3}


def delivered(cluster: InProcessCluster) -> list[bytes]:
    return cluster.call(lambda: sorted(m.body for m in cluster.messages("TxT", 0)))


def wait_for(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_sync_commit_and_check_back(portal_cluster: InProcessCluster) -> None:
    c = portal_cluster
    c.call(c.create_topic, "TxT", 1)
    threads: list[str] = []
    checked: list[MessageExt] = []

    def execute_local(msg: Message, arg: object) -> LocalTransactionState:
        threads.append(threading.current_thread().name)
        return COMMIT if arg == "now" else UNKNOW

    def check_local(msg: MessageExt) -> LocalTransactionState:
        checked.append(msg)
        return COMMIT

    with sync.TransactionProducer(
        "txg", c.namesrv, network=c.network, execute_local=execute_local, check_local=check_local
    ) as p:
        r = p.send_in_transaction(Message("TxT", b"now"), "now")
        assert r.local_transaction_state is COMMIT
        p.send_in_transaction(Message("TxT", b"later"), "later")
        wait_for(lambda: len(delivered(c)) == 2)
    assert threads == [threading.current_thread().name] * 2
    assert [m.body for m in checked] == [b"later"]
    assert delivered(c) == [b"later", b"now"]


def test_aio_rollback_and_async_check_back(portal_cluster: InProcessCluster) -> None:
    c = portal_cluster
    c.call(c.create_topic, "TxT", 1)
    checked: list[bytes] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def execute_local(msg: Message, arg: object) -> LocalTransactionState:
            assert asyncio.get_running_loop() is loop
            return {"no": ROLLBACK, "ask": UNKNOW}[str(arg)]

        async def check_local(msg: MessageExt) -> LocalTransactionState:
            assert asyncio.get_running_loop() is loop
            checked.append(msg.body)
            return ROLLBACK

        async with aio.TransactionProducer(
            "txg",
            c.namesrv,
            network=c.network,
            execute_local=execute_local,
            check_local=check_local,
        ) as p:
            r = await p.send_in_transaction(Message("TxT", b"no"), "no")
            assert r.local_transaction_state is ROLLBACK
            await p.send_in_transaction(Message("TxT", b"ask"), "ask")
            for _ in range(200):
                if checked:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # a second check would come now if the answer was lost

    asyncio.run(main())
    assert checked == [b"ask"]
    assert delivered(c) == []
