"""Receipt handles: RocketMQ 5's ExtraInfo string (``remoting/.../header/ExtraInfoUtil.java``)
and the proxy's receipt handle (``common/.../consumer/ReceiptHandle.java``).

A handle names the checkpoint a popped message belongs to and the message itself, as eight
fields joined by single spaces (the ExtraInfo, a record's ``POP_CK`` on the remoting wire)::

    ckQueueOffset popTime invisibleTime reviveQid topicMark brokerName queueId queueOffset

RocketMQ 5's proxy hands its gRPC clients the same eight plus the message's CommitLog offset
(nine fields); both forms parse, and :meth:`ReceiptHandle.encode` writes the nine-field one
when the CommitLog offset is known.

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
    commit_log_offset: int = -1  # the proxy's ninth field (-1: not given)

    @property
    def order(self) -> bool:
        return self.revive_qid == POP_ORDER_REVIVE_QUEUE

    def real_topic(self, topic: str, group: str) -> str:
        """ExtraInfoUtil.getRealTopic: the queue's topic (a retry topic stays as given)."""
        if self.retry and not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return pop_retry_topic(topic, group)
        return topic

    @property
    def next_visible_time(self) -> int:
        """When the message becomes visible again (the proxy calls a handle past it expired)."""
        return self.pop_time + self.invisible_time

    def extra_info(self) -> str:
        """The eight-field ExtraInfo (``POP_CK``, the remoting ack's ``extraInfo``)."""
        return (
            f"{self.ck_offset} {self.pop_time} {self.invisible_time} {self.revive_qid} "
            f"{1 if self.retry else 0} {self.broker_name} {self.queue_id} {self.offset}"
        )

    def encode(self) -> str:
        """The proxy's form: the ExtraInfo and, when known, the CommitLog offset."""
        if self.commit_log_offset < 0:
            return self.extra_info()
        return f"{self.extra_info()} {self.commit_log_offset}"

    @classmethod
    def parse(cls, text: str, offset: int | None = None) -> ReceiptHandle:
        """Parse a handle of 8 fields (ExtraInfo) or 9 (the proxy's); a 7-field one (an older
        client's extraInfo) takes ``offset``."""
        parts = text.split(" ") if text else []
        try:
            if len(parts) == 7 and offset is not None:
                parts.append(str(offset))
            if len(parts) not in (8, 9):
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
                commit_log_offset=int(parts[8]) if len(parts) == 9 else -1,
            )
        except ValueError as exc:
            raise BadReceiptHandle(f"parse the extra info failed: {text!r} ({exc})") from None
        if h.offset < 0 or h.ck_offset < 0 or h.queue_id < 0 or parts[4] not in ("0", "1"):
            raise BadReceiptHandle(f"parse the extra info failed: {text!r}")
        return h
