"""`rmq message trace`: the timeline of a message sent and consumed by traced clients, read
through typer's CliRunner from servers on real loopback TCP (rmq.sync clients on the portal)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

from cli.admin.message_trace import trace_doc
from cli.main import app
from common.message import MessageExt
from rmq import ConsumeFromWhere, LocalTransactionState, Message, sync
from rmq.trace.encoder import TraceType
from rmq.trace.view import TraceView

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster

pytestmark = pytest.mark.timeout(60)

runner = CliRunner()


@pytest.fixture
def broker_fields() -> dict[str, Any]:
    # an undecided half message is checked back within about 2 s
    return {"transaction_timeout": 1.0, "transaction_check_interval": 1.0}


def test_trace_timeline_sent_stored_consumed(portal_tcp_cluster: InProcessCluster) -> None:
    cluster = portal_tcp_cluster
    cluster.call(cluster.create_topic, "TraceT", 1)
    with sync.Producer("trace-pg", cluster.namesrv, enable_trace=True) as p:
        sent = p.send(Message("TraceT", b"hi", tags="A", keys="k-1"))
    got: list[MessageExt] = []
    c = sync.PushConsumer(
        "trace-cg",
        cluster.namesrv,
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
        enable_trace=True,
    )
    c.subscribe("TraceT")
    c.register_listener(got.extend)
    with c:
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
    assert got  # closing the consumer flushed its traces

    result = runner.invoke(app, ["-n", cluster.namesrv, "message", "trace", sent.msg_id, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    [pub] = doc["sent"]
    assert (pub["group"], pub["status"], pub["topic"], pub["tags"], pub["keys"]) == (
        "trace-pg",
        "success",
        "TraceT",
        "A",
        "k-1",
    )
    assert pub["broker_addr"] == cluster.addr() and pub["offset_msg_id"] == sent.offset_msg_id
    stored = doc["stored"]
    assert (stored["topic"], stored["queue_id"], stored["queue_offset"]) == ("TraceT", 0, 0)
    assert stored["broker_addr"] == cluster.addr() and stored["store_timestamp_ms"] > 0
    [consumed] = doc["consumed"]
    assert (consumed["group"], consumed["status"], consumed["attempt"]) == (
        "trace-cg",
        "success",
        1,
    )
    assert consumed["return_type"] == "SUCCESS" and consumed["client_host"].startswith("127.0.0.1:")

    text = runner.invoke(app, ["-n", cluster.namesrv, "message", "trace", sent.msg_id])
    assert text.exit_code == 0, text.output
    for word in ("sent", "stored", "consumed", "trace-pg", "trace-cg", "success"):
        assert word in text.stdout

    missing = runner.invoke(
        app, ["-n", cluster.namesrv, "message", "trace", "0A0B0C0D0000000000000000000000FF"]
    )
    assert missing.exit_code == 1 and missing.stderr.startswith("error: no trace of")
    other = runner.invoke(
        app, ["-n", cluster.namesrv, "message", "trace", sent.msg_id, "--trace-topic", "Nope"]
    )
    assert other.exit_code == 1 and "in Nope" in other.stderr


def test_trace_timeline_of_a_transaction_checked_back(
    portal_tcp_cluster: InProcessCluster,
) -> None:
    cluster = portal_tcp_cluster
    cluster.call(cluster.create_topic, "TxT", 1)
    checked: list[MessageExt] = []

    def check_local(msg: MessageExt) -> LocalTransactionState:
        checked.append(msg)
        return LocalTransactionState.COMMIT_MESSAGE

    with sync.TransactionProducer(
        "trace-txg",
        cluster.namesrv,
        execute_local=lambda msg, arg: LocalTransactionState.UNKNOW,
        check_local=check_local,
        enable_trace=True,
    ) as p:
        sent = p.send_in_transaction(Message("TxT", b"hi", keys="order-7"))
        deadline = time.monotonic() + 20
        while not cluster.call(cluster.messages, "TxT", 0) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(checked) == 1  # closing the producer flushed its traces

    result = runner.invoke(app, ["-n", cluster.namesrv, "message", "trace", sent.msg_id, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    [pub] = doc["sent"]
    assert (pub["group"], pub["msg_type"], pub["keys"], pub["tags"]) == (
        "trace-txg",
        "Trans_Msg_Half",
        "order-7",
        None,
    )
    assert [(t["state"], t["from_check"], t["group"]) for t in doc["transaction"]] == [
        ("UNKNOW", False, "trace-txg"),
        ("COMMIT_MESSAGE", True, "trace-txg"),
    ]
    assert {t["broker_addr"] for t in doc["transaction"]} == {cluster.addr()}
    assert doc["transaction"][1]["transaction_id"] == sent.msg_id
    assert doc["stored"]["topic"] == "TxT"  # the committed message

    text = runner.invoke(app, ["-n", cluster.namesrv, "message", "trace", sent.msg_id])
    assert text.exit_code == 0, text.output
    for word in ("half message", "transaction end", "unknown", "commit", "check-back", "stored"):
        assert word in text.stdout, text.stdout


def view(kind: TraceType, t: int, **kw: object) -> TraceView:
    fields: dict[str, object] = dict(
        trace_type=kind,
        time_stamp=t,
        group="g",
        client_host="10.0.0.2:1",
        cost_time=3,
        success=True,
        msg_id="M",
        topic="",
        tags="",
        keys="",
        store_host="",
        offset_msg_id="",
        retry_times=0,
        request_id="R1",
        context_code=0,
        region_id="",
        trace_message_id="X",
    )
    fields.update(kw)
    return TraceView(**fields)  # type: ignore[arg-type]


def test_consumptions_pair_by_request_id() -> None:
    views = [
        view(TraceType.SubBefore, 10, request_id="R1"),
        view(TraceType.SubBefore, 20, request_id="R2", retry_times=1),
        view(TraceType.SubAfter, 15, request_id="R1", success=False, context_code=2),
        view(TraceType.SubAfter, 40, request_id="R3", group="other"),  # its SubBefore was lost
    ]
    doc = trace_doc("M", "RMQ_SYS_TRACE_TOPIC", views, None)
    assert doc["sent"] == [] and doc["stored"] is None
    assert [(c["status"], c["attempt"], c["return_type"]) for c in doc["consumed"]] == [
        ("failed", 1, "EXCEPTION"),
        ("running", 2, None),
        ("success", None, "SUCCESS"),
    ]
