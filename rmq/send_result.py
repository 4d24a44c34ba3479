"""SendResult: what a send answers (RocketMQ ``SendResult`` and ``SendStatus``)."""

from __future__ import annotations

import enum

import attrs

from common.model import MessageQueue


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@attrs.frozen
class SendResult:
    status: SendStatus
    msg_id: str  # UNIQ_KEY (comma-joined for a batch)
    offset_msg_id: str  # broker's offset msgId (comma-joined for a batch)
    message_queue: MessageQueue
    queue_offset: int  # logical offset in the queue (first one for a batch)
    region_id: str = "DefaultRegion"
    transaction_id: str | None = None
    # the broker's TRACE_ON: False asks traced clients not to record this send
    trace_on: bool = True
