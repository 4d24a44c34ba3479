"""`rmq produce` and `rmq consume`: send messages from arguments or stdin lines, and print
the messages of a topic.

Both are thin: the sending and pulling loops are `produce.py` and `consume.py`, the output
`produce_display.py`, `cli/render.py` and, for `consume --json`, `cli/admin/render.py`.
"""

from __future__ import annotations

import signal
import sys
from typing import Annotated, Any, BinaryIO

import typer

from cli.admin.options import JsonOpt
from cli.app import _namesrv, _run, examples
from cli.errors import INTERRUPTED

# Beyond this many stdin lines (stdin not a terminal), `rmq produce` shows a progress bar.
PROGRESS_THRESHOLD = 1000


@examples(
    "rmq produce --topic TopicTest hello world       # two messages",
    "printf 'a\\nb\\n' | rmq produce --topic TopicTest  # one message per line",
    "rmq produce --topic TopicTest --tags TagA --keys order-1 'payload'",
    "seq 100000 | rmq produce -t TopicTest --json > results.json   # progress bar on stderr",
    "tail -f app.log | rmq produce -t Logs           # each line sent as it arrives",
    "rmq produce -t Orders --transaction commit 'order 1'     # half message, then commit",
    "rmq produce -t Orders --transaction unknown --check-answer rollback 'order 2'",
)
def produce(
    ctx: typer.Context,
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic.")],
    tags: Annotated[str | None, typer.Option("--tags", help="Message tag.")] = None,
    keys: Annotated[
        str | None, typer.Option("--keys", help="Message keys (space separated).")
    ] = None,
    group: Annotated[
        str, typer.Option("--group", "-g", help="Producer group.")
    ] = "rmq-cli-producer",
    delay_level: Annotated[
        int, typer.Option("--delay-level", min=0, max=18, help="1..18, 0 = none.")
    ] = 0,
    deliver_at: Annotated[
        str | None,
        typer.Option(
            "--deliver-at",
            metavar="TIME",
            help="Deliver at TIME (epoch ms, or ISO 8601 such as 2026-01-02T15:04:05Z): a "
            "RocketMQ 5 timer message (TIMER_DELIVER_MS), to the second, up to the broker's "
            "timerMaxDelaySec (3 days by default).",
        ),
    ] = None,
    delay_sec: Annotated[
        float | None,
        typer.Option(
            "--delay-sec",
            min=0,
            metavar="N",
            help="Deliver after N seconds (a RocketMQ 5 timer message).",
        ),
    ] = None,
    prop: Annotated[
        list[str] | None,
        typer.Option("--property", "-P", metavar="K=V", help="User property K=V (repeatable)."),
    ] = None,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress",
            help="Progress bar on stderr instead of one line per message (default, when "
            f"stdin is not a terminal: once more than {PROGRESS_THRESHOLD} lines were read "
            "or stdin stays open longer than a second).",
        ),
    ] = None,
    allow_not_replicated: Annotated[
        bool,
        typer.Option(
            "--allow-not-replicated",
            help="Exit 0 even when the broker stored a message without the replication or "
            "flush it was configured to wait for (SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT, "
            "FLUSH_DISK_TIMEOUT). Default: say so on stderr and exit 1.",
        ),
    ] = False,
    as_json: JsonOpt = False,
    transaction: Annotated[
        str | None,
        typer.Option(
            "--transaction",
            metavar="commit|rollback|unknown",
            help="Send each message in a transaction (a half message, then this outcome of "
            "the local transaction; unknown leaves it to the broker's check-back).",
        ),
    ] = None,
    check_answer: Annotated[
        str | None,
        typer.Option(
            "--check-answer",
            metavar="commit|rollback|unknown",
            help="With --transaction: stay connected and answer the broker's check-backs "
            "with this (it checks every transactionCheckInterval, 60 s by default).",
        ),
    ] = None,
    check_wait: Annotated[
        float,
        typer.Option(
            "--check-wait", min=0, help="Seconds to wait for the check-backs (--check-answer)."
        ),
    ] = 90.0,
    bodies: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="BODY...", help="Message bodies; without any, one message per stdin line."
        ),
    ] = None,
) -> None:
    """Send messages (arguments, or stdin lines), print each SendResult and a summary line.

    Stdin lines are sent as they arrive, in batches (up to 512 lines, several batches in
    flight), so `tail -f log | rmq produce` works; empty lines are skipped. Within a queue
    the messages keep the order of the lines. With a progress bar the per-message lines are
    left out; --json prints one document with every result instead.
    """
    from cli import render
    from cli.messages import produce_display
    from cli.messages.produce import MessageTemplate, ProduceStats
    from cli.messages.produce import produce as produce_lines

    properties: dict[str, str] = {}
    for item in prop or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise typer.BadParameter(f"expected K=V, got {item!r}", param_hint="--property")
        properties[k] = v
    from_stdin = not bodies
    at_ms = _deliver_at_ms(deliver_at)
    if sum((at_ms is not None, delay_sec is not None, delay_level > 0)) > 1:
        raise typer.BadParameter("use one of --deliver-at, --delay-sec and --delay-level")
    if transaction is not None and (at_ms is not None or delay_sec is not None):
        raise typer.BadParameter(
            "transactional messages cannot have a delivery time", param_hint="--transaction"
        )
    if transaction is not None or check_answer is not None:
        _produce_in_transaction(
            ctx,
            topic,
            {"tags": tags, "keys": keys, "properties": properties, "delay_level": delay_level},
            bodies,
            group=group,
            transaction=transaction,
            check_answer=check_answer,
            check_wait=check_wait,
            as_json=as_json,
        )
        return
    if as_json:
        mode = "json"
    elif progress is not None:
        mode = "bar" if progress else "lines"
    else:
        mode = "auto" if from_stdin and not _stdin_is_tty() else "lines"
    template = MessageTemplate(
        topic,
        tags=tags,
        keys=keys,
        properties=properties,
        delay_level=delay_level,
        deliver_at=at_ms,
        delay=delay_sec,
    )
    stats = ProduceStats()

    async def main() -> tuple[ProduceStats, float]:
        import trio

        started = trio.current_time()
        display = produce_display.ProduceDisplay(
            topic, stats, mode=mode, threshold=PROGRESS_THRESHOLD
        )
        try:
            await produce_lines(
                _namesrv(ctx),
                template,
                group=group,
                stream=_stdin_bytes() if from_stdin else None,
                bodies=bodies or (),
                stats=stats,
                on_results=display.results,
                on_sent=display.sent,
            )
        finally:
            seconds = trio.current_time() - started
            display.close(seconds)
        if stats.sent:
            display.summary(seconds)
        return stats, seconds

    stats, _seconds = _run(main)
    if stats.stopped_by == signal.SIGINT:  # what was read is sent and shown: Ctrl-C's status
        raise typer.Exit(INTERRUPTED)
    if stats.refused is not None:  # after the lines sent before it were shown
        render.error(str(stats.refused))
        raise typer.Exit(1)
    if not stats.sent:
        render.error("nothing to send: give BODY arguments or lines on stdin")
        raise typer.Exit(1)
    if stats.not_durable and not allow_not_replicated:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(stats.statuses.items()))
        render.error(
            f"{stats.not_durable} of {stats.sent} message(s) were stored without the "
            f"replication or flush the broker waits for ({parts}); "
            "--allow-not-replicated accepts that"
        )
        raise typer.Exit(1)


def new_group_note(group: str, topic: str, stored: int) -> str:
    return (
        f"note: group {group} is new on {topic} and starts at the end; "
        f"--from-beginning reads the {stored} stored message(s)"
    )


# stdin lines one `rmq produce --transaction` reads (all before sending: a check-back must
# not wait behind a blocked read)
MAX_TRANSACTION_LINES = 1000


def _outcome(value: str | None, option: str) -> Any:
    from cli.messages.transaction import Outcome

    if value is None:
        return None
    try:
        return Outcome(value.lower())
    except ValueError:
        raise typer.BadParameter(
            f"expected commit, rollback or unknown, got {value!r}", param_hint=option
        ) from None


def _deliver_at_ms(text: str | None) -> int | None:
    """--deliver-at: epoch ms, or an ISO 8601 time (no zone: local time)."""
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    import datetime

    try:
        return int(datetime.datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise typer.BadParameter(
            f"expected epoch ms or an ISO 8601 time, got {text!r}", param_hint="--deliver-at"
        ) from None


def _produce_in_transaction(
    ctx: typer.Context,
    topic: str,
    options: dict[str, Any],
    bodies: list[str] | None,
    *,
    group: str,
    transaction: str | None,
    check_answer: str | None,
    check_wait: float,
    as_json: bool,
) -> None:
    """`rmq produce --transaction`: one transaction per message (cli/messages/transaction.py)."""
    import json

    from cli import render
    from cli.messages.produce_display import send_result_doc
    from cli.messages.transaction import produce_in_transaction
    from rmq import Message

    outcome = _outcome(transaction, "--transaction")
    answer = _outcome(check_answer, "--check-answer")
    if outcome is None:
        raise typer.BadParameter("needs --transaction", param_hint="--check-answer")
    if options["delay_level"]:
        raise typer.BadParameter(
            "transactional messages cannot be delayed", param_hint="--delay-level"
        )
    lines: list[bytes] = [b.encode() for b in bodies or []]
    if not lines:
        for raw in _stdin_bytes():
            line = raw.rstrip(b"\r\n")
            if line:
                lines.append(line)
            if len(lines) > MAX_TRANSACTION_LINES:
                render.error(f"--transaction sends at most {MAX_TRANSACTION_LINES} messages")
                raise typer.Exit(1)
    if not lines:
        render.error("nothing to send: give BODY arguments or lines on stdin")
        raise typer.Exit(1)
    msgs = [Message(topic, line, **options) for line in lines]
    for m in msgs:
        m.validate()  # a bad topic or property is said before connecting
    docs: list[dict[str, Any]] = []

    def on_result(r: Any) -> None:
        if as_json:
            docs.append(send_result_doc(r) | {"transaction": r.local_transaction_state.name})
        else:
            render.send_result(r)
            render._line(f"  transaction {r.msg_id}: {r.local_transaction_state.name}")

    def on_check(msg: Any, state: Any) -> None:
        if not as_json:
            render._line(f"  check-back for {msg.uniq_key}: answered {state.name}")

    async def main() -> Any:
        return await produce_in_transaction(
            _namesrv(ctx),
            msgs,
            group=group,
            outcome=outcome,
            check_answer=answer,
            check_wait=check_wait,
            on_result=on_result,
            on_check=on_check,
        )

    run = _run(main)
    if as_json:
        checks = {k: v.name for k, v in run.checks.items()}
        print(json.dumps({"topic": topic, "results": docs, "check_backs": checks}, indent=2))
    left = run.unresolved()
    if answer is not None and left:
        render.error(
            f"{len(left)} transaction(s) not checked back within {check_wait:g} s: the broker "
            "asks the group again later (transactionCheckInterval)"
        )
        raise typer.Exit(1)


def _stdin_is_tty() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def _stdin_bytes() -> BinaryIO:
    """Stdin as a binary stream (typer's CliRunner gives a text wrapper over bytes too); a
    stand-in stdin without a buffer is taken to be a byte stream itself."""
    stdin: Any = sys.stdin  # whatever was put in its place: its type is not known here
    stream: BinaryIO = stdin.buffer if hasattr(stdin, "buffer") else stdin
    return stream


@examples(
    "rmq consume --topic TopicTest --from-beginning   # everything, then exit",
    "rmq consume --topic TopicTest -f                 # new messages, until Ctrl-C",
    "rmq consume --topic TopicTest --from-beginning --count 10 --json",
    "rmq consume --topic TopicTest --group cg1 --tags 'TagA||TagB' -v -f",
    "rmq consume --topic Orders --sql \"TAGS = 'paid' AND amount > 100\" --from-beginning",
)
def consume(
    ctx: typer.Context,
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic.")],
    group: Annotated[
        str, typer.Option("--group", "-g", help="Consumer group.")
    ] = "rmq-cli-consumer",
    from_beginning: Annotated[
        bool,
        typer.Option(
            "--from-beginning", help="Start at the oldest message, not the group's offset."
        ),
    ] = False,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Keep waiting for new messages until Ctrl-C. Default: stop once "
            "every queue is caught up.",
        ),
    ] = False,
    count: Annotated[
        int | None, typer.Option("--count", "-c", min=1, help="Stop after N messages.")
    ] = None,
    tags: Annotated[str, typer.Option("--tags", help="Tag expression: '*' or 'A||B'.")] = "*",
    sql: Annotated[
        str | None,
        typer.Option(
            "--sql",
            help="SQL92 expression over the message properties (TAGS among them), evaluated by "
            "the broker; it needs enablePropertyFilter=true (docs/sql92.md).",
        ),
    ] = None,
    idle_timeout: Annotated[
        float | None,
        typer.Option("--idle-timeout", help="Stop after this many seconds without a message."),
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Show queue, offset, ids, tags, and the node that served each message: "
            "address, brokerId and role (master, or slave: a DLedger follower serves only "
            "committed entries, docs/guarantees.md).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Pull messages from every queue of a topic and print them (one line each).

    Starts at the group's committed offset (the queue's end for a new group) or, with
    --from-beginning, at the oldest message. Without --follow it stops when every queue is
    caught up; with it, it waits for new messages until Ctrl-C (or --count / --idle-timeout).
    The group's offsets are committed on the way out, so the next run continues from there.
    """
    from cli import render
    from cli.admin.render import consumed_json

    collected: list[Any] = []
    # the node that answered the pull whose messages are being printed, and its brokerId
    served: dict[str, Any] = {"by": "", "id": -1}

    def on_message(m: Any) -> None:
        if as_json:
            collected.append(m)
        else:
            render.message(m, verbose=verbose, served_by=served["by"], broker_id=served["id"])

    skipped: list[int] = []  # the new group's skipped messages, told once (see below)
    stopped_by: list[int] = []  # the signal that ended the run (offsets are committed)

    def on_new_group(n: int) -> None:
        skipped.append(n)
        if follow:  # waiting for new messages: say now why the stored ones are not shown
            render.note(new_group_note(group, topic, n))

    async def main() -> int:
        from cli.messages.consume import consume_topic

        return await consume_topic(
            _namesrv(ctx),
            topic,
            group=group,
            from_beginning=from_beginning,
            count=count,
            tags=tags,
            sql=sql,
            idle_timeout=idle_timeout,
            on_message=on_message,
            follow=follow,
            served_by=lambda addr, broker_id: served.update(by=addr, id=broker_id),
            on_new_group=on_new_group,
            on_signal=stopped_by.append,
        )

    handed = _run(main)
    if skipped and not follow and handed == 0:
        render.note(new_group_note(group, topic, skipped[0]))
    if as_json:
        consumed_json(topic, collected)
    if signal.SIGINT in stopped_by:
        raise typer.Exit(INTERRUPTED)
