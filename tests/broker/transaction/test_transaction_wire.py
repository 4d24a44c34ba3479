"""Transactions in one broker, spoken to as RocketMQ's Java client speaks (tests/support/
transaction_wire.py): commit, rollback, check-back, check-back to another member, check max,
the END_TRANSACTION checks and a repeated commit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio

from common.message import MessageSysFlag
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.topics import RMQ_SYS_TRANS_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC
from tests.support.transaction_wire import COMMIT, ROLLBACK, UNKNOWN, java_tx_producer

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def broker_fields() -> dict[str, Any]:
    return {
        "transaction_timeout": 1.0,
        "transaction_check_interval": 1.0,
        "transaction_check_max": 3,
    }


async def test_commit_delivers_once_rollback_never(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    c = memory_cluster
    async with java_tx_producer("TXG", "p1", network=c.network) as p:
        await p.heartbeat(c.addr())
        h1 = await p.send_half(c.addr(), "TxT", b"one")
        h2 = await p.send_half(c.addr(), "TxT", b"two")
        assert h1.code == h2.code == ResponseCode.SUCCESS
        assert c.messages("TxT", 0) == []  # invisible until committed
        [half1, half2] = c.messages(RMQ_SYS_TRANS_HALF_TOPIC, 0)
        assert half1.properties["REAL_TOPIC"] == "TxT" and half1.properties["REAL_QID"] == "0"
        assert half1.sys_flag & MessageSysFlag.TRANSACTION_MASK == 0
        await p.end(c.addr(), h1, COMMIT)
        await p.end(c.addr(), h2, ROLLBACK)
        await trio.sleep(0.5)
        [real] = c.messages("TxT", 0)
        assert real.body == b"one" and real.properties["UNIQ_KEY"] == h1.uniq
        assert real.sys_flag & MessageSysFlag.TRANSACTION_MASK == MessageSysFlag.TRANSACTION_COMMIT
        assert real.prepared_transaction_offset == h1.commit_log_offset
        assert "REAL_TOPIC" not in real.properties and "TRAN_MSG" not in real.properties
        # a repeated commit (a retry, a late answer) delivers nothing more
        await p.end(c.addr(), h1, COMMIT)
        await p.end(c.addr(), h2, COMMIT)
        await trio.sleep(5)  # several check rounds: nothing is checked, nothing added
        assert [m.body for m in c.messages("TxT", 0)] == [b"one"]
        assert p.checks == []
        stats = c.broker().controller.transaction_service.stats
        assert (stats.committed, stats.rolled_back, stats.already_ended) == (1, 1, 2)


@pytest.mark.parametrize("answer", [COMMIT, ROLLBACK])
async def test_unknown_is_checked_back(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock, answer: int
) -> None:
    c = memory_cluster
    async with java_tx_producer("TXG", "p1", network=c.network) as p:
        p.answer = lambda m: answer
        await p.heartbeat(c.addr())
        h = await p.send_half(c.addr(), "TxT", b"later")
        await p.end(c.addr(), h, UNKNOWN)
        with trio.fail_after(10):
            await p.check_arrived.wait()
        fields, msg = p.checks[0]
        # the check names the copy re-put for it, and its body is the message as sent
        assert msg.topic == "TxT" and msg.body == b"later" and msg.queue_id == 0
        assert fields["msgId"] == fields["transactionId"] == h.uniq
        assert int(fields["tranStateTableOffset"]) > h.queue_offset
        assert msg.properties["TRANSACTION_CHECK_TIMES"] == "1"
        await trio.sleep(5)
        bodies = [m.body for m in c.messages("TxT", 0)]
        assert bodies == ([b"later"] if answer == COMMIT else [])
        assert len(p.checks) == 1  # answered: never asked again


async def test_check_goes_to_another_member_when_the_producer_left(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    c = memory_cluster
    async with java_tx_producer("TXG", "p2", network=c.network) as other:
        other.answer = lambda m: COMMIT
        await other.heartbeat(c.addr())
        async with java_tx_producer("TXG", "p1", network=c.network) as p:
            await p.heartbeat(c.addr())
            h = await p.send_half(c.addr(), "TxT", b"orphan")
        # p1's connection is closed: the broker forgets it at once
        with trio.fail_after(10):
            await other.check_arrived.wait()
        await trio.sleep(1)
        assert [m.body for m in c.messages("TxT", 0)] == [b"orphan"]
        assert other.checks[0][1].properties["UNIQ_KEY"] == h.uniq


async def test_check_max_moves_the_message_aside(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    c = memory_cluster
    async with java_tx_producer("TXG", "p1", network=c.network) as p:
        p.answer = lambda m: UNKNOWN
        await p.heartbeat(c.addr())
        h = await p.send_half(c.addr(), "TxT", b"undecided")
        await trio.sleep(12)
        assert len(p.checks) == 3  # transactionCheckMax
        [aside] = c.messages(TRANS_CHECK_MAX_TIME_TOPIC, 0)
        assert aside.properties["UNIQ_KEY"] == h.uniq
        assert c.messages("TxT", 0) == []
        # a commit after it was given up on delivers nothing (and the broker stays up)
        await p.end(c.addr(), h, COMMIT)
        await trio.sleep(3)
        assert c.messages("TxT", 0) == [] and len(p.checks) == 3
        tc = c.broker().controller.topic_config_manager.select_topic_config(
            TRANS_CHECK_MAX_TIME_TOPIC
        )
        assert tc is not None and tc.readQueueNums == 1


async def test_end_transaction_checks_answer_rocketmq_codes(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    c = memory_cluster
    async with java_tx_producer("TXG", "p1", network=c.network) as p:
        h = await p.send_half(c.addr(), "TxT", b"x")

        async def end(**change: Any) -> tuple[int, str | None]:
            req = p.end_request(h, COMMIT)
            req.flag = 0  # ask for the answer (a two-way END_TRANSACTION)
            req.ext_fields.update({k: str(v) for k, v in change.items()})
            r = await p.client.invoke(c.addr(), req)
            return r.code, r.remark

        err = ResponseCode.SYSTEM_ERROR
        assert await end(producerGroup="OTHER") == (err, "The producer group wrong")
        assert await end(tranStateTableOffset=h.queue_offset + 7) == (
            err,
            "The transaction state table offset wrong",
        )
        assert await end(commitLogOffset=h.commit_log_offset + 1) == (
            err,
            "Find prepared transaction message failed",
        )
        # an offset of a record that is no half message ends nothing
        sent = await p.client.invoke(c.addr(), _plain_send("TxT"))
        from common.message_id import decode_offset_msg_id

        _, plain = decode_offset_msg_id(sent.ext_fields["msgId"])
        assert await end(commitLogOffset=plain) == (err, "Find prepared transaction message failed")
        r = await p.client.invoke(c.addr(), _bad_end())
        assert r.code == ResponseCode.SYSTEM_ERROR and "tranStateTableOffset" in (r.remark or "")
        assert [m.body for m in c.messages("TxT", 0)] == [b"plain"]
        assert await end() == (ResponseCode.SUCCESS, None)
        assert [m.body for m in c.messages("TxT", 0)] == [b"plain", b"x"]


def _plain_send(topic: str) -> RemotingCommand:
    from tests.support.wire import send_v2

    return send_v2(topic, 0, b"plain", group="TXG")


def _bad_end() -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.END_TRANSACTION, {"producerGroup": "TXG", "commitLogOffset": "x"}
    )


async def test_refused_when_the_broker_rejects_transactions(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    c = memory_cluster
    await c.stop_broker("broker-a")
    await c.start_broker(reject_transaction_message=True)
    async with java_tx_producer("TXG", "p1", network=c.network) as p:
        h = await p.send_half(c.addr(), "TxT", b"x")
        assert h.code == ResponseCode.NO_PERMISSION


async def test_a_batch_of_transactional_messages_is_refused(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    from common.batch_body import encode_batch_body
    from tests.support.wire import send_v2

    c = memory_cluster
    body = encode_batch_body([(0, b"a", {"TRAN_MSG": "true", "PGROUP": "TXG"})])
    req = send_v2("TxT", 0, body, group="TXG")
    req.code = RequestCode.SEND_BATCH_MESSAGE
    req.ext_fields["m"] = "true"
    async with open_remoting_client(network=c.network) as client:
        r = await client.invoke(c.addr(), req)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL
    assert c.messages("TxT", 0) == [] and c.messages(RMQ_SYS_TRANS_HALF_TOPIC, 0) == []


async def test_end_transaction_on_a_slave(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    c = memory_cluster
    await c.start_broker("broker-a-s", broker_id=1, store={"broker_role": "SLAVE"})
    async with open_remoting_client(network=c.network) as client:
        req = RemotingCommand.request(
            RequestCode.END_TRANSACTION,
            {
                "producerGroup": "TXG",
                "tranStateTableOffset": "0",
                "commitLogOffset": "0",
                "commitOrRollback": "8",
            },
        )
        r = await client.invoke(c.addr("broker-a-s"), req)
        assert r.code == ResponseCode.SLAVE_NOT_AVAILABLE


async def test_immunity_time_delays_the_first_check(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    c = memory_cluster
    async with java_tx_producer("TXG", "p1", network=c.network) as p:
        p.answer = lambda m: COMMIT
        await p.heartbeat(c.addr())
        started = trio.current_time()
        await p.send_half(c.addr(), "TxT", b"slow", props={"CHECK_IMMUNITY_TIME_IN_SECONDS": "8"})
        with trio.fail_after(20):
            await p.check_arrived.wait()
        assert trio.current_time() - started >= 8  # not at transactionTimeOut (1 s)
        await trio.sleep(2)
        assert [m.body for m in c.messages("TxT", 0)] == [b"slow"] and len(p.checks) == 1


async def test_commit_already_in_its_topic_is_not_delivered_again(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    """The crash window: the real message was put, the master died before the op.  The check
    finds the committed message and writes the op instead of asking (or delivering) again."""
    from broker.transaction.bridge import end_message_inner

    c = memory_cluster
    store = c.broker().store
    async with java_tx_producer("TXG", "p1", network=c.network) as p:
        p.answer = lambda m: COMMIT
        await p.heartbeat(c.addr())
        h = await p.send_half(c.addr(), "TxT", b"once")
        half = store.look_message_by_offset(h.commit_log_offset)
        assert half is not None
        inner = end_message_inner(half, h.commit_log_offset)
        assert inner is not None
        assert (await store.put_message(inner)).ok  # ... and no op: the "crash"
        await trio.sleep(5)
        assert [m.body for m in c.messages("TxT", 0)] == [b"once"]
        assert p.checks == []
        assert c.broker().controller.transaction_service.stats.repaired == 1
        await p.end(c.addr(), h, COMMIT)  # a late commit of it: nothing more
        await trio.sleep(1)
        assert [m.body for m in c.messages("TxT", 0)] == [b"once"]


@pytest.mark.parametrize("offset", ["-5", "1", "99999999999", "123", str(2**70)])
async def test_end_transaction_at_any_offset_is_refused_and_the_broker_stays_up(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock, offset: str
) -> None:
    c = memory_cluster
    async with java_tx_producer("TXG", "p1", network=c.network) as p:
        h = await p.send_half(c.addr(), "TxT", b"x")
        req = p.end_request(h, COMMIT)
        req.flag = 0
        req.ext_fields["commitLogOffset"] = offset
        r = await p.client.invoke(c.addr(), req)
        # (inside the half record, before the log, past its end)
        assert (r.code, r.remark) == (
            ResponseCode.SYSTEM_ERROR,
            "Find prepared transaction message failed",
        )
        req.ext_fields["commitLogOffset"] = str(h.commit_log_offset)
        assert (await p.client.invoke(c.addr(), req)).code == ResponseCode.SUCCESS
