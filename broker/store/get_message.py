"""Selecting the records of a pull (RocketMQ ``DefaultMessageStore.getMessage``), for both stores.

Theory of operation
-------------------
``select_messages`` holds the status and next-offset rules (an offset below the queue's start,
at its end, past it; an unknown queue answers like an empty one), the ConsumeQueue scan, which
never crosses a ConsumeQueue file (one pull reads at most one), consume-queue filtering that
skips units without reading their records, and the batch limits (``isTheBatchFull``: the
count, and bytes and count limits that are lower for records that have left the page cache
than for those still in memory).  A record whose CommitLog file is gone skips to the next file
(``MESSAGE_WAS_REMOVING`` when nothing was found before it).

The caller supplies readers for its ConsumeQueue and CommitLog; records come back as they are
stored (memoryviews of the mapped files for the file store), never decoded.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from broker.store.config import MessageStoreConfig
from broker.store.consumequeue import CQ_UNIT, CQ_UNIT_SIZE
from broker.store.results import (
    Buffer,
    GetMessageResult,
    GetMessageStatus,
    MessageFilter,
    Record,
)

try:
    TOTAL_PHYSICAL_MEMORY = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
    TOTAL_PHYSICAL_MEMORY = 8 * 1024**3


def _next_offset_correction(role: str, old: int, new: int) -> int:
    # RocketMQ keeps the consumer's offset on a slave (offsetCheckInSlave defaults to false).
    return old if role == "SLAVE" else new


def select_messages(
    config: MessageStoreConfig,
    offset: int,
    max_msg_nums: int,
    message_filter: MessageFilter | None,
    *,
    min_offset: int | None,
    max_offset: int,
    read_units: Callable[[int, int], Buffer | None],
    cq_roll_next_file: Callable[[int], int],
    read_record: Callable[[int, int], Record | None],
    commit_log_roll_next_file: Callable[[int], int],
    max_phy_offset: int,
    role: str | None = None,
) -> GetMessageResult:
    """DefaultMessageStore.getMessage over abstract readers.

    ``min_offset`` None means the queue does not exist.  ``read_units(offset, max_bytes)`` returns the CQ
    units from ``offset`` to the end of the written part of that CQ file (or None if that file
    is gone), at most ``max_bytes`` of them; ``read_record(phys, size)`` the raw record or None if the CommitLog file is gone.
    """
    role = role or config.broker_role
    if min_offset is None or max_offset == 0:
        # RocketMQ creates the queue object on lookup, so an unknown queue answers like an empty one.
        return GetMessageResult(
            GetMessageStatus.NO_MESSAGE_IN_QUEUE,
            _next_offset_correction(role, offset, 0),
            0 if min_offset is None else min_offset,
            max_offset,
        )
    if offset < min_offset:
        return GetMessageResult(
            GetMessageStatus.OFFSET_TOO_SMALL,
            _next_offset_correction(role, offset, min_offset),
            min_offset,
            max_offset,
        )
    if offset == max_offset:
        return GetMessageResult(
            GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset
        )
    if offset > max_offset:
        target = min_offset if min_offset == 0 else max_offset
        return GetMessageResult(
            GetMessageStatus.OFFSET_OVERFLOW_BADLY,
            _next_offset_correction(role, offset, target),
            min_offset,
            max_offset,
        )
    max_filter_bytes = max(16000, max_msg_nums * CQ_UNIT_SIZE)
    units = read_units(offset, max_filter_bytes)
    if units is None:
        return GetMessageResult(
            GetMessageStatus.OFFSET_FOUND_NULL,
            _next_offset_correction(role, offset, cq_roll_next_file(offset)),
            min_offset,
            max_offset,
        )
    status = GetMessageStatus.NO_MATCHED_MESSAGE
    buffers: list[Record] = []
    qoffs: list[int] = []
    total = 0
    count = 0
    next_phy_file_start = -1
    max_phy_pulling = 0
    memory = TOTAL_PHYSICAL_MEMORY * config.access_message_in_memory_max_ratio // 100
    limit = min(len(units), max_filter_bytes)
    limit -= limit % CQ_UNIT_SIZE
    i = 0
    unpack = CQ_UNIT.unpack_from
    while i < limit:
        phys, size, tcode = unpack(units, i)
        max_phy_pulling = phys
        if next_phy_file_start != -1 and phys < next_phy_file_start:
            i += CQ_UNIT_SIZE
            continue
        in_disk = (max_phy_offset - phys) > memory
        if total and count:  # isTheBatchFull
            if max_msg_nums <= count:
                break
            if in_disk:
                if total + size > config.max_transfer_bytes_on_message_in_disk:
                    break
                if count > config.max_transfer_count_on_message_in_disk - 1:
                    break
            else:
                if total + size > config.max_transfer_bytes_on_message_in_memory:
                    break
                if count > config.max_transfer_count_on_message_in_memory - 1:
                    break
        if message_filter is not None and not message_filter.is_matched_by_consume_queue(tcode):
            i += CQ_UNIT_SIZE
            continue
        rec = read_record(phys, size)
        if rec is None:
            if total == 0:
                status = GetMessageStatus.MESSAGE_WAS_REMOVING
            next_phy_file_start = commit_log_roll_next_file(phys)
            i += CQ_UNIT_SIZE
            continue
        if message_filter is not None and not message_filter.is_matched_by_commit_log(rec):
            # SQL92: the record's properties do not match (skipped, as the unit above)
            if total == 0:
                status = GetMessageStatus.NO_MATCHED_MESSAGE
            i += CQ_UNIT_SIZE
            continue
        buffers.append(rec)
        qoffs.append(offset + i // CQ_UNIT_SIZE)
        total += size
        count += 1
        status = GetMessageStatus.FOUND
        next_phy_file_start = -1
        i += CQ_UNIT_SIZE
    return GetMessageResult(
        status,
        offset + i // CQ_UNIT_SIZE,
        min_offset,
        max_offset,
        buffers,
        count,
        total,
        (max_phy_offset - max_phy_pulling) > memory,
        qoffs,
    )


def no_units(offset: int, max_bytes: int) -> None:
    """``read_units`` of a queue that does not exist."""
    return None


def same_offset(offset: int) -> int:
    """``cq_roll_next_file`` of a queue that does not exist."""
    return offset
