"""Message trace of transactional sends through a real nameserver and broker in process: a
traced TransactionProducer writes a Pub of type Trans_Msg_Half for each half message and an
EndTransaction record for each END_TRANSACTION it sends (after the local transaction and
after the broker's check-back), as RocketMQ 4.9's SendMessageTraceHookImpl and
EndTransactionTraceHookImpl do; `rmq message trace` shows the transaction's end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio

from cli.admin.message_trace import render_trace, trace_doc
from common.message import MessageExt
from rmq import Admin, LocalTransactionState, Message, TransactionProducer
from rmq.trace.encoder import MessageType, TraceContext, TraceType, decode

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster

pytestmark = pytest.mark.timeout(30)

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


@pytest.fixture
def broker_fields() -> dict[str, Any]:
    # the check-back of an undecided half message comes within about 2 s
    return {"transaction_timeout": 1.0, "transaction_check_interval": 1.0}


async def traces_of(
    cluster: InProcessCluster, msg_id: str
) -> list[tuple[MessageExt, TraceContext]]:
    async with Admin(cluster.namesrv, network=cluster.network) as admin:
        found = await admin.query_message_by_key("RMQ_SYS_TRACE_TOPIC", msg_id, 64)
    return [
        (m, c) for m in found for c in decode(m.body.decode()) if c.trace_beans[0].msg_id == msg_id
    ]


def by_type(found: list[tuple[MessageExt, TraceContext]]) -> dict[TraceType, list[TraceContext]]:
    out: dict[TraceType, list[TraceContext]] = {}
    for _, ctx in sorted(found, key=lambda f: f[1].time_stamp):
        out.setdefault(ctx.trace_type, []).append(ctx)
    return out


async def test_commit_rollback_and_check_back_are_traced(
    memory_cluster: InProcessCluster,
    autojump_clock: trio.abc.Clock,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = memory_cluster
    await c.create_topic("Orders", 1)
    checked: list[str] = []

    def execute_local(msg: Message, arg: object) -> LocalTransactionState:
        return {"yes": COMMIT, "no": ROLLBACK, "later": UNKNOW}[str(arg)]

    def check_local(msg: MessageExt) -> LocalTransactionState:
        checked.append(msg.uniq_key or "")
        return COMMIT

    async with TransactionProducer(
        "txg",
        c.namesrv,
        network=c.network,
        execute_local=execute_local,
        check_local=check_local,
        enable_trace=True,
    ) as p:
        committed = await p.send_in_transaction(
            Message("Orders", b"a", tags="TagA", keys="k1"), "yes"
        )
        rolled = await p.send_in_transaction(Message("Orders", b"b", tags="TagB"), "no")
        later = await p.send_in_transaction(Message("Orders", b"c", keys="k3"), "later")
        with trio.fail_after(10):
            while not checked:  # noqa: ASYNC110 (polling a plain list)
                await trio.sleep(0.1)
        await trio.sleep(1)  # the check's END_TRANSACTION reaches the broker
        assert p._send_tracer is not None and p._send_tracer.dispatcher.discarded == 0
    assert checked == [later.msg_id]
    assert sorted(m.body for m in c.messages("Orders", 0)) == [b"a", b"c"]
    broker = c.addr()

    # commit after the local transaction: a half Pub, then one EndTransaction
    found = by_type(await traces_of(c, committed.msg_id))
    assert set(found) == {TraceType.Pub, TraceType.EndTransaction}
    [pub] = found[TraceType.Pub]
    bean = pub.trace_beans[0]
    assert (pub.group_name, bean.topic, bean.tags, bean.keys) == ("txg", "Orders", "TagA", "k1")
    assert bean.msg_type is MessageType.Trans_Msg_Half and pub.success
    assert bean.offset_msg_id == committed.offset_msg_id and bean.store_host == broker
    [end] = found[TraceType.EndTransaction]
    e = end.trace_beans[0]
    assert (end.group_name, end.region_id) == ("txg", "DefaultRegion")
    assert (e.topic, e.msg_id, e.tags, e.keys, e.store_host) == (
        "Orders",
        committed.msg_id,
        "TagA",
        "k1",
        broker,
    )
    assert e.msg_type is MessageType.Trans_msg_Commit  # Java writes it whatever the state
    assert (e.transaction_state, e.transaction_id, e.from_transaction_check) == (
        "COMMIT_MESSAGE",
        committed.msg_id,
        False,
    )
    assert end.time_stamp >= pub.time_stamp

    # rollback: the message had no keys, Java's StringBuilder writes "null"
    found = by_type(await traces_of(c, rolled.msg_id))
    [end] = found[TraceType.EndTransaction]
    e = end.trace_beans[0]
    assert (e.transaction_state, e.from_transaction_check, e.tags, e.keys) == (
        "ROLLBACK_MESSAGE",
        False,
        "TagB",
        "null",
    )

    # unknown, then the broker's check-back answered commit: two EndTransaction records
    found = by_type(await traces_of(c, later.msg_id))
    assert [x.trace_beans[0].msg_type for x in found[TraceType.Pub]] == [MessageType.Trans_Msg_Half]
    ends = [x.trace_beans[0] for x in found[TraceType.EndTransaction]]
    assert [(x.transaction_state, x.from_transaction_check) for x in ends] == [
        ("UNKNOW", False),
        ("COMMIT_MESSAGE", True),
    ]
    checked_end = ends[1]
    assert (checked_end.topic, checked_end.msg_id, checked_end.keys) == (
        "Orders",
        later.msg_id,
        "k3",
    )
    assert checked_end.transaction_id == later.msg_id and checked_end.store_host == broker

    # what `rmq message trace` shows of them
    monkeypatch.setenv("COLUMNS", "200")
    async with Admin(c.namesrv, network=c.network) as admin:
        views = await admin.query_trace(later.msg_id)
        stored = await admin.view_message(later.msg_id, "Orders")
        rolled_views = await admin.query_trace(rolled.msg_id)
    assert [v.trace_type for v in views] == [
        TraceType.Pub,
        TraceType.EndTransaction,
        TraceType.EndTransaction,
    ]
    doc = trace_doc(later.msg_id, "RMQ_SYS_TRACE_TOPIC", views, stored)
    assert doc["sent"][0]["msg_type"] == "Trans_Msg_Half"
    assert [(t["state"], t["from_check"], t["broker_addr"]) for t in doc["transaction"]] == [
        ("UNKNOW", False, broker),
        ("COMMIT_MESSAGE", True, broker),
    ]
    capsys.readouterr()
    render_trace(doc)
    text = capsys.readouterr().out
    lines = text.splitlines()
    unknown = next(line for line in lines if "unknown" in line)
    commit = next(line for line in lines if " commit " in line)
    assert "transaction end" in unknown and "local transaction" in unknown
    assert "transaction end" in commit and "answering the broker's check-back" in commit
    assert "half message" in text and "stored" in text
    assert lines.index(unknown) < lines.index(commit)

    render_trace(trace_doc(rolled.msg_id, "RMQ_SYS_TRACE_TOPIC", rolled_views, None))
    text = capsys.readouterr().out
    assert " rollback " in text and "rolled back: never delivered to consumers" in text
