"""The client refuses exactly what the broker would refuse for size.

maxMessageSize (4 MiB) limits the CommitLog record the broker writes (fixed fields, body,
topic, stored properties with the broker's CLUSTER added), not the body: a client checking the
body alone would pass a 4 MiB body that the broker refuses as MESSAGE_ILLEGAL (13). Here,
against a real in-process nameserver and broker (tcp_cluster, with a cluster name of unusual
length): the largest message the client lets through is stored, one byte more is refused by
the client before sending, and that same message sent by a client with the check lifted is
refused by the broker with code 13. The same for a batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from common.errors import MessageIllegalError
from rmq import InvalidMessageError, Message, Producer, SendStatus
from rmq.message import stored_batch_record_size, stored_record_size
from rmq.producer import MAX_MESSAGE_SIZE

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster

pytestmark = pytest.mark.integration

CLUSTER = "SizeLimitCluster-0123456789"
TOPIC = "SizeLimit"
UNIQ = "0" * 32  # every UNIQ_KEY has 32 characters


@pytest.fixture
def broker_fields():
    return {"broker_cluster_name": CLUSTER}


@pytest.fixture
async def namesrv(tcp_cluster: InProcessCluster) -> str:
    await tcp_cluster.create_topic(TOPIC, 1)
    return tcp_cluster.namesrv


def _message(body_len: int) -> Message:
    return Message(TOPIC, b"b" * body_len, tags="big", keys="k-1 k-2", properties={"a": "1"})


def _largest_body() -> int:
    """The body length whose record is exactly maxMessageSize on this broker."""
    probe = _message(1)
    props, _ = probe.wire_properties_string(UNIQ)
    return MAX_MESSAGE_SIZE - stored_record_size(TOPIC, 0, props, CLUSTER)


async def test_single_message_at_and_past_the_limit(namesrv: str) -> None:
    largest = _largest_body()
    assert MAX_MESSAGE_SIZE - 300 < largest < MAX_MESSAGE_SIZE
    async with Producer("size-pg", namesrv) as producer:
        result = await producer.send(_message(largest))
        assert result.status is SendStatus.SEND_OK  # let through, and stored
        for too_big in (largest + 1, MAX_MESSAGE_SIZE):
            with pytest.raises(InvalidMessageError, match="exceeds its maxMessageSize"):
                await producer.send(_message(too_big))
    # the same message with the client's check lifted: the broker refuses it, code 13
    async with Producer("size-pg-unchecked", namesrv, max_message_size=2**30) as unchecked:
        with pytest.raises(MessageIllegalError):
            await unchecked.send(_message(largest + 1))


async def test_far_past_the_limit_is_refused_without_a_route(namesrv: str) -> None:
    async with Producer("size-pg-2", namesrv) as producer:
        with pytest.raises(InvalidMessageError):
            await producer.send(Message("NoSuchTopicYet", b"x" * MAX_MESSAGE_SIZE))


async def test_batch_at_and_past_the_limit(namesrv: str) -> None:
    props, _ = _message(1).wire_properties_string(UNIQ)
    # a batch's records keep each message's properties as sent, plus the batch's (WAIT, CLUSTER)
    per_message = stored_batch_record_size(TOPIC, 0, props, "WAIT\x01true", CLUSTER)
    n = 4
    total_body = MAX_MESSAGE_SIZE - n * per_message
    bodies = [total_body // n] * (n - 1) + [total_body - (total_body // n) * (n - 1)]
    async with Producer("size-pg-batch", namesrv) as producer:
        result = await producer.send_batch([_message(b) for b in bodies])
        assert result.status is SendStatus.SEND_OK
        with pytest.raises(InvalidMessageError, match="batch too large"):
            await producer.send_batch([_message(b) for b in bodies[:-1] + [bodies[-1] + 1]])
    async with Producer("size-pg-batch-u", namesrv, max_message_size=2**30) as unchecked:
        with pytest.raises(MessageIllegalError):
            await unchecked.send_batch([_message(b) for b in bodies[:-1] + [bodies[-1] + 1]])
