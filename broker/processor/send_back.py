"""Retries and the dead-letter queue (RocketMQ ``consumerSendMsgBack`` + ``handleRetryAndDLQ``).

Theory of operation
-------------------
A consumer that gives up on a message for now sends CONSUMER_SEND_MSG_BACK (its group, the
message's CommitLog offset, a delay level).  :func:`consumer_send_msg_back` re-stores the
original - looked up by its CommitLog offset - under ``%RETRY%group`` with reconsumeTimes + 1 and
a delay level (3 + reconsumeTimes unless the client chose one), or under ``%DLQ%group`` once the
group's ``retryMaxTimes`` (or, from client 3.4.9 on, the request's ``maxReconsumeTimes``) is
reached or the client asked for a negative delay level.  The store turns the DELAY property into
a SCHEDULE_TOPIC_XXXX entry, which the schedule service re-delivers when due.  A send-back is not
order-sensitive: it runs in a task of its own and awaits its put; only PUT_OK answers SUCCESS.

A message *sent* to ``%RETRY%group`` (a client re-sending on its own) meets the same limit on the
inline send path: :func:`handle_retry_and_dlq` diverts it to ``%DLQ%group`` before it is
appended.  It never awaits, like the rest of that path, so nothing runs between receiving a send
and appending it.
"""

from __future__ import annotations

import random

import trio

from broker.controller import BrokerController
from broker.processor.send_header import header_int
from broker.store.results import PutMessageStatus
from common.errors import RequestError
from common.message import MessageExtBrokerInner, rewritten
from common.message_properties import MessageConst
from common.model import PermName
from common.remoting.codes import ResponseCode
from common.remoting.command import RemotingCommand
from common.topics import RETRY_GROUP_TOPIC_PREFIX, dlq_topic, retry_topic

DLQ_NUMS_PER_GROUP = 1
V3_4_9 = 121  # MQVersion ordinal from which the header's maxReconsumeTimes is honoured


def handle_retry_and_dlq(
    broker: BrokerController, req: RemotingCommand, h: dict[str, str], msg: MessageExtBrokerInner
) -> None:
    """handleRetryAndDLQ: a retry-topic message over its max reconsume times goes to the DLQ."""
    topic = msg.topic
    if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return
    group = topic[len(RETRY_GROUP_TOPIC_PREFIX) :]
    sgc = broker.subscription_group_manager.find_subscription_group_config(group)
    if sgc is None:
        raise RequestError(
            ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
            f"subscription group not exist, {group}",
        )
    max_times = sgc.retryMaxTimes
    if req.version >= V3_4_9 and h.get("maxReconsumeTimes"):
        max_times = header_int(h, "maxReconsumeTimes", max_times)
    if msg.reconsume_times >= max_times:
        dlq = dlq_topic(group)
        tc = broker.topic_config_manager.create_topic_in_send_message_back_method(
            dlq, DLQ_NUMS_PER_GROUP, PermName.READ | PermName.WRITE
        )
        if not PermName.is_writeable(tc.perm):
            raise RequestError(ResponseCode.NO_PERMISSION, f"the topic[{dlq}] is not writable")
        msg.topic = dlq
        msg.queue_id = random.randrange(99999999) % DLQ_NUMS_PER_GROUP
        msg.properties.pop(MessageConst.DELAY, None)


async def consumer_send_msg_back(broker: BrokerController, req: RemotingCommand) -> RemotingCommand:
    """CONSUMER_SEND_MSG_BACK: the message at ``offset`` again, as a retry or in the DLQ."""
    b = broker
    group = req.get_str("group")
    offset = req.get_int("offset")
    delay_level = req.get_int("delayLevel", 0)
    sgc = b.subscription_group_manager.find_subscription_group_config(group)
    if sgc is None:
        return req.response(
            ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}"
        )
    if not PermName.is_writeable(b.config.broker_permission):
        return req.response(
            ResponseCode.NO_PERMISSION,
            f"the broker[{b.config.broker_ip1}] sending message is forbidden",
        )
    if sgc.retryQueueNums <= 0:
        return req.response(ResponseCode.SUCCESS)  # retry disabled for the group: drop
    new_topic = retry_topic(group)
    queue_id = random.randrange(99999999) % sgc.retryQueueNums
    tc = b.topic_config_manager.create_topic_in_send_message_back_method(
        new_topic, sgc.retryQueueNums, PermName.READ | PermName.WRITE
    )
    if not PermName.is_writeable(tc.perm):
        return req.response(
            ResponseCode.NO_PERMISSION, f"the topic[{new_topic}] sending message is forbidden"
        )
    orig = b.store.look_message_by_offset(offset)
    if orig is None:
        return req.response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
    props = dict(orig.properties)
    props.setdefault(MessageConst.RETRY_TOPIC, orig.topic)
    props.pop(MessageConst.WAIT, None)
    max_times = sgc.retryMaxTimes
    if req.version >= V3_4_9 and req.ext_fields.get("maxReconsumeTimes"):
        max_times = req.get_int("maxReconsumeTimes")
    if orig.reconsume_times >= max_times or delay_level < 0:
        new_topic = dlq_topic(group)
        queue_id = random.randrange(99999999) % DLQ_NUMS_PER_GROUP
        tc = b.topic_config_manager.create_topic_in_send_message_back_method(
            new_topic, DLQ_NUMS_PER_GROUP, PermName.READ | PermName.WRITE
        )
        props.pop(MessageConst.DELAY, None)
    else:
        if delay_level == 0:
            delay_level = 3 + orig.reconsume_times
        props[MessageConst.DELAY] = str(delay_level)
    origin_id = props.get(MessageConst.ORIGIN_MESSAGE_ID) or orig.msg_id
    props[MessageConst.ORIGIN_MESSAGE_ID] = origin_id
    msg = rewritten(
        orig,
        new_topic,
        queue_id,
        props,
        store_host=b.store_host,
        reconsume_times=orig.reconsume_times + 1,
    )
    result = await b.store.put_message(msg)
    if result.status is PutMessageStatus.PUT_OK:
        b.stats.send_back_count += 1
        b.stats.manager.inc_send_back(orig.topic, group, trio.current_time())
        if b.metrics is not None and new_topic == dlq_topic(group):
            b.metrics.on_dlq(props[MessageConst.RETRY_TOPIC], group)
        return req.response(ResponseCode.SUCCESS)
    # Java answers SUCCESS only for PUT_OK (a flush timeout here is an error for the client)
    return req.response(ResponseCode.SYSTEM_ERROR, result.remark or result.status.name)


__all__ = ["DLQ_NUMS_PER_GROUP", "V3_4_9", "consumer_send_msg_back", "handle_retry_and_dlq"]
