"""The chaos harness's checker: a history of sends and faults, and what the store served.

Pure (no I/O): the harness (run.py) records every send with a unique id, its queue, its
place in that queue's send order and its outcome, every fault with its start and end, and at
the end every message the cluster serves.  :func:`check` then reports, as a Jepsen-style checker
does for a queue:

* **lost**: acknowledged (SEND_OK) but not served in the queue it was sent to;
* **duplicates**: an id served more than once (the harness never sends one twice);
* **order violations**: within a queue, an acknowledged message served after one sent later
  (by the one producer of that queue, which sends one message at a time);
* **unacknowledged but delivered**: failed or timed-out sends that were stored anyway (allowed:
  the answer was lost, not the message; counted);
* **recovery time** after each fault: from its end to the next acknowledged send.

A failing report carries the seed and, for each broken promise, the excerpt of the history
around it (the sends of that queue nearby and the faults in force), so it can be replayed.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Iterable

import attrs


class Outcome(enum.Enum):
    ACKED = "acked"  # SEND_OK
    FAILED = "failed"  # a clear refusal (any other code)
    UNKNOWN = "unknown"  # a timeout or a lost connection: stored or not, nobody knows


@attrs.frozen
class Send:
    id: int
    queue: int
    seq: int  # place in its queue's send order
    sent_at: float
    answered_at: float
    outcome: Outcome
    detail: str = ""


@attrs.frozen
class Fault:
    kind: str  # one of schedule.FAULT_KINDS
    node: str  # a node, or two joined by "-" for a link
    start: float
    end: float
    detail: str = ""  # the fault's parameters (a delay, the bytes torn), for the excerpt


@attrs.frozen
class Served:
    queue: int
    offset: int
    id: int


@attrs.frozen
class Report:
    seed: int
    mode: str
    acked: int
    lost: tuple[int, ...]
    duplicates: tuple[int, ...]
    order_violations: tuple[tuple[int, int, int], ...]  # (queue, earlier id, later id)
    unacked_delivered: int
    recovery: tuple[tuple[str, float | None], ...]  # (fault, seconds to the next ack)
    excerpts: tuple[str, ...] = ()
    faults: tuple[Fault, ...] = ()  # as injected, in order, with their parameters
    # why the schedule ended without a check (the cluster never took a write); "" when checked
    failure: str = ""

    @property
    def ok(self) -> bool:
        # the harness never sends an id twice: a duplicate is the broker's doing
        return not (self.failure or self.lost or self.order_violations or self.duplicates)

    def summary(self) -> str:
        rec = ", ".join(f"{f} {'never' if s is None else f'{s:.2f}s'}" for f, s in self.recovery)
        lines = [
            f"seed {self.seed} mode {self.mode}: {self.acked} acknowledged, "
            f"{len(self.lost)} lost, {len(self.duplicates)} duplicated, "
            f"{len(self.order_violations)} out of order, "
            f"{self.unacked_delivered} delivered though not acknowledged",
            f"  recovery: {rec or 'no faults'}",
        ]
        if self.failure:
            lines.insert(1, f"  FAILED, not checked: {self.failure}")
        lines.extend(self.excerpts)
        return "\n".join(lines)


def failed(
    seed: int, mode: str, why: str, sends: Iterable[Send], faults: Iterable[Fault]
) -> Report:
    """A schedule that could not be checked: what was acknowledged and injected, and why."""
    acked = sum(1 for s in sends if s.outcome is Outcome.ACKED)
    faults = tuple(sorted(faults, key=lambda f: f.start))
    recovery = tuple((f"{f.kind} {f.node}", None) for f in faults)
    return Report(seed, mode, acked, (), (), (), 0, recovery, failure=why, faults=faults)


def check(
    seed: int, mode: str, sends: Iterable[Send], faults: Iterable[Fault], served: Iterable[Served]
) -> Report:
    sends = list(sends)
    faults = sorted(faults, key=lambda f: f.start)
    by_id = {s.id: s for s in sends}
    seen: dict[int, int] = {}
    per_queue: dict[int, list[Served]] = {}
    for m in served:
        seen[m.id] = seen.get(m.id, 0) + 1
        per_queue.setdefault(m.queue, []).append(m)
    acked = [s for s in sends if s.outcome is Outcome.ACKED]
    # served in the queue it was sent to, or lost
    placed = {(m.queue, m.id) for q in per_queue.values() for m in q}
    lost = tuple(sorted(s.id for s in acked if (s.queue, s.id) not in placed))
    duplicates = tuple(sorted(i for i, n in seen.items() if n > 1))
    violations = []
    for queue, got in sorted(per_queue.items()):
        last: Send | None = None
        done: set[int] = set()
        for m in sorted(got, key=lambda m: m.offset):
            s = by_id.get(m.id)
            # order is promised among acknowledged sends only: a send that timed out (say,
            # against a paused master) may still land after the next one, sent on a new
            # connection
            if s is None or s.outcome is not Outcome.ACKED or m.id in done:
                continue
            done.add(m.id)
            if last is not None and s.seq < last.seq:
                violations.append((queue, last.id, s.id))
            if last is None or s.seq > last.seq:
                last = s
    unacked = sum(1 for s in sends if s.outcome is not Outcome.ACKED and s.id in seen)
    recovery = []
    for f in faults:
        after = [s.answered_at for s in acked if s.sent_at >= f.end]
        recovery.append((f"{f.kind} {f.node}", min(after) - f.end if after else None))
    excerpts = [_excerpt(by_id[i], sends, faults, "LOST") for i in lost[:5]]
    excerpts += [
        _excerpt(by_id[b], sends, faults, f"OUT OF ORDER after id {a}")
        for _q, a, b in violations[:5]
    ]
    return Report(
        seed,
        mode,
        len(acked),
        lost,
        duplicates,
        tuple(violations),
        unacked,
        tuple(recovery),
        tuple(excerpts),
        tuple(faults),
    )


def _excerpt(send: Send, sends: list[Send], faults: list[Fault], what: str) -> str:
    near = [s for s in sends if s.queue == send.queue and abs(s.seq - send.seq) <= 3]
    lines = [f"  {what}: id {send.id} (queue {send.queue}, seq {send.seq})"]
    for s in sorted(near, key=lambda s: s.seq):
        mark = "->" if s.id == send.id else "  "
        lines.append(
            f"    {mark} t={s.sent_at:7.3f}..{s.answered_at:7.3f} id {s.id} seq {s.seq} "
            f"{s.outcome.value} {s.detail}"
        )
    for f in faults:
        if f.start <= send.answered_at and f.end >= send.sent_at - 1.0:
            lines.append(
                f"    fault {f.kind} {f.node} t={f.start:7.3f}..{f.end:7.3f} {f.detail}".rstrip()
            )
    return "\n".join(lines)


def recovery_by_kind(reports: Iterable[Report]) -> dict[str, dict[str, float | int | None]]:
    """Per fault kind over many reports: how many faults, how many never recovered, and the
    median and max of the recovery times of the others."""
    times: dict[str, list[float | None]] = {}
    for report in reports:
        for label, took in report.recovery:
            times.setdefault(label.split(" ", 1)[0], []).append(took)
    out: dict[str, dict[str, float | int | None]] = {}
    for kind, all_secs in sorted(times.items()):
        secs = sorted(s for s in all_secs if s is not None)
        out[kind] = {
            "faults": len(all_secs),
            "never": len(all_secs) - len(secs),
            "median": statistics.median(secs) if secs else None,
            "max": secs[-1] if secs else None,
        }
    return out
