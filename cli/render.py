"""Everything the `rmq` command prints: one function per kind of result.

Commands hand plain models here; nothing in this module talks to the network. Consoles are
made per call so typer's CliRunner (which swaps sys.stdout/sys.stderr) captures the output.
Lines that scripts read (`ready`, message bodies, send results) are printed plainly, without
markup or wrapping, so they stay the same whether stdout is a terminal or a pipe.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from cli.dledger_admin import TransferOutcome
    from cli.status import BrokerStatus
    from common.message import MessageExt
    from common.model import TopicRouteData
    from rmq.producer import SendResult


def _console(stderr: bool = False, min_width: int | None = None) -> Console:
    from rich.console import Console

    console = Console(file=sys.stderr if stderr else sys.stdout, highlight=False, soft_wrap=True)
    if min_width is not None and console.width < min_width:
        console.width = min_width  # a pipe reports 80 columns: do not fold addresses
    return console


def _line(text: str) -> None:
    print(text, flush=True)


def error(text: str) -> None:
    """One line on stderr; the caller exits non-zero."""
    print(f"error: {text}", file=sys.stderr, flush=True)


def rate(value: float | None) -> str:
    """A rate (messages per second) as people read it: whole numbers from 10 on (with
    thousands separators), one decimal below; '-' when unknown."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 10 or value == 0 else f"{value:.1f}"


def listening(what: str, addr: str) -> None:
    _line(f"{what} listening on {addr}")


# --- topics / cluster ------------------------------------------------------------------------


def topic_created(topic: str, broker_addrs: list[str]) -> None:
    for addr in broker_addrs:
        _line(f"created topic {topic} on {addr}")


def topic_list(topics: list[str]) -> None:
    for topic in sorted(topics):
        _line(topic)


def topic_route(topic: str, route: TopicRouteData) -> None:
    from rich.table import Table

    from common.model import PermName

    brokers = Table(title=f"brokers of {topic}")
    for col in ("broker", "cluster", "id", "address"):
        brokers.add_column(col)
    for bd in sorted(route.brokerDatas, key=lambda b: b.brokerName):
        for bid, addr in sorted(bd.brokerAddrs.items()):
            brokers.add_row(bd.brokerName, bd.cluster, str(bid), addr)
    queues = Table(title=f"queues of {topic}")
    for col in ("broker", "read", "write", "perm"):
        queues.add_column(col)
    for qd in sorted(route.queueDatas, key=lambda q: q.brokerName):
        queues.add_row(
            qd.brokerName,
            str(qd.readQueueNums),
            str(qd.writeQueueNums),
            PermName.to_string(qd.perm),
        )
    console = _console()
    console.print(brokers)
    console.print(queues)


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

    from cli.dledger_status import group_leaders, raft_cell

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


def leadership_transferred(outcome: TransferOutcome, *, as_json: bool = False) -> None:
    """`rmq dledger leadership-transfer`: one line (or one JSON document)."""
    if as_json:
        import json

        _line(json.dumps(outcome.to_json(), indent=2))
        return
    term = f"term {_opt(outcome.term)}"
    if not outcome.moved:
        _line(f"{outcome.group}: {outcome.new_leader} already leads ({term}); nothing to move")
        return
    _line(
        f"{outcome.group}: leadership moved {outcome.previous_leader} -> {outcome.new_leader} "
        f"({term}, {outcome.seconds:.2f} s)"
    )


# --- messages --------------------------------------------------------------------------------


def send_result(result: SendResult) -> None:
    mq = result.message_queue
    _line(
        f"{result.status.name} msgId={result.msg_id} offsetMsgId={result.offset_msg_id} "
        f"queue={mq.brokerName}:{mq.queueId} queueOffset={result.queue_offset}"
    )


def message(msg: MessageExt, *, verbose: bool = False, served_by: str = "") -> None:
    """A consumed message: its body, or with `verbose` where it came from and its ids.

    `served_by` is the node that answered the pull. The record's own store host is the
    master that stored it, which is wrong once a slave serves it (the master is down)."""
    body = msg.body.decode("utf-8", errors="replace")
    if not verbose:
        _line(body)
        return
    addr = served_by or f"{msg.store_host[0]}:{msg.store_host[1]}"
    _line(
        f"[{msg.topic} {addr} q{msg.queue_id} "
        f"@{msg.queue_offset}] msgId={msg.uniq_key or msg.msg_id} tags={msg.tags or ''} "
        f"keys={msg.keys or ''} body={body}"
    )
