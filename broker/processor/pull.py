"""PULL_MESSAGE with long polling (RocketMQ ``PullMessageProcessor``).

Theory of operation
-------------------
A pull names (group, topic, queue, offset, max count) and a ``sysFlag``:
COMMIT_OFFSET 0x1 (also store ``commitOffset`` for the group), SUSPEND 0x2 (may be held),
SUBSCRIPTION 0x4 (the expression is in the request; otherwise the broker uses the one from the
group's heartbeat), CLASS_FILTER 0x8, LITE_PULL 0x10.

Checks run in Java's order and answer with Java's codes (``PullMessageProcessor.processRequest`` in
``broker/processor/PullMessageProcessor.java``): broker not readable 16, unknown group 26
(auto-created by default), group may not consume 16, topic missing 17, topic not readable 16, queue
id out of range 1, no subscription 24, stale subscription 25.

The store answers with raw records and a status that maps to 0 / 19 / 20 / 21; the header
fields ``nextBeginOffset``, ``minOffset``, ``maxOffset`` and ``suggestWhichBrokerId`` are
always present for these four codes (clients need all of them).  A 19 with SUSPEND is not
answered at once: the handler parks on :class:`PullRequestHoldService` until a matching message
arrives or the suspend time (capped by ``max_pull_suspend``; ``short_polling_time`` when long
polling is off) runs out, then runs the pull once more without permission to park, and that
second answer goes back.  The offset commit happens in the first pass only, like Java.

PULL_MESSAGE is registered *inline*: the first pass runs synchronously in the connection's read
loop (no task, no scheduling for a pull that finds messages or answers at once); only a parked
pull hands the read loop an awaitable (wait for the arrival, then the second pass), which a task
runs.  The waiter is registered in the first pass itself, so no arrival can slip in between.

The body is the list of record buffers the store returned; the remoting layer writes them back
to back without joining them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import final

import trio

from broker.broker_stats_manager import BROKER_GET_NUMS
from broker.controller import BrokerController
from broker.processor.pull_hold import ParkedPull
from broker.store.api import MessageStore
from broker.store.results import GetMessageStatus
from broker.subscription import TagMessageFilter, build_subscription_data
from common.errors import RequestError
from common.mixall import MASTER_ID
from common.model import MessageModel, PermName, TopicConfig
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.server import Channel, RequestDispatcher

log = logging.getLogger(__name__)


class PullSysFlag:
    COMMIT_OFFSET = 0x1
    SUSPEND = 0x2
    SUBSCRIPTION = 0x4
    CLASS_FILTER = 0x8
    LITE_PULL = 0x10


@final  # so `type(result) is _Parked` narrows both ways (the inline path's cheap check)
class _Parked:
    """First-pass outcome of a pull that waits for an arrival (its waiter is registered)."""

    __slots__ = ("parked", "timeout")

    def __init__(self, parked: ParkedPull, timeout: float) -> None:
        self.parked = parked
        self.timeout = timeout


def _status_code(status: GetMessageStatus, request_offset: int) -> int:
    if status is GetMessageStatus.FOUND:
        return ResponseCode.SUCCESS
    if status in (GetMessageStatus.MESSAGE_WAS_REMOVING, GetMessageStatus.NO_MATCHED_MESSAGE):
        return ResponseCode.PULL_RETRY_IMMEDIATELY
    if status in (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MESSAGE_IN_QUEUE):
        return (
            ResponseCode.PULL_OFFSET_MOVED if request_offset != 0 else ResponseCode.PULL_NOT_FOUND
        )
    if status in (GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.OFFSET_OVERFLOW_ONE):
        return ResponseCode.PULL_NOT_FOUND
    # OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL
    return ResponseCode.PULL_OFFSET_MOVED


class PullMessageProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    def register(self, dispatcher: RequestDispatcher) -> None:
        dispatcher.register(RequestCode.PULL_MESSAGE, self.pull_inline, inline=True)

    async def process(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        """The awaitable form of :meth:`pull_inline` (for callers outside a read loop)."""
        result = self.pull_inline(req, channel)
        if isinstance(result, RemotingCommand):
            return result
        return await result

    def pull_inline(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand | Awaitable[RemotingCommand]:
        """First pass now: the response, or an awaitable of it when the pull was parked."""
        result = self._process(req, channel, allow_suspend=True)
        if type(result) is _Parked:
            return self._after_park(req, channel, result)
        return result

    async def _after_park(
        self, req: RemotingCommand, channel: Channel, parked: _Parked
    ) -> RemotingCommand:
        await self.broker.pull_hold.wait_parked(parked.parked, parked.timeout)
        result = self._process(req, channel, allow_suspend=False)
        assert type(result) is RemotingCommand
        return result

    def _process(
        self, req: RemotingCommand, channel: Channel, *, allow_suspend: bool
    ) -> RemotingCommand | _Parked:
        b = self.broker
        cfg = b.config
        group = req.get_str("consumerGroup")
        topic = req.get_str("topic")
        queue_id = req.get_int("queueId")
        queue_offset = req.get_int("queueOffset")
        max_msg_nums = req.get_int("maxMsgNums")
        sys_flag = req.get_int("sysFlag")
        commit_offset = req.get_int("commitOffset", -1)
        suspend_ms = req.get_int("suspendTimeoutMillis", 0)
        sub_version = req.get_int("subVersion", 0)

        if not PermName.is_readable(cfg.broker_permission):
            raise RequestError(
                ResponseCode.NO_PERMISSION,
                f"the broker[{cfg.broker_ip1}] pulling message is forbidden",
            )
        sgc = b.subscription_group_manager.find_subscription_group_config(group)
        if sgc is None:
            raise RequestError(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{group}] does not exist",
            )
        if not sgc.consumeEnable:
            raise RequestError(
                ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}"
            )
        has_commit = bool(sys_flag & PullSysFlag.COMMIT_OFFSET)
        has_suspend = bool(sys_flag & PullSysFlag.SUSPEND)
        has_sub = bool(sys_flag & PullSysFlag.SUBSCRIPTION)

        tc = b.topic_config_manager.select_topic_config(topic)
        if tc is None and b.is_slave:
            tc = _replicated_topic_config(b.store, topic)
        if tc is None:
            raise RequestError(
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{topic}] not exist, apply first please!",
            )
        if not PermName.is_readable(tc.perm):
            raise RequestError(
                ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden"
            )
        if queue_id < 0 or queue_id >= tc.readQueueNums:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                f"topicConfig.readQueueNums:[{tc.readQueueNums}] consumer:[{channel.remote_addr}]",
            )
        if max_msg_nums <= 0:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"maxMsgNums[{max_msg_nums}] is illegal")

        if has_sub:
            try:
                sub = build_subscription_data(
                    topic,
                    req.ext_fields.get("subscription"),
                    req.ext_fields.get("expressionType") or "TAG",
                    sub_version,
                )
            except ValueError as exc:
                raise RequestError(
                    ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                    f"parse the consumer's subscription failed: {exc}",
                ) from None
        else:
            cgi = b.consumer_manager.get_consumer_group_info(group)
            if cgi is None:
                raise RequestError(
                    ResponseCode.SUBSCRIPTION_NOT_EXIST,
                    f"the consumer's group info not exist, group: {group}",
                )
            if not sgc.consumeBroadcastEnable and cgi.message_model == MessageModel.BROADCASTING:
                raise RequestError(
                    ResponseCode.NO_PERMISSION,
                    f"the consumer group[{group}] can not consume by broadcast way",
                )
            found = cgi.subscriptions.get(topic)
            if found is None:
                raise RequestError(
                    ResponseCode.SUBSCRIPTION_NOT_EXIST,
                    f"the consumer's subscription not exist, group: {group} topic: {topic}",
                )
            if found.subVersion < sub_version:
                raise RequestError(
                    ResponseCode.SUBSCRIPTION_NOT_LATEST,
                    "the consumer's subscription not latest",
                )
            sub = found
        if (sub.expressionType or "TAG").upper() != "TAG":
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"The broker does not support consumer to filter message by {sub.expressionType}",
            )
        message_filter = TagMessageFilter.of(sub)

        result = b.store.get_message(
            group, topic, queue_id, queue_offset, max_msg_nums, message_filter
        )
        code = _status_code(result.status, queue_offset)

        if cfg.slave_read_enable:
            suggest = (
                sgc.whichBrokerWhenConsumeSlowly
                if result.suggest_pulling_from_slave
                else sgc.brokerId
            )
        else:
            suggest = MASTER_ID
        if code == ResponseCode.PULL_OFFSET_MOVED and b.is_slave and not cfg.offset_check_in_slave:
            code = ResponseCode.PULL_RETRY_IMMEDIATELY
            suggest = sgc.brokerId
        ext = {
            # (a slave's store keeps the old offset itself: nextOffsetCorrection)
            "nextBeginOffset": result.next_begin_offset,
            "minOffset": result.min_offset,
            "maxOffset": result.max_offset,
            "suggestWhichBrokerId": suggest,
        }

        # Offset commit: first pass only, never on a slave.
        if allow_suspend and has_commit and not b.is_slave:
            b.consumer_offset_manager.commit_offset(group, topic, queue_id, commit_offset)

        if code == ResponseCode.SUCCESS:
            b.stats.get_found += result.message_count
            now = trio.current_time()
            stats = b.stats.manager
            size = sum(len(buf) for buf in result.buffers)
            stats.inc_group_get(topic, group, result.message_count, size, now)
            stats.inc_broker(
                BROKER_GET_NUMS, b.config.broker_cluster_name, result.message_count, now
            )
            metrics = b.metrics
            if metrics is not None:
                metrics.on_get(
                    topic, group, queue_id, result.message_count, size, result.next_begin_offset
                )
            return req.response(code, result.status.name, ext, body=list(result.buffers))
        if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and has_suspend:
            if cfg.long_polling_enable:
                timeout = min(suspend_ms / 1000.0, cfg.max_pull_suspend)
            else:
                timeout = cfg.short_polling_time
            parked = b.pull_hold.park(topic, queue_id, queue_offset, message_filter)
            return _Parked(parked, timeout)
        b.stats.get_miss += 1
        return req.response(code, result.status.name, ext)


def _replicated_topic_config(store: MessageStore, topic: str) -> TopicConfig | None:
    """A read-only view of a topic a slave holds replicated queues of but no config for.

    A topic auto-created on the master reaches the slave's CommitLog (and so its queues) at
    once, but its config only with the next metadata sync (60 s), and never if the master dies
    first. Java's slave answers TOPIC_NOT_EXIST until then; consumers that fail over to the
    slave because the master is gone need exactly those messages, so the slave serves the
    queues its store has. Nothing is persisted: the next sync from the master replaces it.
    """
    queues = store.topic_queues().get(topic)
    if not queues:
        return None
    n = max(queues) + 1
    return TopicConfig(topicName=topic, readQueueNums=n, writeQueueNums=n, perm=PermName.READ)
