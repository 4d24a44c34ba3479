"""`rmq group reset` without a cluster: how times are read, which option combinations are
refused, and what the table and the JSON document say (the command against real brokers and
the C++ client: tests/interop/test_cpp_reset_offset.py; the Admin call: tests/rmq)."""

from __future__ import annotations

import datetime
import json
import socket

import pytest
from typer.testing import CliRunner

from cli.admin.group_reset import parse_time, render_reset, reset_doc
from cli.main import app
from common.model import MessageQueue
from rmq.admin_api import OffsetReset

runner = CliRunner()
NOW = 1_700_000_000_000


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("now", NOW),
        ("1699999999123", 1699999999123),
        ("-15m", NOW - 15 * 60_000),
        ("-2h", NOW - 2 * 3_600_000),
        ("-1d", NOW - 86_400_000),
        ("-30s", NOW - 30_000),
        ("2023-11-14T22:13:20Z", NOW),
        ("2023-11-14T23:13:20+01:00", NOW),
        ("2023-11-14T22:13:20.500Z", NOW + 500),
    ],
)
def test_times(text, ms):
    assert parse_time(text, NOW) == ms


def test_naive_times_are_local_like_mqadmin():
    local = datetime.datetime(2024, 5, 1, 12, 0, 0, 250_000)
    want = int(local.timestamp() * 1000)
    assert parse_time("2024-05-01T12:00:00.250", NOW) == want
    assert parse_time("2024-05-01#12:00:00:250", NOW) == want  # mqadmin's -s format


@pytest.mark.parametrize("text", ["yesterday", "-15x", "15m", "2024-13-01T00:00:00", ""])
def test_unreadable_times(text):
    with pytest.raises(ValueError, match="cannot read time"):
        parse_time(text, NOW)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "extra",
    [[], ["--to-earliest", "--to-latest"], ["--to-time", "now", "--to-latest"]],
    ids=["none", "earliest+latest", "time+latest"],
)
def test_exactly_one_target_is_required(extra):
    ns = f"127.0.0.1:{closed_port()}"
    r = runner.invoke(app, ["-n", ns, "group", "reset", "g", "--topic", "T", *extra])
    assert r.exit_code == 2
    assert "exactly one of --to-time TIME, --to-earliest, --to-latest" in r.output


def test_bad_time_is_a_usage_error_before_any_connection():
    ns = f"127.0.0.1:{closed_port()}"
    r = runner.invoke(app, ["-n", ns, "group", "reset", "g", "-t", "T", "--to-time", "soon"])
    assert r.exit_code == 2 and "cannot read time 'soon'" in r.output


def test_a_relative_time_is_taken_as_the_value_not_an_option():
    ns = f"127.0.0.1:{closed_port()}"
    r = runner.invoke(app, ["-n", ns, "group", "reset", "g", "-t", "T", "--to-time", "-15m"])
    assert r.exit_code == 1 and r.stderr.startswith("error: cannot connect")


ROWS = [
    OffsetReset(MessageQueue("T", "broker-a", 0), 10, 4),
    OffsetReset(MessageQueue("T", "broker-a", 1), -1, 0),
]


def test_json_document(capsys):
    render_reset(reset_doc("g", "T", "-15m", ROWS, dry_run=True), as_json=True)
    doc = json.loads(capsys.readouterr().out)
    assert doc["dry_run"] is True and doc["to"] == "-15m"
    assert doc["queues"] == [
        {
            "topic": "T",
            "broker": "broker-a",
            "queue": 0,
            "old_offset": 10,
            "new_offset": 4,
            "moved": -6,
        },
        {
            "topic": "T",
            "broker": "broker-a",
            "queue": 1,
            "old_offset": -1,
            "new_offset": 0,
            "moved": None,
        },
    ]


def test_table_says_old_and_new_per_queue_and_whether_anything_changed(capsys):
    render_reset(reset_doc("g", "T", "earliest", ROWS, dry_run=True), as_json=False)
    out = capsys.readouterr().out
    assert "g would move to earliest (dry run: nothing changed)" in out
    assert "old offset" in out and "new offset" in out
    line = next(ln for ln in out.splitlines() if "broker-a" in ln and " -6" in ln)
    assert "10" in line and "4" in line
    render_reset(reset_doc("g", "T", "latest", ROWS, dry_run=False), as_json=False)
    assert "g moved to latest" in capsys.readouterr().out


class FakeAdmin:
    """Stands in for rmq.Admin: records what `group reset` asks for."""

    calls: list[tuple[str, str, int, bool]] = []

    async def __aenter__(self) -> FakeAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def reset_offset(
        self, group: str, topic: str, timestamp: int, *, dry_run: bool = False
    ) -> list[OffsetReset]:
        self.calls.append((group, topic, timestamp, dry_run))
        return ROWS


@pytest.mark.parametrize(
    ("args", "timestamp"),
    [
        (["--to-time", "now"], -1),  # as mqadmin resetOffsetByTime -s now
        (["--to-latest"], -1),
        (["--to-earliest"], 0),
        (["--to-time", "1700000000000"], 1700000000000),
    ],
)
def test_targets_become_the_timestamps_mqadmin_sends(monkeypatch, args, timestamp):
    import cli.admin.group_reset as mod

    FakeAdmin.calls = []
    monkeypatch.setattr(mod, "open_admin", lambda ctx: FakeAdmin())
    r = runner.invoke(app, ["group", "reset", "g", "-t", "T", *args, "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    assert FakeAdmin.calls == [("g", "T", timestamp, True)]
    doc = json.loads(r.stdout)
    assert doc["dry_run"] is True
    if timestamp > 0:  # a time is shown as ISO-8601 UTC, and given in ms too
        assert (doc["to"], doc["timestamp_ms"]) == ("2023-11-14T22:13:20.000Z", timestamp)
