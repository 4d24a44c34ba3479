"""Offsets of the "rocketmq" source: per (topic, broker, queue), pure functions only.

Theory of operation: a position in a topic is one consume-queue offset per message queue,
keyed `QueueKey(topic, broker, queue_id)`. Users and Spark's checkpoint see them as JSON in
the Kafka connector's shape, keyed by "broker/queue" because a RocketMQ queue id is only unique
within its broker:

    {"orders": {"broker-a/0": 123, "broker-b/3": -2}}

In startingOffsets/endingOffsets, -2 means the queue's earliest (min) offset and -1 its latest
(max) offset, as Kafka's -2/-1. A range [start, end) per queue is what a Spark partition reads;
ranges longer than `max_offsets_per_partition` are split so both cores get work.

`rate_limit` is maxOffsetsPerTrigger: the allowance is split across queues in proportion to
their backlog (as Kafka's rateLimit), with the rounding remainder handed out by largest
fraction so the micro-batch never exceeds the limit and no queue with a backlog starves forever.

`data_loss` states why a queue's planned offset cannot be read: below the queue's min offset
(retention deleted it) or above its max offset (the broker's store was replaced or truncated).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Literal, NamedTuple

import attrs

from pipeline.errors import OptionError

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "QueueKey",
    "QueueRange",
    "data_loss",
    "format_key",
    "offsets_from_json",
    "offsets_to_json",
    "parse_key",
    "parse_offset_spec",
    "rate_limit",
    "resolve_offset",
    "split_range",
]

EARLIEST = -2
LATEST = -1


class QueueKey(NamedTuple):
    topic: str
    broker: str
    queue_id: int


OffsetSpec = Literal["earliest", "latest"] | dict[QueueKey, int]


class _SpecError(ValueError):
    pass


def _option_error(option: str, msg: str) -> Exception:
    return OptionError(f"option {option}: {msg}")


def format_key(broker: str, queue_id: int) -> str:
    return f"{broker}/{queue_id}"


def parse_key(key: str) -> tuple[str, int]:
    """'broker-a/3' -> ('broker-a', 3); ValueError for anything else."""
    broker, sep, qid = key.rpartition("/")
    if not sep or not broker or not qid.isdigit():
        raise ValueError(f"{key!r} is not 'brokerName/queueId'")
    return broker, int(qid)


def offsets_to_json(offsets: Mapping[QueueKey, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for key in sorted(offsets):
        out.setdefault(key.topic, {})[format_key(key.broker, key.queue_id)] = int(offsets[key])
    return out


def offsets_from_json(obj: object) -> dict[QueueKey, int]:
    """The inverse of `offsets_to_json`; ValueError naming the bad part otherwise."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object of topics, got {type(obj).__name__}")
    out: dict[QueueKey, int] = {}
    for topic, queues in obj.items():
        if not isinstance(queues, dict):
            raise ValueError(
                f'topic {topic!r} must map to an object like {{"broker-a/0": 123}}, '
                f"got {json.dumps(queues)}"
            )
        for key, value in queues.items():
            broker, qid = parse_key(key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"offset of {topic} {key} must be an integer, got {value!r}")
            out[QueueKey(topic, broker, qid)] = value
    return out


def parse_offset_spec(raw: str, option: str) -> OffsetSpec:
    """'earliest' | 'latest' | the JSON form; errors name `option`."""
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()  # type: ignore[return-value]
    if not text.startswith("{"):
        raise _option_error(
            option,
            f'expected earliest, latest or JSON like {{"topic":{{"broker-a/0":123}}}}, got {raw!r}',
        )
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _option_error(
            option, f"malformed JSON ({exc.msg} at char {exc.pos}): {raw}"
        ) from None
    try:
        spec = offsets_from_json(obj)
    except ValueError as exc:
        raise _option_error(option, str(exc)) from None
    for key, value in spec.items():
        if value < EARLIEST:
            raise _option_error(
                option,
                f"offset {value} of {key.topic} {format_key(key.broker, key.queue_id)} "
                "is negative (only -2 = earliest and -1 = latest are special)",
            )
    return spec


def resolve_offset(
    spec: OffsetSpec, key: QueueKey, qmin: int, qmax: int, *, missing: Literal["earliest", "latest"]
) -> int:
    """The concrete offset `spec` means for `key`; queues the JSON does not name get `missing`."""
    if isinstance(spec, str):
        value = EARLIEST if spec == "earliest" else LATEST
    else:
        value = spec.get(key, EARLIEST if missing == "earliest" else LATEST)
    if value == EARLIEST:
        return qmin
    if value == LATEST:
        return qmax
    return value


@attrs.frozen
class QueueRange:
    topic: str
    broker: str
    queue_id: int
    start: int  # first queue offset to read
    end: int  # one past the last

    @property
    def key(self) -> QueueKey:
        return QueueKey(self.topic, self.broker, self.queue_id)

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def split_range(r: QueueRange, max_size: int) -> list[QueueRange]:
    """`r` in pieces of at most `max_size` offsets (empty ranges give nothing)."""
    if max_size < 1:
        raise ValueError("max_size must be >= 1")
    out = []
    start = r.start
    while start < r.end:
        end = min(r.end, start + max_size)
        out.append(attrs.evolve(r, start=start, end=end))
        start = end
    return out


def rate_limit(
    start: Mapping[QueueKey, int], latest: Mapping[QueueKey, int], limit: int
) -> dict[QueueKey, int]:
    """End offsets that read at most `limit` messages in total, split by backlog."""
    backlog = {k: max(0, latest[k] - start.get(k, latest[k])) for k in latest}
    total = sum(backlog.values())
    if total <= limit:
        return dict(latest)
    shares: dict[QueueKey, int] = {}
    fractions: list[tuple[float, QueueKey]] = []
    for key, size in backlog.items():
        exact = limit * size / total
        shares[key] = int(exact)
        fractions.append((exact - int(exact), key))
    left = limit - sum(shares.values())
    # largest remainder first; ties by key so the outcome is deterministic
    for _frac, key in sorted(fractions, key=lambda fk: (-fk[0], fk[1]))[:left]:
        if shares[key] < backlog[key]:
            shares[key] += 1
    return {k: (start.get(k, latest[k]) + shares[k]) if backlog[k] else latest[k] for k in latest}


def data_loss(key: QueueKey, offset: int, qmin: int, qmax: int) -> str | None:
    """Why `offset` of `key` cannot be read any more, or None when it can."""
    where = f"{key.topic} {format_key(key.broker, key.queue_id)}"
    if offset < qmin:
        return (
            f"{where}: offsets {offset}..{qmin - 1} are gone (the queue now starts at {qmin}; "
            "removed by retention?)"
        )
    if offset > qmax:
        return (
            f"{where}: offset {offset} is past the queue's max offset {qmax} (the broker's "
            "store was replaced or truncated?)"
        )
    return None
