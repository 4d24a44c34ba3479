"""The consumers take RocketMQ's MessageModel/ConsumeFromWhere (common.model), one enum each.

The client once had its own copies with other members and values (`ConsumeFromWhere` with
three string members); `rmq` now exports common.model's, and the client's short names are
aliases of RocketMQ's members.
"""

from __future__ import annotations

import pytest

import rmq
from common import serde
from common.model import ConsumeFromWhere, MessageModel
from rmq.errors import ClientError
from rmq.lite_pull_consumer import LitePullConsumer
from rmq.push_consumer import PushConsumer


def test_rmq_exports_the_wire_enums() -> None:
    assert rmq.ConsumeFromWhere is ConsumeFromWhere
    assert rmq.MessageModel is MessageModel
    # the short names are the same members, RocketMQ's names on the wire
    assert ConsumeFromWhere["FIRST_OFFSET"] is ConsumeFromWhere["CONSUME_FROM_FIRST_OFFSET"]
    assert [m.name for m in ConsumeFromWhere][-2:] == [
        "CONSUME_FROM_FIRST_OFFSET",
        "CONSUME_FROM_TIMESTAMP",
    ]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (ConsumeFromWhere.FIRST_OFFSET, ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET),
        ("TIMESTAMP", ConsumeFromWhere.CONSUME_FROM_TIMESTAMP),
        ("CONSUME_FROM_MAX_OFFSET", ConsumeFromWhere.CONSUME_FROM_MAX_OFFSET),
    ],
)
def test_push_consumer_announces_rocketmqs_names(
    given: ConsumeFromWhere | str, expected: ConsumeFromWhere
) -> None:
    # names are taken for the enums at run time, though the signature says enum
    c = PushConsumer("g", consume_from=given, message_model="BROADCASTING")  # type: ignore[arg-type]
    data = c.consumer_data()
    assert data.consumeFromWhere is expected and data.messageModel is MessageModel.BROADCASTING
    wire = serde.converter.unstructure(data)
    assert wire["consumeFromWhere"] == expected.name
    assert wire["messageModel"] == "BROADCASTING"


def test_push_consumer_refuses_an_unknown_start() -> None:
    with pytest.raises(ValueError):
        PushConsumer("g", consume_from="NEWEST")  # type: ignore[arg-type]  # a bad name on purpose


@pytest.mark.parametrize(
    "given", [ConsumeFromWhere.FIRST_OFFSET, "FIRST_OFFSET", "CONSUME_FROM_FIRST_OFFSET"]
)
def test_lite_pull_consumer_takes_the_same_enum(given: ConsumeFromWhere | str) -> None:
    assert LitePullConsumer("g", consume_from=given).consume_from == "FIRST_OFFSET"


def test_lite_pull_consumer_refuses_a_start_it_does_not_have() -> None:
    with pytest.raises(ClientError):
        LitePullConsumer("g", consume_from=ConsumeFromWhere.CONSUME_FROM_MIN_OFFSET)
