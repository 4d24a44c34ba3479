"""`rmq message trace MSG_ID`: a message's timeline from the trace topic (the message-trace
view of RocketMQ's dashboard, from what traced clients wrote: rmq/trace/).

The records are grouped into what a person asks about a message: who sent it (the ``Pub``
records: producer group, client, time to the broker's answer, status; a transaction's half
message says so), how its transaction ended (each ``EndTransaction`` record: commit, rollback
or unknown, and whether it answered the broker's check-back or came straight from the local
transaction), where it is stored (the message itself, looked up by its msgId in the topic the
Pub names: broker, queue, offset, store time), and who consumed it (each ``SubBefore`` with the ``SubAfter`` of the same listener
call: group, client, attempt, status, time in the listener).  A consumption whose SubAfter is
missing is shown as ``running`` (the listener has not returned, or its trace was dropped).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.admin.options import JsonOpt, open_admin
from cli.admin.render import _json, _table, iso_ms
from cli.app import _run, examples
from cli.errors import CliError
from cli.render import _console, _line

if TYPE_CHECKING:
    from common.message import MessageExt
    from rmq.trace.view import TraceView

# ConsumeReturnType by ordinal (a SubAfter's contextCode)
_RETURN_TYPES = ["SUCCESS", "TIME_OUT", "EXCEPTION", "RETURNNULL", "FAILED"]
# an EndTransaction's LocalTransactionState, as the timeline's status says it
_END_STATES = {"COMMIT_MESSAGE": "commit", "ROLLBACK_MESSAGE": "rollback", "UNKNOW": "unknown"}


def _given(value: str) -> str | None:
    # Java's encoder writes a message without tags or keys as "null"
    return value if value not in ("", "null") else None


def _when(ms: int) -> dict[str, Any]:
    return {"time_ms": ms, "time": iso_ms(ms)}


def trace_doc(
    msg_id: str, topic: str, views: list[TraceView], stored: MessageExt | None
) -> dict[str, Any]:
    """The JSON document of the command (and what the table shows)."""
    from rmq.trace.encoder import TraceType

    sent = [
        {
            **_when(v.time_stamp),
            "group": v.group,
            "client_host": v.client_host,
            "cost_ms": v.cost_time,
            "status": v.status,
            "topic": v.topic,
            "tags": _given(v.tags),
            "keys": _given(v.keys),
            "broker_addr": v.store_host,
            "offset_msg_id": v.offset_msg_id or None,
            "msg_type": v.msg_type.name if v.msg_type is not None else None,
        }
        for v in views
        if v.trace_type is TraceType.Pub
    ]
    ended = [
        {
            **_when(v.time_stamp),
            "group": v.group,
            "client_host": v.client_host,
            "state": v.transaction_state,
            "from_check": v.from_transaction_check,
            "broker_addr": v.store_host,
            "transaction_id": v.transaction_id or None,
        }
        for v in views
        if v.trace_type is TraceType.EndTransaction
    ]
    after = {v.request_id: v for v in views if v.trace_type is TraceType.SubAfter}
    consumed = []
    for v in views:
        if v.trace_type is not TraceType.SubBefore:
            continue
        done = after.pop(v.request_id, None)
        consumed.append(_consumption(v, done))
    consumed.extend(_consumption(None, done) for done in after.values())  # SubBefore lost
    doc: dict[str, Any] = {
        "msg_id": msg_id,
        "trace_topic": topic,
        "sent": sent,
        "transaction": ended,
        "stored": None,
        "consumed": consumed,
    }
    if stored is not None:
        doc["stored"] = {
            "topic": stored.topic,
            "broker_addr": f"{stored.store_host[0]}:{stored.store_host[1]}",
            "queue_id": stored.queue_id,
            "queue_offset": stored.queue_offset,
            "store_timestamp_ms": stored.store_timestamp,
            "store_timestamp": iso_ms(stored.store_timestamp),
            "offset_msg_id": stored.msg_id,
        }
    return doc


def _consumption(before: TraceView | None, after: TraceView | None) -> dict[str, Any]:
    first = before or after
    assert first is not None
    out: dict[str, Any] = {
        **_when(before.time_stamp if before else 0),
        "group": first.group,
        "client_host": first.client_host,
        "attempt": before.retry_times + 1 if before else None,
        "status": after.status if after else "running",
        "cost_ms": after.cost_time if after else None,
        "return_type": None,
    }
    if after is not None and 0 <= after.context_code < len(_RETURN_TYPES):
        out["return_type"] = _RETURN_TYPES[after.context_code]
    return out


def render_trace(doc: dict[str, Any], *, as_json: bool = False) -> None:
    if as_json:
        _json(doc)
        return
    rows: list[tuple[int, list[object]]] = []
    for s in doc["sent"]:
        detail = f"topic {s['topic']} to {s['broker_addr']}"
        if s["tags"]:
            detail += f" tags {s['tags']}"
        if s["keys"]:
            detail += f" keys {s['keys']}"
        if s.get("msg_type") == "Trans_Msg_Half":
            detail = f"half message, {detail}"
        rows.append(
            (
                s["time_ms"],
                [
                    s["time"],
                    "sent",
                    s["group"],
                    s["client_host"],
                    s["status"],
                    s["cost_ms"],
                    detail,
                ],
            )
        )
    for t in doc.get("transaction", ()):
        how = "answering the broker's check-back" if t["from_check"] else "local transaction"
        rows.append(
            (
                t["time_ms"],
                [
                    t["time"],
                    "transaction end",
                    t["group"],
                    t["client_host"],
                    _END_STATES.get(t["state"], t["state"]),
                    "",
                    f"{how}, to {t['broker_addr']}",
                ],
            )
        )
    st = doc["stored"]
    if st is not None:
        detail = f"{st['topic']} queue {st['queue_id']} offset {st['queue_offset']} at {st['broker_addr']}"
        rows.append(
            (st["store_timestamp_ms"], [st["store_timestamp"], "stored", "", "", "", "", detail])
        )
    for c in doc["consumed"]:
        attempt = f"attempt {c['attempt']}" if c["attempt"] else ""
        how = c["return_type"] if c["return_type"] not in (None, "SUCCESS") else ""
        rows.append(
            (
                c["time_ms"],
                [
                    c["time"] or "-",
                    "consumed",
                    c["group"],
                    c["client_host"],
                    c["status"],
                    "" if c["cost_ms"] is None else c["cost_ms"],
                    " ".join(x for x in (attempt, how) if x),
                ],
            )
        )
    rows.sort(key=lambda r: r[0])
    columns = ["time", "event", "group", "client", "status", "cost ms", "detail"]
    _console(min_width=140).print(
        _table(f"trace of {doc['msg_id']} ({doc['trace_topic']})", columns, [r for _, r in rows])
    )
    ends = doc.get("transaction") or []
    if not doc["consumed"] and ends and ends[-1]["state"] == "ROLLBACK_MESSAGE":
        _line("rolled back: never delivered to consumers")
    elif not doc["consumed"]:
        _line("not consumed by a traced consumer yet")


@examples(
    "rmq message trace 7F0000017D4A18B4AAC2667EDC7A0000",
    "rmq message trace 7F0000017D4A18B4AAC2667EDC7A0000 --trace-topic MyTrace --json",
)
def message_trace(
    ctx: typer.Context,
    msg_id: Annotated[
        str, typer.Argument(help="The message's msgId (its UNIQ_KEY, as a send result shows).")
    ],
    trace_topic: Annotated[
        str | None,
        typer.Option("--trace-topic", help="Trace topic the clients write to."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a message's timeline: sent (group, client, cost, status), a transaction's end
    (commit / rollback / unknown, from the local transaction or a check-back), stored (broker,
    queue, offset), consumed (group, client, attempt, status, cost).

    Reads what traced clients wrote (ours with enable_trace=True, Java ones with
    enableMsgTrace) to RMQ_SYS_TRACE_TOPIC, or --trace-topic.
    """
    from common.topics import RMQ_SYS_TRACE_TOPIC

    topic = trace_topic or RMQ_SYS_TRACE_TOPIC

    async def main() -> tuple[list[TraceView], MessageExt | None]:
        from common.errors import RmqError
        from rmq.trace.encoder import TraceType

        async with open_admin(ctx) as admin:
            views = await admin.query_trace(msg_id, topic)
            if not views:
                raise CliError(
                    f"no trace of {msg_id} in {topic} (were the clients started with tracing "
                    "on, and the trace topic written to by this cluster?)"
                )
            stored = None
            pub_topic = next(
                (v.topic for v in views if v.trace_type is TraceType.Pub and v.topic), None
            )
            if pub_topic:
                try:
                    stored = await admin.view_message(msg_id, pub_topic)
                except RmqError:
                    stored = None  # gone (expired, topic deleted): the trace still tells
            return views, stored

    views, stored = _run(main)
    render_trace(trace_doc(msg_id, topic, views, stored), as_json=as_json)
