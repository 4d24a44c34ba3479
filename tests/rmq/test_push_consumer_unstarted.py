"""A PushConsumer before `async with`: the parts `_start` makes are not there yet, and saying
so is a ClientError or an error answer, never a call on None."""

from __future__ import annotations

import pytest

from common.message import MessageExtBrokerInner
from common.message_encoder import encode_record
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from rmq import PushConsumer
from rmq.errors import ClientError


def test_offset_store_before_start_is_a_client_error() -> None:
    c = PushConsumer("g", "127.0.0.1:1")
    with pytest.raises(ClientError, match="not started"):
        c.offset_store  # noqa: B018


async def test_consume_directly_without_a_listener_is_an_error_answer() -> None:
    c = PushConsumer("g", "127.0.0.1:1")
    record = encode_record(MessageExtBrokerInner("T", 0, body=b"m"), 0, 0, 1)
    cmd = RemotingCommand.request(
        RequestCode.CONSUME_MESSAGE_DIRECTLY, {"consumerGroup": "g"}, record
    )
    resp = await c.consume_message_directly(cmd)
    assert resp.code == ResponseCode.SYSTEM_ERROR
    assert "no listener" in (resp.remark or "")
