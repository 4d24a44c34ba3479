"""RocketMQ 5's topic message type attribute and its attribute syntax."""

from __future__ import annotations

import pytest

from common.topic_message_type import (
    TopicAttributeError,
    TopicMessageType,
    apply_attribute_changes,
    parse_attribute_changes,
    topic_message_type,
)


def test_parse_add_and_delete() -> None:
    assert parse_attribute_changes("+message.type=FIFO,-other") == {
        "message.type": "FIFO",
        "other": None,
    }
    assert parse_attribute_changes("") == {}


@pytest.mark.parametrize("bad", ["message.type=FIFO", "+message.type", "+=x", "-", "-a=b"])
def test_malformed_attributes_are_refused(bad: str) -> None:
    with pytest.raises(TopicAttributeError):
        parse_attribute_changes(bad)


def test_unknown_message_type_is_refused() -> None:
    with pytest.raises(TopicAttributeError, match="value is not in set"):
        parse_attribute_changes("+message.type=LITE")


def test_type_of_attributes_and_what_it_accepts() -> None:
    assert topic_message_type({}) is TopicMessageType.NORMAL
    fifo = topic_message_type({"message.type": "FIFO"})
    assert fifo.accepted == (TopicMessageType.FIFO,)
    assert not fifo.accepts(TopicMessageType.NORMAL)
    mixed = topic_message_type({"message.type": "MIXED"})
    assert len(mixed.accepted) == 4 and mixed.accepts(TopicMessageType.TRANSACTION)
    merged = apply_attribute_changes({"message.type": "FIFO", "x": "1"}, {"x": None})
    assert merged == {"message.type": "FIFO"}
