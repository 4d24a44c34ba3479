"""RocketMQ 5's topic message type: the ``message.type`` attribute of a topic config.

A RocketMQ 5 topic says which kind of message it takes (``TopicMessageType`` in
``common/.../attribute/TopicMessageType.java``): NORMAL, FIFO, DELAY, TRANSACTION, or MIXED for
all four. It lives in the topic config's ``attributes`` map (``TopicConfig.attributes``), is set
through UPDATE_AND_CREATE_TOPIC's ``attributes`` header field in RocketMQ's attribute syntax
(``+message.type=FIFO``; ``-key`` removes one; comma separated, ``AttributeParser``), and a
topic without it is NORMAL. The 5.x clients check a message's type against the route's
``accept_message_types`` before sending, and RocketMQ 5's proxy checks it again at SendMessage
(MESSAGE_PROPERTY_CONFLICT_WITH_TYPE).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

MESSAGE_TYPE_ATTRIBUTE = "message.type"


class TopicAttributeError(ValueError):
    """A malformed attribute string or an attribute value RocketMQ does not allow."""


class TopicMessageType(enum.Enum):
    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    MIXED = "MIXED"

    def accepts(self, kind: TopicMessageType) -> bool:
        return self is TopicMessageType.MIXED or kind is self

    @property
    def accepted(self) -> tuple[TopicMessageType, ...]:
        if self is TopicMessageType.MIXED:
            return (
                TopicMessageType.NORMAL,
                TopicMessageType.FIFO,
                TopicMessageType.DELAY,
                TopicMessageType.TRANSACTION,
            )
        return (self,)


def topic_message_type(attributes: Mapping[str, str]) -> TopicMessageType:
    """The type a topic's attributes give it (NORMAL without the attribute)."""
    value = attributes.get(MESSAGE_TYPE_ATTRIBUTE)
    if not value:
        return TopicMessageType.NORMAL
    try:
        return TopicMessageType(value)
    except ValueError:
        return TopicMessageType.NORMAL


def parse_attribute_changes(text: str) -> dict[str, str | None]:
    """``"+message.type=FIFO,-other"`` -> ``{"message.type": "FIFO", "other": None}`` (None:
    remove). Raises TopicAttributeError as RocketMQ's ``AttributeParser`` refuses."""
    changes: dict[str, str | None] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part[0] == "+":
            key, sep, value = part[1:].partition("=")
            if not sep or not key or not value:
                raise TopicAttributeError(f"add/alter attribute format is wrong: {part}")
            changes[key] = value
        elif part[0] == "-":
            if not part[1:] or "=" in part:
                raise TopicAttributeError(f"delete attribute format is wrong: {part}")
            changes[part[1:]] = None
        else:
            raise TopicAttributeError(f"attribute format is wrong: {part}")
    kind = changes.get(MESSAGE_TYPE_ATTRIBUTE)
    if kind is not None and kind not in TopicMessageType.__members__:
        allowed = ",".join(TopicMessageType.__members__)
        raise TopicAttributeError(
            f"value is not in set: {allowed}: {MESSAGE_TYPE_ATTRIBUTE}={kind}"
        )
    return changes


def apply_attribute_changes(
    current: Mapping[str, str], changes: Mapping[str, str | None]
) -> dict[str, str]:
    merged = dict(current)
    for key, value in changes.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged
