"""Receipt handles: RocketMQ 5's ExtraInfo string (``remoting/.../header/ExtraInfoUtil.java``).

A handle names the checkpoint a popped message belongs to and the message itself, as eight
fields joined by single spaces::

    ckQueueOffset popTime invisibleTime reviveQid topicMark brokerName queueId queueOffset

``topicMark`` is ``1`` when the message was read from the group's pop retry topic
(``%RETRY%<group>_<topic>``, ``KeyBuilder.buildPopRetryTopic``), else ``0``; ``reviveQid`` 999
(``KeyBuilder.POP_ORDER_REVIVE_QUEUE``) marks a FIFO pop.  Sans-I/O: build and parse only.
"""

from __future__ import annotations

import attrs

from common.topics import RETRY_GROUP_TOPIC_PREFIX, SYSTEM_TOPIC_PREFIX

__all__ = [
    "POP_ORDER_REVIVE_QUEUE",
    "REVIVE_GROUP",
    "BadReceiptHandle",
    "ReceiptHandle",
    "pop_retry_topic",
    "revive_topic",
]

POP_ORDER_REVIVE_QUEUE = 999
# the system group whose committed offsets say how far each revive queue is done
# (PopAckConstants.REVIVE_GROUP = MixAll.CID_RMQ_SYS_PREFIX + "REVIVE_GROUP")
REVIVE_GROUP = "CID_RMQ_SYS_REVIVE_GROUP"


def revive_topic(cluster: str) -> str:
    """PopAckConstants.buildClusterReviveTopic: the cluster's checkpoint/ack log."""
    return f"{SYSTEM_TOPIC_PREFIX}REVIVE_LOG_{cluster}"


def pop_retry_topic(topic: str, group: str) -> str:
    """KeyBuilder.buildPopRetryTopic (V1 form): where a group's revived messages wait."""
    return f"{RETRY_GROUP_TOPIC_PREFIX}{group}_{topic}"


class BadReceiptHandle(ValueError):
    """The handle does not parse as an ExtraInfo string."""


@attrs.frozen
class ReceiptHandle:
    ck_offset: int  # the checkpoint's start offset in the queue (FIFO: the message's own)
    pop_time: int  # ms, when the checkpoint was stamped
    invisible_time: int  # ms
    revive_qid: int
    retry: bool  # read from the pop retry topic
    broker_name: str
    queue_id: int
    offset: int  # the message's queue offset

    @property
    def order(self) -> bool:
        return self.revive_qid == POP_ORDER_REVIVE_QUEUE

    def real_topic(self, topic: str, group: str) -> str:
        """ExtraInfoUtil.getRealTopic: the queue's topic (a retry topic stays as given)."""
        if self.retry and not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return pop_retry_topic(topic, group)
        return topic

    def encode(self) -> str:
        return (
            f"{self.ck_offset} {self.pop_time} {self.invisible_time} {self.revive_qid} "
            f"{1 if self.retry else 0} {self.broker_name} {self.queue_id} {self.offset}"
        )

    @classmethod
    def parse(cls, text: str, offset: int | None = None) -> ReceiptHandle:
        """Parse a handle; a 7-field one (the 4.x POP header's extraInfo) takes ``offset``."""
        parts = text.split(" ") if text else []
        try:
            if len(parts) == 7 and offset is not None:
                parts.append(str(offset))
            if len(parts) != 8:
                raise ValueError(f"{len(parts)} fields")
            h = cls(
                ck_offset=int(parts[0]),
                pop_time=int(parts[1]),
                invisible_time=int(parts[2]),
                revive_qid=int(parts[3]),
                retry=parts[4] == "1",
                broker_name=parts[5],
                queue_id=int(parts[6]),
                offset=int(parts[7]),
            )
        except ValueError as exc:
            raise BadReceiptHandle(f"parse the extra info failed: {text!r} ({exc})") from None
        if h.offset < 0 or h.ck_offset < 0 or h.queue_id < 0 or parts[4] not in ("0", "1"):
            raise BadReceiptHandle(f"parse the extra info failed: {text!r}")
        return h
