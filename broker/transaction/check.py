"""The decisions of transactional messages, without I/O: which half message to check, skip or
discard, and whether an END_TRANSACTION still ends something.

RocketMQ keeps these decisions inside ``TransactionalMessageServiceImpl.check`` (apache/rocketmq
4.9, ``broker/.../transaction/queue/``), interleaved with its reads; here they are pure functions
and one state object, so they are tested with fake clocks and fed by the I/O of
``broker/transaction/service.py``.

Theory of operation
-------------------
A transaction is one *key*: the half message's UNIQ_KEY (the client-made id every RocketMQ
client sets), else the queue offset of its first half record.  A half message may have several
records in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0: the check re-puts it at the end of the queue
each time it asks the producer (TRANSACTION_CHECK_TIMES counts the checks), and a message still
in its CHECK_IMMUNITY_TIME_IN_SECONDS window is re-put so the scan can go past it.  An op record
(tag ``d``, body = the half's queue offset) in ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` marks a record
ended.  RocketMQ matches ops to records by offset only, so a commit of one record and a later
check of another copy can deliver a message twice; here an op ends the whole key, and an end
writes an op for every live copy of the key.

:class:`TransactionLedger` is what the master knows of the *window*: the half records at or
beyond ``half_progress`` (the check's persisted cursor, consumer offsets of
``CID_RMQ_SYS_TRANS``), their keys, and the ops read so far.  Below the cursor every record was
handled: ended, re-put further on, or discarded.  So a key has ended when

* an op names any record of the key, or
* the record named is below the cursor and the key has no record at or beyond it.

The cursor only moves forward and a stale one (a slave's, after a failover) only claims less,
so a ledger rebuilt from the CommitLog (half and op records replicate like any other) never
says "ended" for a key that was not, and never "open" for one that was: the op is in the log.
Memory is the window: keys of records below the cursor are forgotten as it passes them.
"""

from __future__ import annotations

import collections
import enum

import attrs

from common.message_properties import MessageConst

# RocketMQ: a half message older than fileReservedTime hours is no longer checked
_HOUR_MS = 3600 * 1000


class HalfAction(enum.Enum):
    # an op ended its transaction: nothing to do
    DONE = "done"
    # checked transactionCheckMax times (or older than the files are kept): moved aside
    DISCARD = "discard"
    # younger than its timeout, or stored after this round began: the round stops here
    WAIT = "wait"
    # inside its CHECK_IMMUNITY_TIME_IN_SECONDS: re-put at the end, not checked
    REQUEUE = "requeue"
    # ask the producer group (after re-putting it with one more check counted)
    CHECK = "check"


@attrs.frozen
class CheckConfig:
    transaction_timeout_ms: int = 6000
    transaction_check_max: int = 15
    file_reserved_hours: int = 72


def transaction_key(props: dict[str, str], queue_offset: int) -> str:
    """The transaction a half record belongs to (see the module doc)."""
    uniq = props.get(MessageConst.UNIQ_KEY)
    if uniq:
        return uniq
    first = props.get(MessageConst.TRAN_PREPARED_QUEUE_OFFSET)
    return f"@{first if first is not None else queue_offset}"


def check_times(props: dict[str, str]) -> int:
    """TRANSACTION_CHECK_TIMES as stored (0 when never checked, or unreadable)."""
    try:
        return int(props.get(MessageConst.TRANSACTION_CHECK_TIMES, "0"))
    except ValueError:
        return 0


def immunity_ms(props: dict[str, str], timeout_ms: int) -> int | None:
    """CHECK_IMMUNITY_TIME_IN_SECONDS in ms (-1 or unreadable: the timeout); None if absent."""
    raw = props.get(MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS)
    if raw is None:
        return None
    try:
        seconds = int(raw)
    except ValueError:
        return timeout_ms
    return timeout_ms if seconds == -1 else seconds * 1000


def decide_half(
    props: dict[str, str],
    born_ms: int,
    store_ms: int,
    *,
    ended: bool,
    now_ms: int,
    round_start_ms: int,
    config: CheckConfig,
) -> HalfAction:
    """What the check does with one half record (``TransactionalMessageServiceImpl.check``)."""
    if ended:
        return HalfAction.DONE
    if check_times(props) >= config.transaction_check_max:
        return HalfAction.DISCARD
    if now_ms - born_ms > config.file_reserved_hours * _HOUR_MS:
        return HalfAction.DISCARD
    if store_ms >= round_start_ms:
        return HalfAction.WAIT
    age = now_ms - born_ms
    immunity = immunity_ms(props, config.transaction_timeout_ms)
    if immunity is not None:
        return HalfAction.REQUEUE if age < immunity else HalfAction.CHECK
    if 0 <= age < config.transaction_timeout_ms:
        return HalfAction.WAIT
    # older than the timeout, or born "in the future" (the producer's clock is ahead): check
    return HalfAction.CHECK


@attrs.define(eq=False)
class TransactionLedger:
    """The window of half records and ops the master reasons over (see the module doc)."""

    half_progress: int = 0
    # op queue cursor: every op before it names a record below half_progress
    op_progress: int = 0
    # how far the half / op queues were read into the ledger
    half_read: int = 0
    op_read: int = 0
    # half queue offset -> key, for records at or beyond half_progress
    _keys: dict[int, str] = attrs.field(factory=dict)
    # key -> its records at or beyond half_progress
    _copies: dict[str, set[int]] = attrs.field(factory=dict)
    # keys an op ended (forgotten when their last copy falls below the cursor)
    _ended: set[str] = attrs.field(factory=set)
    # (op queue offset, half queue offset) of the ops read, in op queue order
    _ops: collections.deque[tuple[int, int]] = attrs.field(factory=collections.deque)

    @classmethod
    def starting_at(cls, half_progress: int, op_progress: int) -> TransactionLedger:
        return cls(
            half_progress=half_progress,
            op_progress=op_progress,
            half_read=half_progress,
            op_read=op_progress,
        )

    # --- what was read ---------------------------------------------------------------------
    def add_half(self, offset: int, key: str) -> None:
        """A half record: read in queue order (moves ``half_read``), or just written by the
        check (a re-put copy: known at once, read again later)."""
        if offset == self.half_read:
            self.half_read = offset + 1
        if offset < self.half_progress:
            return
        self._keys[offset] = key
        self._copies.setdefault(key, set()).add(offset)

    def key_of(self, offset: int) -> str | None:
        return self._keys.get(offset)

    def add_op(self, op_offset: int, half_offset: int, key: str | None) -> None:
        """An op record read from the op queue; ``key`` of the half it names when known."""
        if op_offset < self.op_read:
            return  # read before
        self.op_read = op_offset + 1
        self._ops.append((op_offset, half_offset))
        self.mark_ended(half_offset, key)

    def mark_ended(self, half_offset: int, key: str | None) -> None:
        """An op names this record (written just now, or read back)."""
        if key is None:
            key = self._keys.get(half_offset)
        if key is not None and (half_offset >= self.half_progress or key in self._copies):
            self._ended.add(key)

    # --- questions -------------------------------------------------------------------------
    def live_copies(self, key: str) -> list[int]:
        return sorted(self._copies.get(key, ()))

    def is_ended(self, key: str, offset: int) -> bool:
        if key in self._ended:
            return True
        return offset < self.half_progress and not self._copies.get(key)

    # --- the cursor ------------------------------------------------------------------------
    def advance(self, half_progress: int) -> None:
        """The check handled every record below ``half_progress``."""
        if half_progress <= self.half_progress:
            return
        for off in range(self.half_progress, min(half_progress, self.half_read)):
            key = self._keys.pop(off, None)
            if key is None:
                continue
            copies = self._copies.get(key)
            if copies is not None:
                copies.discard(off)
                if not copies:
                    del self._copies[key]
                    self._ended.discard(key)
        self.half_progress = half_progress
        self.half_read = max(self.half_read, half_progress)
        while self._ops and self._ops[0][1] < half_progress:
            self._ops.popleft()
        self.op_progress = self._ops[0][0] if self._ops else self.op_read

    @property
    def window(self) -> int:
        """Records the ledger holds (its memory)."""
        return len(self._keys)


__all__ = [
    "CheckConfig",
    "HalfAction",
    "TransactionLedger",
    "check_times",
    "decide_half",
    "immunity_ms",
    "transaction_key",
]
