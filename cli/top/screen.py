"""`rmq top`: draw a `TopSnapshot` (and the one before, for rates) as a rich renderable.

Theory of operation: `render_top(snap, prev, width=...)` is a pure function: the same
snapshots and width give the same picture, so tests render it into a recording console and
read the text and the styles back. The live loop (`run_top`) collects a snapshot, renders it
for the console's current width and hands it to `rich.live.Live`, which redraws in place; a
resized terminal simply gets a different layout on the next refresh.

Layout: a header line (nameserver, time, node count, how many are down; the nameserver is a
node too), then three tables: nodes (the nameserver first, then one row per broker process:
broker name, brokerId, role, address, state, CommitLog max offset, replication lag of a slave
in bytes and ms, send/pull TPS, cluster; for a DLedger member also its Raft role with the
group's leader marked *, term, ledger end and committed index, and its lag behind the leader;
a line under the header names each group's leader), topics
(messages = sum of queue max offsets, queue count, the per-queue max offsets) and consumer
groups (lag, queues, topics), then the online clients (producers and consumers, RocketMQ 5 gRPC
clients among them: kind, group, client id, language, protocol, address). Every column has a priority; `fit_table` measures the table
and drops the lowest-priority columns until each row fits on one line of the terminal, so a
narrow terminal still shows who is who and who is down, a wide one shows everything. A node
that did not answer is a red row saying DOWN, with the reason in a red line under the table;
a node that answers but that the nameserver no longer lists is yellow.
"""

from __future__ import annotations

import time

import attrs
from rich import box
from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

from cli.app import credentials_from_env
from cli.client_network import network_from_env
from cli.render import rate as _tps
from cli.runtime_info.raft import RaftStatus, raft_cell, with_lag
from cli.top.model import NodeView, TopSnapshot, rates, slave_lag

DOWN_STYLE = "bold red"
UNLISTED_STYLE = "yellow"
MAX_QUEUE_CELLS = 16  # per-queue offsets shown per topic before "..."
MIN_WRAP_COLUMN = 24  # a wrapping last column is shown only with at least this much room


@attrs.frozen
class Column:
    name: str
    priority: int  # lower = kept longer when the terminal is narrow
    justify: JustifyMethod = "left"


# A table's rows: (cells by column name, row style).
_Rows = list[tuple[dict[str, str | Text], str | None]]


def _num(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _table(title: str) -> Table:
    return Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
        header_style="bold cyan",
    )


def fit_table(
    title: str, columns: list[Column], rows: _Rows, width: int, *, wrap_last: Column | None = None
) -> Table:
    """A table of the highest-priority columns whose natural width fits `width`.

    Each row is (cells by column name, row style). Columns are dropped lowest priority
    first until every row fits on one line; with only the top column left the table is
    built anyway (rich folds it). `wrap_last`, if given, is one more column at the end that
    may wrap, shown when at least MIN_WRAP_COLUMN columns remain for it.
    """
    # measured on an unbounded console: a measurement is clamped to the console width
    measure = Console(width=100_000, color_system=None, highlight=False)
    by_priority = sorted(columns, key=lambda c: c.priority)
    for keep in range(len(by_priority), 0, -1):
        kept = {c.name for c in by_priority[:keep]}
        table = _build(title, [c for c in columns if c.name in kept], rows)
        natural = measure.measure(table).maximum
        if natural <= width or keep == 1:
            break
    if wrap_last is not None and width - natural - 1 >= MIN_WRAP_COLUMN:
        table = _build(title, [c for c in columns if c.name in kept] + [wrap_last], rows)
    return table


def _build(title: str, columns: list[Column], rows: _Rows) -> Table:
    table = _table(title)
    for col in columns:
        table.add_column(col.name, justify=col.justify, no_wrap=col.priority < 100, overflow="fold")
    for cells, style in rows:
        table.add_row(*(cells.get(c.name, "") for c in columns), style=style)
    return table


def header(snap: TopSnapshot) -> Text:
    # the nameserver counts: `rmq up` starts it as a node like the brokers, and it can die
    down = sum(1 for n in snap.nodes if not n.alive) + (1 if snap.namesrv_error else 0)
    total = len(snap.nodes) + 1
    text = Text()
    text.append("rmq top", style="bold")
    text.append(f"  namesrv {snap.namesrv}  ")
    text.append(time.strftime("%H:%M:%S", time.localtime(snap.wall_time)))
    text.append(f"  {total} node{'s' if total != 1 else ''}")
    if down:
        text.append(f", {down} down", style=DOWN_STYLE)
    if snap.namesrv_error:
        text.append(f"  nameserver: {snap.namesrv_error}", style=DOWN_STYLE)
    return text


def raft_line(snap: TopSnapshot) -> Text | None:
    """`DLedger leaders: broker-a n1 (term 4), broker-b none` (None without DLedger groups)."""
    groups = snap.raft_groups()
    if not groups:
        return None
    leaders = snap.raft_leaders()
    text = Text("DLedger leaders: ")
    for i, group in enumerate(groups):
        if i:
            text.append(", ")
        leader = leaders.get(group)
        if leader is None:
            text.append(f"{group} none (electing?)", style=DOWN_STYLE)
        else:
            text.append(f"{group} {leader.self_id} (term {_num(leader.term)})")
    return text


NODE_COLUMNS = [
    Column("broker", 0),
    Column("id", 3, "right"),
    Column("role", 1),
    Column("address", 2),
    Column("state", 4),
    Column("commitlog max", 5, "right"),
    Column("repl lag", 6, "right"),
    Column("send/s", 7, "right"),
    Column("pull/s", 8, "right"),
    Column("lag ms", 9, "right"),
    Column("cluster", 10),
    # used share of the store's disk; "full" (red) while it refuses sends for it
    Column("disk", 7, "right"),
]
# DLedger members only (the columns are there when one of the nodes is a member): which member
# and its Raft role (the group's current leader marked *), its term, its log's end and
# committed index, and how far its log is behind the leader's
RAFT_COLUMNS = [
    Column("raft", 1),
    Column("term", 4, "right"),
    Column("ledger end", 5, "right"),
    Column("committed", 6, "right"),
    Column("raft lag", 5, "right"),
]


def nodes_table(snap: TopSnapshot, prev: TopSnapshot | None, *, width: int) -> Table:
    """The nameserver, then one row per broker node; a dead node's row is red and says DOWN
    (a broker's reason goes below the table, the nameserver's is in the header)."""
    tps = rates(snap, prev)
    namesrv: dict[str, str | Text] = {
        "broker": "namesrv",
        "id": "-",
        "role": "NAMESRV",
        "address": snap.namesrv,
        "state": "DOWN" if snap.namesrv_error else "up",
    }
    rows: _Rows = [(namesrv, DOWN_STYLE if snap.namesrv_error else None)]
    leaders = snap.raft_leaders()
    for node in snap.nodes:
        cells: dict[str, str | Text] = {
            "cluster": node.cluster,
            "broker": node.broker_name,
            "id": str(node.broker_id),
            "role": node.role or "?",
            "address": node.addr,
        }
        if not node.alive:
            cells["state"] = "DOWN"
            if node.raft is not None:  # the member it was when it last answered
                cells["raft"] = f"{node.raft.self_id} DOWN"
            rows.append((cells, DOWN_STYLE))
            continue
        if not node.is_master:
            lag = slave_lag(snap.master_of(node), node)
            cells["repl lag"], cells["lag ms"] = _num(lag.bytes), _num(lag.ms)
        rate = tps[node.addr]
        cells["commitlog max"] = _num(node.max_offset)
        cells["send/s"], cells["pull/s"] = _tps(rate.send_tps), _tps(rate.pull_tps)
        cells["state"] = _state(node)
        if node.disk_ratio is not None:
            cells["disk"] = Text(
                f"{node.disk_ratio:.0%}" + (" full" if node.put_refused else ""),
                style=DOWN_STYLE if node.put_refused else "",
            )
        if node.raft is not None:
            cells.update(_raft_cells(node.raft, leaders.get(node.raft.group)))
        rows.append((cells, None if node.listed else UNLISTED_STYLE))
    columns = NODE_COLUMNS
    if any(n.raft is not None for n in snap.nodes):
        columns = [*NODE_COLUMNS[:3], *RAFT_COLUMNS, *NODE_COLUMNS[3:]]
    return fit_table("nodes", columns, rows, width)


def _raft_cells(raft: RaftStatus, leader: RaftStatus | None) -> dict[str, str | Text]:
    lag = with_lag(raft, leader).lag
    is_leader = leader is not None and leader.self_id == raft.self_id
    return {
        "raft": Text(raft_cell(raft, leader), style="bold green" if is_leader else ""),
        "term": _num(raft.term),
        "ledger end": _num(raft.ledger_end_index),
        "committed": _num(raft.committed_index),
        "raft lag": "" if lag is None else _num(lag),
    }


def _state(node: NodeView) -> str:
    if not node.listed:
        return "not registered"
    if node.is_master and node.slaves:
        return f"up, {len(node.slaves)} slave{'s' if len(node.slaves) != 1 else ''}"
    return "up"


def down_lines(snap: TopSnapshot) -> list[Text]:
    return [
        Text(f"{n.broker_name} {n.addr}: {n.error}", style=DOWN_STYLE)
        for n in snap.nodes
        if not n.alive
    ]


def refusing_lines(snap: TopSnapshot) -> list[Text]:
    """Why each live broker refuses sends (its runtime info's putRefusedReason): the disk
    column says that it does, this says why and what its retention will do about it."""
    return [
        Text(f"{n.broker_name} {n.addr} refuses sends: {n.put_refused}", style=DOWN_STYLE)
        for n in snap.nodes
        if n.alive and n.put_refused
    ]


TOPIC_COLUMNS = [Column("topic", 0), Column("messages", 1, "right"), Column("queues", 2, "right")]
QUEUE_OFFSETS = Column("queue max offsets (broker:queue=offset)", 100)


def topics_table(snap: TopSnapshot, *, width: int) -> Table:
    rows: _Rows = []
    for t in snap.topics:
        if t.error:
            rows.append(
                (
                    {
                        "topic": t.topic,
                        "messages": "-",
                        "queues": "-",
                        QUEUE_OFFSETS.name: f"error: {t.error}",
                    },
                    DOWN_STYLE,
                )
            )
            continue
        shown = [f"{q.broker_name}:{q.queue_id}={q.max_offset}" for q in t.queues[:MAX_QUEUE_CELLS]]
        if len(t.queues) > MAX_QUEUE_CELLS:
            shown.append("...")
        rows.append(
            (
                {
                    "topic": t.topic,
                    "messages": _num(t.total),
                    "queues": str(len(t.queues)),
                    QUEUE_OFFSETS.name: " ".join(shown),
                },
                None,
            )
        )
    table = fit_table("topics", TOPIC_COLUMNS, rows, width, wrap_last=QUEUE_OFFSETS)
    if snap.hidden_topics:
        table.caption = f"+{snap.hidden_topics} more topics"
    return table


GROUP_COLUMNS = [
    Column("group", 0),
    Column("lag", 1, "right"),
    # pop groups (RocketMQ 5): lag = ready (not handed out) + inflight (popped, not acked)
    Column("ready", 2, "right"),
    Column("inflight", 2, "right"),
    Column("queues", 3, "right"),
]
GROUP_TOPICS = Column("topics", 100)


def groups_table(snap: TopSnapshot, *, width: int) -> Table:
    rows: _Rows = []
    for g in snap.groups:
        if g.error:
            rows.append(
                (
                    {
                        "group": g.group,
                        "lag": "-",
                        "ready": "-",
                        "inflight": "-",
                        "queues": "-",
                        "topics": f"error: {g.error}",
                    },
                    DOWN_STYLE,
                )
            )
            continue
        lag = Text(_num(g.lag), style="yellow" if g.lag else "")
        rows.append(
            (
                {
                    "group": g.group,
                    "lag": lag,
                    "ready": _num(g.ready),
                    "inflight": _num(g.inflight) if g.inflight else "",
                    "queues": str(g.queues),
                    "topics": ", ".join(g.topics) or "-",
                },
                None,
            )
        )
    table = fit_table("consumer groups", GROUP_COLUMNS, rows, width, wrap_last=GROUP_TOPICS)
    if snap.hidden_groups:
        table.caption = f"+{snap.hidden_groups} more groups"
    return table


CLIENT_COLUMNS = [
    Column("kind", 0),
    Column("group", 1),
    Column("client id", 2),
    Column("language", 3),
    # GRPC_V2: a RocketMQ 5 client (broker/grpc), REMOTING: a 4.x one
    Column("protocol", 3),
    Column("address", 5),
]
CLIENT_TOPICS = Column("topics", 100)


def clients_table(snap: TopSnapshot, *, width: int) -> Table:
    rows: _Rows = [
        (
            {
                "kind": c.kind,
                "group": c.group,
                "client id": c.client_id,
                "language": c.language,
                "protocol": Text(c.protocol, style="bold" if c.is_5x else ""),
                "address": c.addr,
                "topics": ", ".join(c.topics),
            },
            None,
        )
        for c in snap.clients
    ]
    return fit_table("clients", CLIENT_COLUMNS, rows, width, wrap_last=CLIENT_TOPICS)


def render_top(
    snap: TopSnapshot, prev: TopSnapshot | None = None, *, width: int = 120
) -> RenderableType:
    """The whole screen for one refresh (`prev` gives the rates; None shows '-')."""
    parts: list[RenderableType] = [header(snap)]
    leaders = raft_line(snap)
    if leaders is not None:
        parts.append(leaders)
    parts.append(nodes_table(snap, prev, width=width))
    parts += down_lines(snap)
    parts += refusing_lines(snap)
    if snap.topics or snap.hidden_topics:
        parts.append(topics_table(snap, width=width))
    elif snap.namesrv_error is None and snap.topics_error is None:
        parts.append(Text("no user topics", style="dim"))
    if snap.topics_error:
        parts.append(Text(f"topics: {snap.topics_error}", style=DOWN_STYLE))
    if snap.groups or snap.hidden_groups:
        parts.append(groups_table(snap, width=width))
    if snap.groups_error:
        parts.append(Text(f"consumer groups: {snap.groups_error}", style=DOWN_STYLE))
    if snap.clients:
        parts.append(clients_table(snap, width=width))
    if snap.clients_error:
        parts.append(Text(f"producers: {snap.clients_error}", style=DOWN_STYLE))
    parts.append(Text("ctrl-C to quit", style="dim"))
    return Group(*parts)


async def run_top(
    namesrv: str,
    *,
    interval: float = 1.0,
    once: bool = False,
    timeout: float = 2.0,
    show_system: bool = False,
    console: Console | None = None,
    frames: int | None = None,
) -> None:
    """Collect and draw until cancelled (ctrl-C), or one frame with `once`.

    `frames` stops after that many refreshes (tests). With `once` the frame is printed
    plainly (no Live), after two collections `interval` apart so the rates are real.
    """
    import trio
    from rich.console import Console
    from rich.live import Live

    from cli.errors import CliError
    from cli.top.model import AdminSource, TopCollector
    from rmq import Admin

    console = console or Console(highlight=False)
    async with Admin(
        namesrv, timeout=timeout, credentials=credentials_from_env(), network=network_from_env()
    ) as admin:
        collector = TopCollector(
            AdminSource(admin, timeout), namesrv, timeout=timeout, show_system=show_system
        )
        if once:
            first = await collector.collect()
            if first.namesrv_error and not first.nodes:
                raise CliError(f"cannot reach the nameserver {namesrv}: {first.namesrv_error}")
            await trio.sleep(interval)
            snap = await collector.collect()
            console.print(render_top(snap, first, width=console.width))
            return
        prev: TopSnapshot | None = None
        count = 0
        with Live(
            console=console, auto_refresh=False, screen=False, vertical_overflow="crop"
        ) as live:
            while frames is None or count < frames:
                next_at = trio.current_time() + interval
                snap = await collector.collect()
                live.update(render_top(snap, prev, width=console.width), refresh=True)
                prev, count = snap, count + 1
                await trio.sleep_until(next_at)
