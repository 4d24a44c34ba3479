"""TransactionProducer (rmq/transaction_producer.py) against a broker in process: the local
transaction's outcome decides delivery, and the broker's check-back reaches check_local."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio

from common.message import MessageExt, MessageSysFlag
from common.remoting.codes import RequestCode
from rmq import LocalTransactionState, Message, SendStatus, TransactionProducer

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster

pytestmark = pytest.mark.timeout(60)

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


@pytest.fixture
def broker_fields() -> dict[str, Any]:
    return {"transaction_timeout": 1.0, "transaction_check_interval": 1.0}


def delivered(cluster: InProcessCluster, topic: str) -> list[bytes]:
    return sorted(m.body for qid in range(4) for m in cluster.messages(topic, qid))


async def test_local_outcome_decides(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    c = memory_cluster
    await c.create_topic("Orders", 4)
    seen: list[tuple[bytes, object]] = []

    async def execute_local(msg: Message, arg: object) -> LocalTransactionState:
        seen.append((msg.body, arg))
        return {"yes": COMMIT, "no": ROLLBACK}[str(arg)]

    tap = c.tap()
    async with TransactionProducer("txg", c.namesrv, network=tap, execute_local=execute_local) as p:
        r1 = await p.send_in_transaction(Message("Orders", b"kept"), "yes")
        r2 = await p.send_in_transaction(Message("Orders", b"dropped", delay_level=3), "no")
        assert r1.status is SendStatus.SEND_OK and r1.local_transaction_state is COMMIT
        assert r2.local_transaction_state is ROLLBACK
        await trio.sleep(3)
    assert seen == [(b"kept", "yes"), (b"dropped", "no")]
    assert delivered(c, "Orders") == [b"kept"]
    # on the wire as the Java client sends it
    send = tap.requests(RequestCode.SEND_MESSAGE_V2)[0]
    assert int(send.ext_fields["f"]) & MessageSysFlag.TRANSACTION_PREPARED
    assert "TRAN_MSG\x01true" in send.ext_fields["i"] and "PGROUP\x01txg" in send.ext_fields["i"]
    assert "DELAY" not in tap.requests(RequestCode.SEND_MESSAGE_V2)[1].ext_fields["i"]
    ends = tap.requests(RequestCode.END_TRANSACTION)
    assert [e.ext_fields["commitOrRollback"] for e in ends] == ["8", "12"]
    assert ends[0].ext_fields["fromTransactionCheck"] == "false"


@pytest.mark.parametrize("answer", [COMMIT, ROLLBACK])
async def test_unknown_is_resolved_by_check_local(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock, answer: LocalTransactionState
) -> None:
    c = memory_cluster
    await c.create_topic("Orders", 4)
    checked: list[MessageExt] = []

    def execute_local(msg: Message, arg: object) -> LocalTransactionState:
        raise RuntimeError("db unreachable")  # counts as UNKNOW

    async def check_local(msg: MessageExt) -> LocalTransactionState:
        checked.append(msg)
        return answer

    async with TransactionProducer(
        "txg", c.namesrv, network=c.network, execute_local=execute_local, check_local=check_local
    ) as p:
        r = await p.send_in_transaction(Message("Orders", b"pending", keys="k1"))
        assert r.local_transaction_state is UNKNOW
        await trio.sleep(5)
    assert len(checked) == 1 and checked[0].body == b"pending"
    assert checked[0].topic == "Orders" and checked[0].uniq_key == r.msg_id
    assert delivered(c, "Orders") == ([b"pending"] if answer is COMMIT else [])
