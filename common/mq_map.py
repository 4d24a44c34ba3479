"""Java's ``Map<MessageQueue, V>`` as fastjson writes it: JSON objects as map keys.

fastjson renders a map whose keys are beans with the key *object* itself in key position
(``{{"brokerName":"b","queueId":0,"topic":"T"}:12}``). That is not strict JSON, but it is what
Java brokers, clients and admin tools send and parse in TopicStatsTable, ConsumeStats,
ResetOffsetBody, GetConsumerStatusBody and ConsumerRunningInfo. `encode_mq_map` writes that
shape (keys with sorted fields, as fastjson does); `parse_mq_map` reads one top-level field of
that shape with the standard decoder's `raw_decode`, one key and one value at a time, and
accepts strict JSON too (keys that are strings holding a JSON object). `parse_value` reads any
body whose maps may have object keys, nested anywhere (GetConsumerStatusBody's
``consumerTable`` is a map of such maps): those maps come back as `MqEntries`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from common.errors import ProtocolError
from common.model import MessageQueue

_WS = " \t\r\n"
_DEC = json.JSONDecoder()


class MqEntries(list[tuple[MessageQueue, Any]]):
    """A map with MessageQueue keys, in the order it was written."""


def mq_key(mq: MessageQueue) -> str:
    return json.dumps(
        {"brokerName": mq.brokerName, "queueId": mq.queueId, "topic": mq.topic},
        separators=(",", ":"),
    )


def encode_mq_map(entries: Iterable[tuple[MessageQueue, Any]]) -> bytes:
    """``{<mq>:<value>,...}``; values as JSON with sorted keys (fastjson's field order)."""
    parts = [
        mq_key(mq) + ":" + json.dumps(value, separators=(",", ":"), sort_keys=True)
        for mq, value in entries
    ]
    return ("{" + ",".join(parts) + "}").encode("utf-8")


def to_mq(value: Any) -> MessageQueue:
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError(f"a MessageQueue key must be an object, not {value!r}")
    try:
        return MessageQueue(str(value["topic"]), str(value["brokerName"]), int(value["queueId"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"bad MessageQueue key {value!r}: {exc}") from None


def parse_mq_map(body: bytes, field: str) -> tuple[dict[str, Any], list[tuple[MessageQueue, Any]]]:
    """(other top-level fields, [(mq, value)]) of a body holding `field: Map<MessageQueue, V>`.

    Raises ProtocolError when the body is neither fastjson's object-keyed map nor strict JSON.
    """
    try:
        doc = parse_value(body)
    except ProtocolError as exc:
        raise ProtocolError(f"cannot parse {field} body: {exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"cannot parse {field} body: not a JSON object")
    others = {k: v for k, v in doc.items() if k != field}
    try:
        return others, as_mq_entries(doc.get(field))
    except ValueError as exc:
        raise ProtocolError(f"cannot parse {field} body: {exc}") from None


def as_mq_entries(value: Any) -> list[tuple[MessageQueue, Any]]:
    """A parsed map as [(mq, value)]: object keys (`MqEntries`) or strict JSON string keys."""
    if value is None:
        return []
    if isinstance(value, MqEntries):
        return list(value)
    if isinstance(value, dict):
        return [(to_mq(k), v) for k, v in value.items()]
    raise ValueError(f"expected a map keyed by MessageQueue, not {type(value).__name__}")


def parse_value(body: bytes | str) -> Any:
    """Any JSON value where maps may have object keys (those become `MqEntries`)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes | bytearray) else body
    try:
        value, i = _value(text, 0, 0)
        if _skip(text, i) != len(text):
            raise ValueError(f"trailing data at {i}")
    except (ValueError, IndexError, RecursionError) as exc:
        raise ProtocolError(str(exc) or "truncated JSON") from None
    return value


_MAX_DEPTH = 64


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _expect(text: str, i: int, ch: str) -> int:
    i = _skip(text, i)
    if i >= len(text) or text[i] != ch:
        raise ValueError(f"expected {ch!r} at {i}")
    return i + 1


def _value(text: str, i: int, depth: int) -> tuple[Any, int]:
    if depth > _MAX_DEPTH:
        raise ValueError("JSON nested too deeply")
    i = _skip(text, i)
    if text[i] == "{":
        return _object(text, i + 1, depth + 1)
    if text[i] == "[":
        out: list[Any] = []
        i = _skip(text, i + 1)
        if text[i] == "]":
            return out, i + 1
        while True:
            v, i = _value(text, i, depth + 1)
            out.append(v)
            i = _skip(text, i)
            if text[i] == ",":
                i += 1
                continue
            return out, _expect(text, i, "]")
    return _DEC.raw_decode(text, i)


def _object(text: str, i: int, depth: int) -> tuple[Any, int]:
    plain: dict[str, Any] = {}
    keyed = MqEntries()
    i = _skip(text, i)
    if text[i] == "}":
        return plain, i + 1
    while True:
        i = _skip(text, i)
        if text[i] == "{":
            key_obj, i = _object(text, i + 1, depth + 1)
            i = _expect(text, i, ":")
            value, i = _value(text, i, depth)
            keyed.append((to_mq(key_obj), value))
        else:
            key, i = _DEC.raw_decode(text, i)
            i = _expect(text, i, ":")
            value, i = _value(text, i, depth)
            plain[str(key)] = value
        i = _skip(text, i)
        if text[i] == ",":
            i += 1
            continue
        i = _expect(text, i, "}")
        if keyed and plain:
            raise ValueError("a map mixes MessageQueue keys and string keys")
        return (keyed if keyed else plain), i
