"""The answer to a delayed send names the queue the producer chose, as Java's does.

The store parks a message with a delay level on SCHEDULE_TOPIC_XXXX, queue ``level - 1``; Java's
SendMessageProcessor still answers with the request's queue id (``queueIdInt``), so a producer
that reports or routes by the answer sees its own queue, not the schedule queue.
"""

from __future__ import annotations

from common.model import MessageQueue
from common.remoting.codes import RequestCode
from rmq import Message, Producer


async def test_delayed_send_answers_the_chosen_queue(memory_cluster, autojump_clock):
    await memory_cluster.create_topic("Later", 4)
    tap = memory_cluster.tap()
    async with Producer("pg", memory_cluster.namesrv, network=tap) as p:
        for queue_id in (0, 1, 3):  # level 3 is schedule queue 2: never the one chosen here
            mq = MessageQueue("Later", "broker-a", queue_id)
            result = await p.send(Message("Later", b"x", delay_level=3), queue=mq)
            assert result.message_queue == mq
    [send, *_] = tap.requests(RequestCode.SEND_MESSAGE_V2)
    assert send.ext_fields["e"] == "0"  # the request did name the chosen queue
