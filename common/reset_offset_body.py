"""Offset tables by queue on the wire: ResetOffsetBody (and its C++ form), GetConsumerStatusBody.

RocketMQ 4.9 ``common/protocol/body/ResetOffsetBody.java`` is ``{"offsetTable": Map<MessageQueue,
Long>}`` in fastjson's object-keyed shape (`common.mq_map`); the broker answers
INVOKE_BROKER_TO_RESET_OFFSET with it and pushes it to Java clients in
RESET_CONSUMER_CLIENT_OFFSET. The C++ client (rocketmq-client-cpp 1.x/2.x
``ResetOffsetBody::Decode``) cannot read object keys and expects ``ResetOffsetBodyForC``: the
same table as a list of ``{"brokerName","offset","queueId","topic"}`` objects.
`decode_offset_table` reads either form, so our client never depends on which one came.

``GetConsumerStatusBody`` carries ``messageQueueTable`` (a client's answer to
GET_CONSUMER_STATUS_FROM_CLIENT: its in-memory offsets of one topic) and ``consumerTable``
(the broker's merged answer to INVOKE_BROKER_TO_GET_CONSUMER_STATUS: client id -> that table).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from common.errors import ProtocolError
from common.model import MessageQueue
from common.mq_map import MqEntries, as_mq_entries, encode_mq_map, parse_value

OffsetTable = dict[MessageQueue, int]


def _sorted(table: Mapping[MessageQueue, int]) -> list[tuple[MessageQueue, int]]:
    return sorted(table.items(), key=lambda kv: (kv[0].topic, kv[0].brokerName, kv[0].queueId))


def encode_reset_offset_body(table: Mapping[MessageQueue, int]) -> bytes:
    return b'{"offsetTable":' + encode_mq_map(_sorted(table)) + b"}"


def encode_reset_offset_body_for_c(table: Mapping[MessageQueue, int]) -> bytes:
    rows = [
        {"brokerName": mq.brokerName, "offset": off, "queueId": mq.queueId, "topic": mq.topic}
        for mq, off in _sorted(table)
    ]
    return json.dumps({"offsetTable": rows}, separators=(",", ":")).encode("utf-8")


def _table(value: Any, what: str) -> OffsetTable:
    out: OffsetTable = {}
    try:
        if isinstance(value, list) and not isinstance(value, MqEntries):  # ResetOffsetBodyForC
            for row in value:
                mq = MessageQueue(str(row["topic"]), str(row["brokerName"]), int(row["queueId"]))
                out[mq] = int(row["offset"])
            return out
        for mq, off in as_mq_entries(value):
            out[mq] = int(off)
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"bad {what}: {exc}") from None
    return out


def decode_offset_table(body: bytes, field: str = "offsetTable") -> OffsetTable:
    """`field` of a ResetOffsetBody / ResetOffsetBodyForC / GetConsumerStatusBody."""
    doc = parse_value(body)
    if not isinstance(doc, dict):
        raise ProtocolError(f"bad {field} body: not a JSON object")
    return _table(doc.get(field), field)


def encode_consumer_status_body(table: Mapping[MessageQueue, int]) -> bytes:
    """A client's GetConsumerStatusBody (``messageQueueTable``; ``consumerTable`` empty)."""
    return b'{"consumerTable":{},"messageQueueTable":' + encode_mq_map(_sorted(table)) + b"}"


def encode_consumer_table(tables: Mapping[str, Mapping[MessageQueue, int]]) -> bytes:
    """The broker's GetConsumerStatusBody: client id -> offset table."""
    parts = [
        json.dumps(cid) + ":" + encode_mq_map(_sorted(t)).decode("utf-8")
        for cid, t in sorted(tables.items())
    ]
    return ('{"consumerTable":{' + ",".join(parts) + '},"messageQueueTable":{}}').encode("utf-8")


def decode_consumer_table(body: bytes) -> dict[str, OffsetTable]:
    doc = parse_value(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("consumerTable", {}), dict):
        raise ProtocolError("bad GetConsumerStatusBody: consumerTable is not an object")
    return {
        str(cid): _table(t, f"consumerTable[{cid}]")
        for cid, t in (doc.get("consumerTable") or {}).items()
    }


__all__ = [
    "OffsetTable",
    "decode_consumer_table",
    "decode_offset_table",
    "encode_consumer_status_body",
    "encode_consumer_table",
    "encode_reset_offset_body",
    "encode_reset_offset_body_for_c",
]
