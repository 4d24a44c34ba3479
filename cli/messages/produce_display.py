"""What `rmq produce` prints: per-message lines or a progress bar, the summary, or one JSON
document streamed as results come in (see `produce.py` for how lines are read and sent)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from cli.render import _line

if TYPE_CHECKING:
    from rmq.producer import SendResult


def send_result_doc(r: SendResult) -> dict[str, Any]:
    mq = r.message_queue
    return {
        "status": r.status.name,
        "msg_id": r.msg_id,
        "offset_msg_id": r.offset_msg_id,
        "broker": mq.brokerName,
        "queue": mq.queueId,
        "queue_offset": r.queue_offset,
    }


def produce_summary(topic: str, sent: int, seconds: float, statuses: dict[str, int]) -> str:
    rate = f", {sent / seconds:,.0f} msg/s" if seconds > 0 and sent else ""
    parts = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
    return f"sent {sent} message(s) to {topic} in {seconds:.2f}s{rate}" + (
        f" ({parts})" if parts else ""
    )


def auto_create_note(topic: str, queues: list[Any]) -> str:
    """Said once, when the first message to a topic the nameserver did not know was stored:
    the broker created it (autoCreateTopicEnable) with the auto-create topic's queue count."""
    per_broker: dict[str, int] = {}
    for mq in queues:
        per_broker[mq.brokerName] = per_broker.get(mq.brokerName, 0) + 1
    where = ", ".join(f"{n} queue(s) on {b}" for b, n in sorted(per_broker.items()))
    return (
        f"note: topic {topic} did not exist; the broker created it with the first message "
        f"(autoCreateTopicEnable): {where}. `rmq topic create {topic} --queues N` creates "
        "a topic beforehand with the queues you choose."
    )


class ProduceDisplay:
    """What `rmq produce` shows while it sends, in one of four modes.

    * "lines": one line per message as its answer comes (`render.send_result`).
    * "bar": a progress bar on stderr; its total is known once the input ended.
    * "auto": stdin lines. Answers are held (at most `threshold` of them) while the input is
      small and quick: at its end they are printed as "lines". Once more than `threshold`
      lines were read, or the input stays open for `patience` seconds (`tail -f log | rmq
      produce`), it becomes "bar" and the held answers are only counted.
    * "json": one JSON document on stdout, streamed: results as they come, then the totals
      (`close` ends the document even when the run failed, so stdout stays valid JSON).

    Called from the Trio thread (`results`, `sent`); `close` and `summary` after the run.
    """

    def __init__(
        self, topic: str, stats: Any, *, mode: str, threshold: int = 1000, patience: float = 1.0
    ) -> None:
        import trio

        self.topic = topic
        self.stats = stats  # cli.messages.produce.ProduceStats, filled by the send loop
        self.mode = mode
        self.threshold = threshold
        self.patience = patience
        self._started = trio.current_time()
        # auto mode: answers not printed yet; None once the bar took over
        self._held: list[SendResult] | None = []
        self._bar: Any = None  # (rich Progress, task id) while a bar is shown
        self._json_count = 0
        self._said_auto_create = False
        if mode == "json":
            head = json.dumps(self.topic, ensure_ascii=False)
            print(f'{{\n  "topic": {head},\n  "results": [', end="")
        elif mode == "bar":
            self._start_bar()

    def results(self, results: list[SendResult]) -> None:
        if self.mode == "lines":
            from cli import render

            for r in results:
                render.send_result(r)
        elif self.mode == "json":
            parts = []
            for r in results:
                doc = json.dumps(send_result_doc(r), indent=2, ensure_ascii=False)
                parts.append(("," if self._json_count else "") + "\n" + _indent(doc, 4))
                self._json_count += 1
            print("".join(parts), end="", flush=True)
        elif self.mode == "auto" and self._held is not None:
            self._held.extend(results)
            self._maybe_switch()

    def sent(self, n: int) -> None:
        if self.stats.auto_created and not self._said_auto_create:
            self._said_auto_create = True
            self._note(auto_create_note(self.topic, self.stats.auto_created))
        if self.mode == "auto" and self._held is not None:
            self._maybe_switch()
        if self._bar is not None:
            bar, task = self._bar
            total = self.stats.lines_read if self.stats.input_done else None
            bar.update(task, completed=self.stats.sent, total=total)

    def _note(self, text: str) -> None:
        """A line on stderr, above the bar when one is shown."""
        if self._bar is not None:
            self._bar[0].console.print(text, highlight=False, markup=False, soft_wrap=True)
        else:
            import sys

            print(text, file=sys.stderr, flush=True)

    def _maybe_switch(self) -> None:
        import trio

        if self.stats.lines_read > self.threshold or (
            not self.stats.input_done and trio.current_time() - self._started >= self.patience
        ):
            self._held = None
            self._start_bar()

    def _start_bar(self) -> None:
        import sys

        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        bar = Progress(
            TextColumn("sending"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            console=Console(file=sys.stderr),
            transient=False,
        )
        task = bar.add_task("send", total=None, completed=self.stats.sent)
        bar.start()
        self._bar = (bar, task)

    def close(self, seconds: float) -> None:
        """Stop the bar (showing the final count); end the JSON document."""
        if self._bar is not None:
            bar, task = self._bar
            bar.update(task, completed=self.stats.sent, total=self.stats.lines_read)
            bar.stop()
            self._bar = None
        if self.mode == "json":
            tail = {
                "sent": self.stats.sent,
                "seconds": round(seconds, 3),
                "statuses": dict(sorted(self.stats.statuses.items())),
            }
            body = json.dumps(tail, indent=2, ensure_ascii=False)[1:-2]  # without the braces
            print(("\n  ]," if self._json_count else "],") + body + "\n}", flush=True)
            self.mode = "closed"

    def summary(self, seconds: float) -> None:
        """The summary line (not with --json), after the held answers of a small input."""
        if self.mode == "auto" and self._held is not None:
            from cli import render

            for r in self._held:
                render.send_result(r)
            self._held = None
        if self.mode != "closed":
            _line(produce_summary(self.topic, self.stats.sent, seconds, self.stats.statuses))


def _indent(text: str, n: int) -> str:
    pad = " " * n
    return "\n".join(pad + line for line in text.splitlines())
