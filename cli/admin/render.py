"""What the mqadmin-style commands print: rich tables for people, one JSON document for scripts.

Every `*_doc` function turns a model into the JSON document of its command (plain dicts with
stable snake_case keys; times both as epoch milliseconds and ISO-8601 UTC), and the matching
renderer prints either that document (`as_json=True`) or tables. Keeping the document as the
single source means the table and the JSON can never disagree about a number.

Nothing here talks to the network; consoles are made per call (see `cli/render.py`) so
typer's CliRunner captures the output.
"""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from cli.render import _console, _line, rate

if TYPE_CHECKING:
    from rich.table import Table

    from cli.runtime_info.status import BrokerStatus
    from common.message import MessageExt
    from common.model import TopicRouteData
    from rmq.admin_api import ConsumerConnection, ConsumeStats, QueueStats


def _json(doc: dict[str, Any]) -> None:
    _line(json.dumps(doc, indent=2, sort_keys=False, ensure_ascii=False))


def iso_ms(ms: int) -> str | None:
    """ISO-8601 UTC of epoch milliseconds; None for 0/negative (never happened)."""
    if ms <= 0:
        return None
    dt = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _time(ms: int) -> str:
    return iso_ms(ms) or "-"


def _table(
    title: str, columns: Iterable[str], rows: Iterable[Iterable[object]], **kw: Any
) -> Table:
    from rich.table import Table

    table = Table(title=title, **kw)
    for col in columns:
        table.add_column(col, justify="right" if col in _NUMERIC else "left")
    for row in rows:
        table.add_row(*(str(v) for v in row))
    return table


_NUMERIC = {
    "queue",
    "min offset",
    "max offset",
    "messages",
    "broker offset",
    "consumer offset",
    "lag",
    "read",
    "write",
    "id",
}


# --- broker -------------------------------------------------------------------------------


def broker_runtime(addr: str, table: dict[str, str], *, as_json: bool = False) -> None:
    doc = {"addr": addr, "runtime": dict(sorted(table.items()))}
    if as_json:
        _json(doc)
        return
    _console(min_width=100).print(_table(f"broker {addr}", ("key", "value"), sorted(table.items())))


# --- topics -------------------------------------------------------------------------------


def topic_changed(action: str, topic: str, addrs: list[str], *, as_json: bool = False) -> None:
    if as_json:
        _json({"topic": topic, "action": action, "brokers": addrs})
        return
    for addr in addrs:
        _line(f"{action} topic {topic} on {addr}")
    if action == "deleted":
        _line(f"deleted topic {topic} from the nameserver")


def topic_deleted(
    topic: str, addrs: list[str], groups: list[str], without: list[str], *, as_json: bool = False
) -> None:
    """`rmq topic delete`: where it was deleted, whose offsets went with it (`groups`), and
    which of those groups have no offset left anywhere (`without`)."""
    if as_json:
        _json(
            {
                "topic": topic,
                "action": "deleted",
                "brokers": addrs,
                "offsets_deleted_for_groups": groups,
                "groups_without_offsets": without,
            }
        )
        return
    topic_changed("deleted", topic, addrs)
    if groups:
        _line(f"deleted the offsets of group(s) {', '.join(groups)} on {topic}")
    if without:
        _line(
            f"group(s) {', '.join(without)} have no offsets left: `rmq group list` shows "
            "them as (no offsets); their next consumer starts as a new group"
        )


def topic_list_doc(topics: list[str]) -> dict[str, Any]:
    return {"topics": sorted(topics)}


def topic_list(topics: list[str], *, as_json: bool = False) -> None:
    if as_json:
        _json(topic_list_doc(topics))
        return
    for topic in sorted(topics):
        _line(topic)


def topic_route_doc(topic: str, route: TopicRouteData) -> dict[str, Any]:
    from common.model import PermName

    return {
        "topic": topic,
        "brokers": [
            {"broker": bd.brokerName, "cluster": bd.cluster, "id": bid, "addr": addr}
            for bd in sorted(route.brokerDatas, key=lambda b: b.brokerName)
            for bid, addr in sorted(bd.brokerAddrs.items())
        ],
        "queues": [
            {
                "broker": qd.brokerName,
                "read": qd.readQueueNums,
                "write": qd.writeQueueNums,
                "perm": qd.perm,
                "perm_text": PermName.to_string(qd.perm),
            }
            for qd in sorted(route.queueDatas, key=lambda q: q.brokerName)
        ],
    }


def topic_route(topic: str, route: TopicRouteData, *, as_json: bool = False) -> None:
    doc = topic_route_doc(topic, route)
    if as_json:
        _json(doc)
        return
    console = _console(min_width=100)
    console.print(
        _table(
            f"brokers of {topic}",
            ("broker", "cluster", "id", "address"),
            ((b["broker"], b["cluster"], b["id"], b["addr"]) for b in doc["brokers"]),
        )
    )
    console.print(
        _table(
            f"queues of {topic}",
            ("broker", "read", "write", "perm"),
            ((q["broker"], q["read"], q["write"], q["perm_text"]) for q in doc["queues"]),
        )
    )


def topic_status_doc(topic: str, stats: list[QueueStats]) -> dict[str, Any]:
    queues = [
        {
            "broker": q.queue.brokerName,
            "queue": q.queue.queueId,
            "min_offset": q.min_offset,
            "max_offset": q.max_offset,
            "messages": q.count,
            "last_update_ms": q.last_update_timestamp,
            "last_update": iso_ms(q.last_update_timestamp),
        }
        for q in stats
    ]
    last = max((q.last_update_timestamp for q in stats), default=0)
    return {
        "topic": topic,
        "queues": queues,
        "total": {
            "messages": sum(q.count for q in stats),
            "max_offset": sum(q.max_offset for q in stats),
            "last_update_ms": last,
            "last_update": iso_ms(last),
        },
    }


def topic_status(topic: str, stats: list[QueueStats], *, as_json: bool = False) -> None:
    doc = topic_status_doc(topic, stats)
    if as_json:
        _json(doc)
        return
    rows = [
        (
            q["broker"],
            q["queue"],
            q["min_offset"],
            q["max_offset"],
            q["messages"],
            q["last_update"] or "-",
        )
        for q in doc["queues"]
    ]
    t = doc["total"]
    rows.append(("total", "", "", t["max_offset"], t["messages"], t["last_update"] or "-"))
    _console(min_width=100).print(
        _table(
            f"status of {topic}",
            ("broker", "queue", "min offset", "max offset", "messages", "last update (UTC)"),
            rows,
        )
    )


# --- groups -------------------------------------------------------------------------------


def group_list(
    groups: list[str], *, without_offsets: set[str] | None = None, as_json: bool = False
) -> None:
    """Group names; those in `without_offsets` (no consumer offset on any topic, e.g. after
    their topic was deleted) are marked so."""
    bare = sorted(set(groups) & (without_offsets or set()))
    if as_json:
        _json({"groups": sorted(groups), "without_offsets": bare})
        return
    for g in sorted(groups):
        _line(f"{g}  (no offsets)" if g in bare else g)


def group_progress_doc(
    stats: ConsumeStats, connections: list[ConsumerConnection], topic: str | None
) -> dict[str, Any]:
    return {
        "group": stats.group,
        "topic": topic,
        "queues": [
            {
                "topic": q.queue.topic,
                "broker": q.queue.brokerName,
                "queue": q.queue.queueId,
                "broker_offset": q.broker_offset,
                "consumer_offset": q.consumer_offset,
                "lag": q.lag,
                "last_timestamp_ms": q.last_timestamp,
                "last_timestamp": iso_ms(q.last_timestamp),
            }
            for q in stats.queues
        ],
        "total": {
            "broker_offset": stats.broker_offset,
            "consumer_offset": stats.consumer_offset,
            "lag": stats.lag,
        },
        "consume_tps": round(stats.consume_tps, 2),
        "consumers": [
            {
                "client_id": c.client_id,
                "client_addr": c.client_addr,
                "language": c.language,
                "version": c.version,
                "message_model": c.message_model,
                "subscriptions": dict(sorted(c.subscriptions.items())),
            }
            for c in connections
        ],
    }


def group_progress(
    stats: ConsumeStats,
    connections: list[ConsumerConnection],
    topic: str | None = None,
    *,
    as_json: bool = False,
) -> None:
    doc = group_progress_doc(stats, connections, topic)
    if as_json:
        _json(doc)
        return
    rows = [
        (
            q["topic"],
            q["broker"],
            q["queue"],
            q["broker_offset"],
            q["consumer_offset"],
            q["lag"],
            q["last_timestamp"] or "-",
        )
        for q in doc["queues"]
    ]
    t = doc["total"]
    rows.append(("total", "", "", t["broker_offset"], t["consumer_offset"], t["lag"], ""))
    console = _console(min_width=110)
    console.print(
        _table(
            f"progress of {stats.group}",
            (
                "topic",
                "broker",
                "queue",
                "broker offset",
                "consumer offset",
                "lag",
                "last consumed (UTC)",
            ),
            rows,
        )
    )
    online = ", ".join(c.client_id for c in connections) or "none online"
    _line(f"total lag {stats.lag}, consume TPS {rate(stats.consume_tps)}, consumers: {online}")


# --- messages -----------------------------------------------------------------------------


def message_doc(m: MessageExt) -> dict[str, Any]:
    try:
        text: str | None = m.body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {
        "topic": m.topic,
        "msg_id": m.uniq_key or m.msg_id,
        "offset_msg_id": m.msg_id,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "commit_log_offset": m.commit_log_offset,
        "tags": m.tags,
        "keys": m.keys,
        "properties": dict(sorted(m.properties.items())),
        "born_timestamp_ms": m.born_timestamp,
        "born_timestamp": iso_ms(m.born_timestamp),
        "born_host": f"{m.born_host[0]}:{m.born_host[1]}",
        "store_timestamp_ms": m.store_timestamp,
        "store_timestamp": iso_ms(m.store_timestamp),
        "store_host": f"{m.store_host[0]}:{m.store_host[1]}",
        "reconsume_times": m.reconsume_times,
        "body_size": len(m.body),
        "body": text,  # null when the body is not UTF-8: use body_base64
        "body_base64": base64.b64encode(m.body).decode("ascii"),
    }


def messages(msgs: list[MessageExt], *, as_json: bool = False) -> None:
    docs = [message_doc(m) for m in msgs]
    if as_json:
        _json({"count": len(docs), "messages": docs})
        return
    for i, d in enumerate(docs):
        if i:
            _line("")
        props = " ".join(f"{k}={v}" for k, v in d["properties"].items())
        body = d["body"] if d["body"] is not None else f"(binary) base64:{d['body_base64']}"
        for label, value in (
            ("msgId", d["msg_id"]),
            ("offsetMsgId", d["offset_msg_id"]),
            ("topic", d["topic"]),
            ("tags", d["tags"] or "-"),
            ("keys", d["keys"] or "-"),
            (
                "queue",
                f"{d['queue_id']} offset {d['queue_offset']} (commitlog {d['commit_log_offset']})",
            ),
            ("born", f"{d['born_timestamp']} from {d['born_host']}"),
            ("stored", f"{d['store_timestamp']} at {d['store_host']}"),
            ("reconsumeTimes", d["reconsume_times"]),
            ("properties", props or "-"),
            (f"body ({d['body_size']} bytes)", body),
        ):
            _line(f"{label + ':':<18} {value}")


def consumed_json(topic: str, msgs: list[MessageExt]) -> None:
    _json({"topic": topic, "count": len(msgs), "messages": [message_doc(m) for m in msgs]})


# --- rmq cluster ------------------------------------------------------------------------------


def cluster_status(statuses: list[BrokerStatus], *, as_json: bool = False) -> None:
    """Brokers with role and CommitLog offset, then one row per slave connection (lag)."""
    if as_json:
        import json

        _line(json.dumps({"brokers": [s.to_json() for s in statuses]}, indent=2))
        return
    from rich.table import Table

    brokers = Table(title="brokers")
    for col in ("cluster", "broker", "id", "role", "address", "max offset", "replication"):
        brokers.add_column(col)
    for s in statuses:
        if s.error:
            repl = f"error: {s.error}"
        elif s.raft is not None:
            repl = (
                f"DLedger {s.raft.group} {s.raft.self_id} {s.raft.role}, term {_opt(s.raft.term)}"
            )
        elif s.broker_id == 0:
            repl = f"push2SlaveMaxOffset {_opt(s.push2slave_max_offset)}, slaves {_opt(s.ha_connections)}"
        else:
            state = {True: "connected", False: "disconnected", None: "?"}[s.ha_client_connected]
            repl = (
                f"master {s.ha_master_addr or '-'} {state}, reported {_opt(s.ha_reported_offset)}"
            )
        brokers.add_row(
            s.cluster,
            s.broker_name,
            str(s.broker_id),
            s.role or "?",
            s.addr,
            _opt(s.max_offset),
            repl,
        )
    console = _console(min_width=140)
    console.print(brokers)
    members = [s for s in statuses if s.raft is not None and not s.error]
    if members:
        console.print(dledger_table(members))
    lags = Table(title="slave connections (as each master sees them)")
    for col in ("broker", "master", "slave (HA socket)", "acked offset", "lag bytes", "lag ms"):
        lags.add_column(col)
    rows = 0
    for s in statuses:
        for lag in s.slaves:
            lags.add_row(
                s.broker_name,
                s.addr,
                lag.addr,
                str(lag.ack_offset),
                str(lag.lag_bytes),
                str(lag.lag_ms),
            )
            rows += 1
    if rows:
        console.print(lags)
    elif len(members) < len(statuses):  # DLedger members replicate by Raft, not HA
        _line("no slave connections")


def dledger_table(statuses: list[BrokerStatus]) -> Table:
    """One row per DLedger member: its Raft role and term, its log's end and committed index,
    its lag behind the group's leader (blank on the leader), and the leader it follows. The
    group's current leader is marked `*`."""
    from rich.table import Table

    from cli.runtime_info.raft import group_leaders, raft_cell

    leaders = group_leaders(s.raft for s in statuses if s.raft is not None)
    table = Table(title="DLedger groups (* = the group's current leader)")
    for col in ("group", "member", "address", "term", "ledger end", "committed", "lag", "leader"):
        table.add_column(col, justify="right" if col in _RAFT_NUMBERS else "left")
    for s in sorted(statuses, key=lambda s: (s.raft.group, s.raft.self_id) if s.raft else ("", "")):
        raft = s.raft
        if raft is None:
            continue
        leader = leaders.get(raft.group)
        table.add_row(
            raft.group,
            raft_cell(raft, leader),
            s.addr,
            _opt(raft.term),
            _opt(raft.ledger_end_index),
            _opt(raft.committed_index),
            "" if raft.lag is None else str(raft.lag),
            raft.leader_id or "-",
        )
    return table


_RAFT_NUMBERS = ("term", "ledger end", "committed", "lag")


def _opt(value: object) -> str:
    return "-" if value is None else str(value)
