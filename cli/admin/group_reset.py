"""`rmq group reset`: move a consumer group's offsets (mqadmin resetOffsetByTime and
skipAccumulatedMessage, printed as `kafka-consumer-groups --reset-offsets` prints them).

The brokers do the work (INVOKE_BROKER_TO_RESET_OFFSET, `rmq.admin.Admin.reset_offset`): they
set the group's offsets and tell its running members, which drop what they hold and pull on
from the new offsets; a group with no member online starts there next time. A time resolves,
per queue, to the message stored closest to it (RocketMQ's offset-by-time lookup), so
everything stored at or after the time is consumed again.
"""

from __future__ import annotations

import datetime
import re
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.admin.options import JsonOpt, open_admin
from cli.app import _run, examples

if TYPE_CHECKING:
    from rmq.admin_api import OffsetReset

_RELATIVE = re.compile(r"^-(\d+)([smhd])$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# RocketMQ's UtilAll.YYYY_MM_DD_HH_MM_SS_SSS, what mqadmin resetOffsetByTime -s takes
_ROCKETMQ_FORMAT = "%Y-%m-%d#%H:%M:%S:%f"


def parse_time(text: str, now_ms: int | None = None) -> int:
    """Epoch milliseconds of `text`: `now`, epoch ms, `-15m`/`-2h`/`-1d` (before now), an
    ISO-8601 time (local time unless it names a zone) or mqadmin's yyyy-MM-dd#HH:mm:ss:SSS."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    t = text.strip()
    if t == "now":
        return now
    if t.isdigit():
        return int(t)
    m = _RELATIVE.match(t)
    if m:
        return now - int(m.group(1)) * _UNIT_MS[m.group(2)]
    for parse in (
        lambda s: datetime.datetime.fromisoformat(s.replace("Z", "+00:00")),
        lambda s: datetime.datetime.strptime(s, _ROCKETMQ_FORMAT),
    ):
        try:
            dt = parse(t)
        except ValueError:
            continue
        return int(dt.timestamp() * 1000)  # a naive time is local, as mqadmin reads it
    raise ValueError(
        f"cannot read time {text!r}: give epoch milliseconds, 'now', -15m/-2h/-1d, "
        "an ISO time like 2024-05-01T12:00:00 or mqadmin's 2024-05-01#12:00:00:000"
    )


def reset_doc(
    group: str,
    topic: str,
    target: str,
    rows: list[OffsetReset],
    dry_run: bool,
    timestamp: int | None = None,
) -> dict[str, Any]:
    return {
        "group": group,
        "topic": topic,
        "to": target,
        "timestamp_ms": timestamp if timestamp is not None and timestamp > 0 else None,
        "dry_run": dry_run,
        "queues": [
            {
                "topic": r.queue.topic,
                "broker": r.queue.brokerName,
                "queue": r.queue.queueId,
                "old_offset": r.old_offset,
                "new_offset": r.new_offset,
                "moved": r.new_offset - r.old_offset if r.old_offset >= 0 else None,
            }
            for r in rows
        ],
    }


def render_reset(doc: dict[str, Any], *, as_json: bool) -> None:
    import json

    from rich.table import Table

    from cli.render import _console, _line

    if as_json:
        _line(json.dumps(doc, indent=2))
        return
    if doc["dry_run"]:
        title = f"{doc['group']} would move to {doc['to']} (dry run: nothing changed)"
    else:
        title = f"{doc['group']} moved to {doc['to']}"
    table = Table(title=title)
    for col in ("group", "topic", "broker"):
        table.add_column(col)
    for col in ("queue", "old offset", "new offset", "change"):
        table.add_column(col, justify="right")
    for q in doc["queues"]:
        table.add_row(
            doc["group"],
            q["topic"],
            q["broker"],
            str(q["queue"]),
            str(q["old_offset"]) if q["old_offset"] >= 0 else "-",
            str(q["new_offset"]),
            "-" if q["moved"] is None else f"{q['moved']:+d}",
        )
    _console(min_width=100).print(table)


@examples(
    "rmq group reset cg1 --topic Orders --to-time 2024-05-01T12:00:00",
    "rmq group reset cg1 --topic Orders --to-time -15m --dry-run",
    "rmq group reset cg1 --topic Orders --to-earliest",
    "rmq group reset cg1 --topic Orders --to-latest --json   # skip the backlog",
)
def group_reset(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Consumer group.")],
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic whose offsets move.")],
    to_time: Annotated[
        str | None,
        typer.Option(
            "--to-time",
            help="Consume again from this time: epoch ms, -15m/-2h/-1d, an ISO time "
            "(local unless it has a zone) or yyyy-MM-dd#HH:mm:ss:SSS; now = --to-latest.",
        ),
    ] = None,
    to_earliest: Annotated[
        bool, typer.Option("--to-earliest", help="Consume again from the first stored message.")
    ] = False,
    to_latest: Annotated[
        bool,
        typer.Option(
            "--to-latest", help="Skip everything stored (mqadmin skipAccumulatedMessage)."
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the new offsets without changing anything.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Move the group's offsets of a topic to a time, the first or the last message; running
    members are told and consume from there, a stopped group starts there."""
    chosen = [to_time is not None, to_earliest, to_latest]
    if sum(chosen) != 1:
        raise typer.BadParameter(
            "give exactly one of --to-time TIME, --to-earliest, --to-latest",
            param_hint="--to-time/--to-earliest/--to-latest",
        )
    if to_time is not None and to_time.strip() == "now":
        timestamp, target = -1, "now"  # mqadmin resetOffsetByTime -s now: each queue's end
    elif to_time is not None:
        try:
            timestamp = parse_time(to_time)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--to-time") from None
        from cli.admin.render import iso_ms

        target = iso_ms(timestamp) or str(timestamp)
    elif to_earliest:
        timestamp, target = 0, "earliest"
    else:
        timestamp, target = -1, "latest"

    async def main() -> list[OffsetReset]:
        async with open_admin(ctx) as admin:
            return await admin.reset_offset(group, topic, timestamp, dry_run=dry_run)

    rows = _run(main)
    render_reset(reset_doc(group, topic, target, rows, dry_run, timestamp), as_json=as_json)
