"""`rmq top` rendering: a known cluster state drawn into a recording console at several widths.

The renderer is a pure function of (snapshot, previous snapshot, width); these tests read the
recorded text back, and the styles of the segments to check a dead node is drawn red.
"""

from __future__ import annotations

import attrs
import pytest
from rich.console import Console, RenderableType
from rich.segment import Segment

from cli.runtime_info.status import SlaveLag
from cli.top.model import (
    ClientView,
    GroupView,
    NodeInfo,
    NodeView,
    QueueView,
    TopicView,
    TopSnapshot,
    node_view,
)
from cli.top.screen import DOWN_STYLE, UNLISTED_STYLE, render_top

MASTER_A = "127.0.0.1:10911"
SLAVE_A = "127.0.0.1:10921"
MASTER_B = "127.0.0.1:10931"


def snapshot(
    *, taken_at: float, put: int, get: int, b_error: str | None = None, slave_offset: int = 900
) -> TopSnapshot:
    nodes = (
        NodeView(
            "DefaultCluster",
            "broker-a",
            0,
            MASTER_A,
            role="SYNC_MASTER",
            max_offset=1000,
            put_total=put,
            get_total=get,
            slaves=(SlaveLag("127.0.0.1:53211", slave_offset, 1000 - slave_offset, 250),),
        ),
        NodeView(
            "DefaultCluster",
            "broker-a",
            1,
            SLAVE_A,
            role="SLAVE",
            max_offset=slave_offset,
            put_total=0,
            get_total=0,
            ha_reported_offset=slave_offset,
        ),
        NodeView(
            "DefaultCluster",
            "broker-b",
            0,
            MASTER_B,
            role="ASYNC_MASTER",
            max_offset=None if b_error else 5000,
            put_total=None if b_error else 7,
            get_total=None if b_error else 3,
            listed=b_error is None,
            error=b_error,
        ),
    )
    topics = (
        TopicView("Orders", (QueueView("broker-a", 0, 12), QueueView("broker-a", 1, 30))),
        TopicView("Payments", error="timeout"),
    )
    groups = (GroupView("order-consumers", ("Orders",), lag=17, queues=2),)
    return TopSnapshot("127.0.0.1:9876", taken_at, 1_700_000_000.0, nodes, topics, groups)


def record(renderable: RenderableType, width: int) -> Console:
    console = Console(
        record=True, width=width, force_terminal=True, color_system="truecolor", highlight=False
    )
    console.print(renderable)
    return console


def lines_with(console: Console, needle: str) -> list[list[Segment]]:
    """The rendered lines (as segments) whose text contains `needle`."""
    out = []
    for line in Segment.split_lines(console._record_buffer):
        if needle in "".join(s.text for s in line):
            out.append(line)
    return out


@pytest.mark.parametrize("width", [160, 120, 100, 80, 60, 40])
def test_every_width_shows_topology_and_no_line_is_wider(width: int) -> None:
    prev = snapshot(taken_at=10.0, put=100, get=40)
    snap = snapshot(taken_at=12.0, put=300, get=140)
    console = record(render_top(snap, prev, width=width), width)
    text = console.export_text(clear=False)
    assert all(len(line) <= width for line in text.splitlines())
    for needle in ("broker-a", "broker-b", "SYNC_MASTER", "SLAVE", "Orders", "order-consumers"):
        assert needle in text, (width, needle)
    if width >= 60:  # from 60 columns on every row fits on one line
        for addr in (MASTER_A, SLAVE_A, MASTER_B):
            assert addr in text


def test_wide_layout_numbers_rates_and_lag():
    prev = snapshot(taken_at=10.0, put=100, get=40)
    snap = snapshot(taken_at=12.0, put=300, get=140)
    console = record(render_top(snap, prev, width=160), 160)
    text = console.export_text(clear=False)
    [master] = [ln for ln in text.splitlines() if MASTER_A in ln]
    cells = master.split()
    # (300 - 100) / 2 s = 100 sends/s, (140 - 40) / 2 s = 50 pulls/s
    assert "100" in cells and "50" in cells
    assert "1,000" in cells  # commitlog max offset
    [slave] = [ln for ln in text.splitlines() if SLAVE_A in ln]
    assert "100" in slave.split() and "250" in slave.split()  # lag 100 bytes, 250 ms
    [orders] = [ln for ln in text.splitlines() if "Orders" in ln and "order-" not in ln]
    assert "42" in orders.split()  # 12 + 30 messages
    assert "broker-a:0=12" in orders and "broker-a:1=30" in orders
    [group] = [ln for ln in text.splitlines() if "order-consumers" in ln]
    assert group.split()[1] == "17"
    assert "1 down" not in text


def test_first_frame_has_no_rates_and_a_restarted_broker_none_either():
    snap = snapshot(taken_at=12.0, put=300, get=140)
    text = record(render_top(snap, None, width=160), 160).export_text()
    [master] = [ln for ln in text.splitlines() if MASTER_A in ln]
    assert master.split()[-3:-1] == ["-", "-"]
    restarted = snapshot(taken_at=13.0, put=5, get=1)
    text = record(render_top(restarted, snap, width=160), 160).export_text()
    [master] = [ln for ln in text.splitlines() if MASTER_A in ln]
    assert master.split()[-3:-1] == ["-", "-"]


@pytest.mark.parametrize("width", [160, 60])
def test_dead_node_is_drawn_red_and_the_others_are_not(width: int) -> None:
    prev = snapshot(taken_at=10.0, put=100, get=40)
    snap = snapshot(taken_at=12.0, put=300, get=140, b_error="down (connection refused)")
    console = record(render_top(snap, prev, width=width), width)
    text = console.export_text(clear=False)
    assert "1 down" in text
    assert "DOWN" in text
    dead = lines_with(console, MASTER_B)
    assert len(dead) == 2  # its row, and the reason under the table
    assert "down (connection refused)" in "".join(s.text for s in dead[1])
    for line in dead:
        styled = [s for s in line if s.text.strip()]
        assert styled and all(
            s.style is not None
            and s.style.color is not None
            and s.style.color.name == "red"
            and s.style.bold
            for s in styled
        )
    [alive] = lines_with(console, MASTER_A)
    assert not any(
        s.style is not None and s.style.color is not None and s.style.color.name == "red"
        for s in alive
        if s.text.strip()
    )
    # the html export carries the same colour, for a human looking at a failure
    assert "DOWN" in console.export_html(inline_styles=True)


def test_dead_node_back_is_normal_again():
    back = snapshot(taken_at=14.0, put=300, get=140)
    console = record(render_top(back, None, width=160), 160)
    [line] = lines_with(console, MASTER_B)
    assert not any(
        s.style is not None and s.style.color is not None and s.style.color.name == "red"
        for s in line
        if s.text.strip()
    )


def test_unlisted_but_answering_node_is_yellow():
    snap = snapshot(taken_at=12.0, put=300, get=140)
    nodes = list(snap.nodes)
    nodes[2] = NodeView(
        "DefaultCluster", "broker-b", 0, MASTER_B, role="ASYNC_MASTER", max_offset=1, listed=False
    )
    import attrs

    console = record(render_top(attrs.evolve(snap, nodes=tuple(nodes)), None, width=160), 160)
    [line] = lines_with(console, MASTER_B)
    assert "not registered" in "".join(s.text for s in line)
    assert any(
        s.style is not None and s.style.color is not None and s.style.color.name == UNLISTED_STYLE
        for s in line
        if s.text.strip()
    )
    assert DOWN_STYLE == "bold red"


def test_nameserver_down_is_said_in_the_header():
    snap = TopSnapshot("127.0.0.1:9876", 1.0, 1_700_000_000.0, namesrv_error="timeout")
    console = record(render_top(snap, None, width=80), 80)
    [line] = lines_with(console, "nameserver: timeout")
    assert any(
        s.style is not None and s.style.color is not None and s.style.color.name == "red"
        for s in line
    )
    assert "no user topics" not in console.export_text()


def test_the_disk_column_shows_use_and_a_refusing_broker_in_red():
    def node(port: int, table: dict[str, str]) -> NodeView:
        key = ("DefaultCluster", f"broker-{port}", 0)
        return node_view(f"127.0.0.1:{port}", key, NodeInfo(table, "ASYNC_MASTER"), listed=True)

    ok = node(10911, {"commitLogDiskRatio": "0.4213", "putRefusedReason": ""})
    full = node(
        10921,
        {
            "commitLogDiskRatio": "0.9312",
            "putRefusedReason": "the broker's disk is full [CL: 0.93]: over "
            "diskSpaceWarningLevelRatio 0.90; only files older than fileReservedTime (72 h) "
            "are deleted; nothing unexpired is (cleanFileForciblyEnable=false)",
        },
    )
    assert (ok.disk_ratio, ok.put_refused) == (0.4213, "")
    console = Console(record=True, width=200, color_system=None, highlight=False)
    console.print(render_top(TopSnapshot("127.0.0.1:9876", 1.0, 1.7e9, (ok, full)), width=200))
    out = console.export_text()
    assert any(line.split()[-1:] == ["disk"] or " disk " in line for line in out.splitlines())
    (ok_line,) = [line for line in out.splitlines() if "broker-10911" in line]
    full_line, why = [line for line in out.splitlines() if "broker-10921" in line]
    assert "42%" in ok_line and "full" not in ok_line
    assert "93% full" in full_line
    # and a line below the table says why, with what retention does about it
    assert "127.0.0.1:10921 refuses sends: the broker's disk is full [CL: 0.93]" in why
    assert "(cleanFileForciblyEnable=false)" in out
    assert "127.0.0.1:10911 refuses" not in out


def test_pop_group_shows_ready_inflight_and_lag():
    snap = attrs.evolve(
        snapshot(taken_at=12.0, put=300, get=140),
        groups=(
            GroupView("order-consumers", ("Orders",), lag=17, queues=2, ready=17),
            GroupView("pop-cg", ("Orders", "%RETRY%pop-cg_Orders"), 9, 3, ready=4, inflight=5),
        ),
    )
    text = record(render_top(snap, None, width=160), 160).export_text(clear=False)
    header = next(ln for ln in text.splitlines() if "inflight" in ln).split()
    assert header[:5] == ["group", "lag", "ready", "inflight", "queues"]
    [pop] = [ln.split() for ln in text.splitlines() if ln.split()[:1] == ["pop-cg"]]
    assert pop[:5] == ["pop-cg", "9", "4", "5", "3"]
    # a 4.x group: nothing in flight, the column is blank
    [push] = [ln.split() for ln in text.splitlines() if "order-consumers" in ln]
    assert push[:4] == ["order-consumers", "17", "17", "2"]


def test_clients_table_shows_5x_clients_with_language_and_protocol():
    snap = attrs.evolve(
        snapshot(taken_at=1.0, put=0, get=0),
        clients=(
            ClientView("producer", "Payments", "h@7@0@a", "PYTHON", "GRPC_V2", "127.0.0.1:40001"),
            ClientView(
                "simple consumer", "coupons", "h@8@0@b", "PYTHON", "GRPC_V2", "x:2", ("Coupons",)
            ),
        ),
    )
    text = record(render_top(snap, width=160), 160).export_text()
    assert "clients" in text
    lines = [ln for ln in text.splitlines() if "GRPC_V2" in ln]
    assert len(lines) == 2, text
    for want in ("producer", "Payments", "h@7@0@a", "PYTHON", "127.0.0.1:40001"):
        assert want in lines[0], lines[0]
    for want in ("simple consumer", "coupons", "h@8@0@b", "PYTHON", "Coupons"):
        assert want in lines[1], lines[1]
    # no clients, no table
    plain = render_top(snapshot(taken_at=1.0, put=0, get=0), width=160)
    assert "client id" not in record(plain, 160).export_text()
