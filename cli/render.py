"""Output every part of `rmq` shares: consoles, plain lines, the `error:` line, rates, and the
lines of a server that listens, a send result and a consumed message. What one area prints
lives with that area (`cli/admin/render.py`, `cli/local/render.py`, ...).

Nothing in this module talks to the network. Consoles are
made per call so typer's CliRunner (which swaps sys.stdout/sys.stderr) captures the output.
Lines that scripts read (`ready`, message bodies, send results) are printed plainly, without
markup or wrapping, so they stay the same whether stdout is a terminal or a pipe.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from common.message import MessageExt
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


def note(text: str) -> None:
    """A remark on stderr that does not change the outcome (stdout stays the data)."""
    print(text, file=sys.stderr, flush=True)


def rate(value: float | None) -> str:
    """A rate (messages per second) as people read it: whole numbers from 10 on (with
    thousands separators), one decimal below; '-' when unknown."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 10 or value == 0 else f"{value:.1f}"


def listening(what: str, addr: str) -> None:
    _line(f"{what} listening on {addr}")


# --- messages --------------------------------------------------------------------------------


def send_result(result: SendResult) -> None:
    mq = result.message_queue
    _line(
        f"{result.status.name} msgId={result.msg_id} offsetMsgId={result.offset_msg_id} "
        f"queue={mq.brokerName}:{mq.queueId} queueOffset={result.queue_offset}"
    )


def message(
    msg: MessageExt, *, verbose: bool = False, served_by: str = "", broker_id: int = -1
) -> None:
    """A consumed message: its body, or with `verbose` where it came from and its ids.

    `served_by` is the node that answered the pull, `broker_id` its brokerId in the route (0
    the master, else a slave; -1 unknown). The record's own store host is the master that
    stored it, which is wrong once a slave serves it (the master is down, or in DLedger mode
    the leader changed)."""
    body = msg.body.decode("utf-8", errors="replace")
    if not verbose:
        _line(body)
        return
    addr = served_by or f"{msg.store_host[0]}:{msg.store_host[1]}"
    if broker_id >= 0:
        addr += f" brokerId={broker_id} {'master' if broker_id == 0 else 'slave'}"
    _line(
        f"[{msg.topic} {addr} q{msg.queue_id} "
        f"@{msg.queue_offset}] msgId={msg.uniq_key or msg.msg_id} tags={msg.tags or ''} "
        f"keys={msg.keys or ''} body={body}"
    )
