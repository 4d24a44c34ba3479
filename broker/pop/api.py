"""What the gRPC MessagingService (and the remoting processors) ask of pop consumption.

The seam between ``broker/pop`` and its callers: request/result types and the
:class:`PopService` Protocol kept by ``controller.pop`` (built in ``broker/service.py``).
Revive runs only on a master / DLedger leader; the calls below are valid on any role but a
slave answers :attr:`PopStatus.NOT_MASTER` to anything that writes pop state.

Receipt handles are RocketMQ 5's proxy receipt handles (``common/.../ReceiptHandle.java``): the
ExtraInfo string (``ExtraInfoUtil.java``) ``ckQueueOffset popTime invisibleTime reviveQid
topicMark brokerName queueId queueOffset`` plus the message's CommitLog offset, separated by
single spaces; the remoting wire (code 200050) carries the eight-field ExtraInfo, and every call
here takes either form (``broker/pop/receipt.py`` builds and parses them).
"""

from __future__ import annotations

import enum
from typing import Protocol

import attrs
import trio

from common.message import MessageExt

__all__ = [
    "AckResult",
    "AckStatus",
    "ChangeInvisibleResult",
    "ConsumeInitMode",
    "PopMessage",
    "PopRequest",
    "PopResult",
    "PopService",
    "PopStatus",
]


class ConsumeInitMode(enum.IntEnum):
    """Where a group with no pop offset yet starts (RocketMQ ``ConsumeInitMode``)."""

    LAST = 0
    MIN = 1


class PopStatus(enum.Enum):
    """Outcome of a pop; the remoting answer code is in brackets (RocketMQ 5)."""

    FOUND = "FOUND"  # SUCCESS 0
    NO_NEW_MSG = "NO_NEW_MSG"  # PULL_NOT_FOUND 19 (after the poll time ran out)
    POLLING_FULL = "POLLING_FULL"  # POLLING_FULL 209
    TOPIC_NOT_EXIST = "TOPIC_NOT_EXIST"  # 17
    SUBSCRIPTION_GROUP_NOT_EXIST = "SUBSCRIPTION_GROUP_NOT_EXIST"  # 26
    NO_PERMISSION = "NO_PERMISSION"  # 16 (broker/topic not readable, group consume disabled)
    BAD_REQUEST = "BAD_REQUEST"  # SYSTEM_ERROR 1 / INVALID_PARAMETER (queue id, max, times)
    FILTER_ERROR = "FILTER_ERROR"  # SUBSCRIPTION_PARSE_FAILED 23 (SQL92 does not compile)
    NOT_MASTER = "NOT_MASTER"  # SYSTEM_ERROR on a slave (pop writes a checkpoint)


class AckStatus(enum.Enum):
    OK = "OK"  # SUCCESS
    # the handle does not decode, or names another broker (RocketMQ: INVALID_PARAMETER /
    # "parse the extra info failed")
    BAD_HANDLE = "BAD_HANDLE"
    # the handle is stale: its message was already acked, revived, or the handle was replaced
    # by a ChangeInvisibleTime (RocketMQ: NO_MESSAGE 208 "msg offset / pop time expired")
    EXPIRED = "EXPIRED"
    TOPIC_NOT_EXIST = "TOPIC_NOT_EXIST"
    SUBSCRIPTION_GROUP_NOT_EXIST = "SUBSCRIPTION_GROUP_NOT_EXIST"
    NOT_MASTER = "NOT_MASTER"


@attrs.frozen
class PopRequest:
    group: str
    topic: str
    queue_id: int = -1  # -1: any readable queue, round-robin from a per-group start
    max_msgs: int = 32
    invisible_time_ms: int = 60_000
    # long polling: how long to wait for a message when none is ready (0: answer at once)
    poll_time_ms: int = 0
    expression_type: str = "TAG"  # "TAG" | "SQL92"
    expression: str = "*"
    # FIFO: serve a queue's next message only after the previous popped one is acked; the
    # group's consumeMessageOrderly forces it on
    order: bool = False
    init_mode: ConsumeInitMode = ConsumeInitMode.LAST
    # who asks (for ``rmq top`` / logs only)
    client_id: str = ""


@attrs.frozen
class PopMessage:
    msg: MessageExt  # the stored message as read (topic is the original topic, never a retry)
    receipt_handle: str  # the proxy's form; hand back to ack / change_invisible_time
    delivery_attempt: int  # reconsume_times + 1
    pop_time_ms: int
    invisible_time_ms: int


@attrs.frozen
class PopResult:
    status: PopStatus
    messages: list[PopMessage] = attrs.field(factory=list)
    remark: str = ""
    # informational (RocketMQ's PopMessageResponseHeader): when pop stamped the checkpoint,
    # the invisible time, the revive queue, and how many messages are still ready
    pop_time_ms: int = 0
    invisible_time_ms: int = 0
    revive_qid: int = 0
    rest_num: int = 0


@attrs.frozen
class AckResult:
    status: AckStatus
    remark: str = ""


@attrs.frozen
class ChangeInvisibleResult:
    status: AckStatus
    # the handle that replaces the old one (the old one is refused from now on: EXPIRED)
    receipt_handle: str = ""
    pop_time_ms: int = 0
    invisible_time_ms: int = 0
    remark: str = ""


class PopService(Protocol):
    """``controller.pop``: what gRPC ReceiveMessage/Ack/ChangeInvisibleDuration/Forward call."""

    async def pop(self, req: PopRequest) -> PopResult: ...

    async def ack(self, group: str, topic: str, receipt_handle: str) -> AckResult: ...

    async def change_invisible_time(
        self, group: str, topic: str, receipt_handle: str, invisible_time_ms: int
    ) -> ChangeInvisibleResult: ...

    async def forward_to_dead_letter_queue(
        self, group: str, topic: str, receipt_handle: str
    ) -> AckResult:
        """Put the message to ``%DLQ%<group>`` now and ack it (gRPC
        ForwardMessageToDeadLetterQueue)."""
        ...

    def inflight_in_queue(self, group: str, topic: str, queue_id: int) -> int:
        """Messages of the queue popped by ``group`` and neither acked nor revived yet (0 on a
        broker that does not serve pop now): GET_CONSUME_STATS reports it, ``rmq top`` shows it."""
        ...

    async def run_revive(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The master's side: rebuild the state from the revive log, then revive until
        cancelled (started and stopped with the master / leader role)."""
        ...
