"""`rmq top` counts and shows the nameserver as a node; rates are rounded wherever shown."""

from __future__ import annotations

import pytest
from rich.console import Console

from cli import render
from cli.top.model import NodeView, TopSnapshot
from cli.top.screen import DOWN_STYLE, render_top

NAMESRV = "127.0.0.1:19876"


def _snap(*, namesrv_error: str | None = None, taken_at: float = 12.0, put: int = 0) -> TopSnapshot:
    nodes = (
        NodeView(
            "DefaultCluster",
            "broker-a",
            0,
            "127.0.0.1:10911",
            role="SYNC_MASTER",
            max_offset=10,
            put_total=put,
            get_total=0,
        ),
        NodeView(
            "DefaultCluster",
            "broker-a",
            1,
            "127.0.0.1:10921",
            role="SLAVE",
            max_offset=10,
            put_total=0,
            get_total=0,
        ),
    )
    return TopSnapshot(NAMESRV, taken_at, 1_700_000_000.0, nodes, namesrv_error=namesrv_error)


def _text(snap: TopSnapshot, prev: TopSnapshot | None = None, width: int = 160) -> Console:
    console = Console(
        record=True, width=width, force_terminal=True, color_system="truecolor", highlight=False
    )
    console.print(render_top(snap, prev, width=width))
    return console


def test_the_nameserver_is_a_node_of_the_count_and_of_the_table():
    text = _text(_snap()).export_text()
    assert "3 nodes" in text.splitlines()[0], text
    [row] = [ln for ln in text.splitlines() if NAMESRV in ln and "rmq top" not in ln]
    assert row.split()[:3] == ["namesrv", "-", "NAMESRV"] and "up" in row.split(), row


@pytest.mark.parametrize("width", [160, 40])
def test_a_dead_nameserver_is_counted_down_and_its_row_is_red(width: int) -> None:
    console = _text(_snap(namesrv_error="connection refused"), width=width)
    text = console.export_text(clear=False)
    assert "3 nodes, 1 down" in text.replace("\n", " "), text
    from rich.segment import Segment

    [row] = [
        line
        for line in Segment.split_lines(console._record_buffer)
        if "NAMESRV" in "".join(s.text for s in line)
    ]
    if width >= 80:  # a narrow terminal drops the state column; the red row stays
        assert "DOWN" in "".join(s.text for s in row)
    styled = [s for s in row if s.text.strip()]
    assert all(
        s.style is not None and s.style.color is not None and s.style.color.name == "red"
        for s in styled
    )
    assert DOWN_STYLE == "bold red"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "-"),
        (0.0, "0"),
        (2.1333333, "2.1"),
        (9.96, "10.0"),
        (12.5, "12"),
        (12345.678, "12,346"),
    ],
)
def test_rates_are_rounded(value: float | None, shown: str) -> None:
    assert render.rate(value) == shown


def test_top_shows_a_fractional_rate_rounded():
    # 32 sends over 15 s: 2.1333... per second
    text = _text(_snap(taken_at=27.0, put=32), _snap(taken_at=12.0, put=0)).export_text()
    [master] = [ln for ln in text.splitlines() if "127.0.0.1:10911" in ln]
    assert "2.1" in master.split() and "2.13" not in master, master
