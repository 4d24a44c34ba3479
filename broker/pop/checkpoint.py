"""Pop checkpoints and acks: the in-flight table and its log records (RocketMQ
``store/pop/PopCheckPoint.java``, ``AckMsg.java``).

Theory of operation
-------------------
A (non-FIFO) pop takes up to *n* messages from one queue and stamps them with one checkpoint
(CK): group, queue topic (the topic or the group's pop retry topic), queue id, the first
popped offset (``startOffset``), the pop time and the invisible time, and the list of popped
offsets.  Each message's receipt handle names its CK by (group, topic, queue, startOffset,
popTime) plus its own offset.  An ack clears that offset in the CK; a CK with every offset
acked is done.  A CK whose ``popTime + invisibleTime`` has passed is *due*: the reviver
re-puts its unacked messages (``broker/pop/revive.py``) and the CK is done.

Durability: the table is in memory, but every change is first a record in the cluster's revive
topic (``rmq_sys_REVIVE_LOG_<cluster>``, tag ``ck`` or ``ack``, JSON bodies with RocketMQ's
field names), appended through the ordinary store, so it is in the CommitLog, replicated to
SYNC_MASTER slaves by HA and to DLedger followers by Raft.  A master (or new leader) rebuilds
the table by replaying each revive queue from its committed offset (the group
``CID_RMQ_SYS_REVIVE_GROUP``'s offset, an ordinary consumer offset, so it is persisted and
synced to slaves like any other).

Invariants
----------
* I1: a CK's record precedes, in its revive queue, every ack record of it (the ack is written
  after the CK was answered to the client, which waited for the CK's put).
* I2: the committed revive offset of a queue is never beyond the record of a CK that is not
  done (:meth:`CheckpointTable.safe_revive_offsets`), so by I1 a replay from it sees every
  undone CK and all of its acks: the rebuilt table equals the lost one, except CKs revived or
  finished after the last commit, which come back (their messages are delivered again: at
  least once, never lost).
* I3: a message offset is in at most one undone CK per group: a change of invisible time
  makes a new one-message CK and acks the offset in the old one, in that order in the log.
* I4: the group's pop offset of a queue (its consumer offset) is beyond every offset in any
  CK of that queue; replay raises it to keep this when the offsets file lagged.
* I5: a FIFO CK may be written more than once under one key (a change of its invisible time,
  RocketMQ's ``updateNextVisibleTime``); the last record's invisible time is the batch's, its
  acks still come from the ack records.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator

import attrs

__all__ = ["AckRecord", "Checkpoint", "CheckpointTable", "CkKey", "decode_record_body"]

CK_TAG = "ck"
ACK_TAG = "ack"

# (group, queue topic, queue id, start offset, pop time)
CkKey = tuple[str, str, int, int, int]


@attrs.define(eq=False)
class Checkpoint:
    group: str
    topic: str  # the queue's topic: the topic itself or the group's pop retry topic
    queue_id: int
    start_offset: int
    pop_time: int
    invisible_time: int
    revive_qid: int
    offsets: list[int]
    broker_name: str
    acked: set[int] = attrs.field(factory=set)
    # queue offset of the CK's record in its revive queue (-1 until written)
    revive_offset: int = -1
    # a FIFO batch (broker/pop/order.py): never revived (its lapse just unlocks the queue); an
    # ack clears the offset in every FIFO CK of the queue, so the undone ones say how often
    # each unacked offset was handed out
    order: bool = False

    @property
    def key(self) -> CkKey:
        return (self.group, self.topic, self.queue_id, self.start_offset, self.pop_time)

    @property
    def revive_time(self) -> int:
        return self.pop_time + self.invisible_time

    @property
    def done(self) -> bool:
        return len(self.acked) >= len(self.offsets)

    def unacked(self) -> list[int]:
        return [o for o in self.offsets if o not in self.acked]

    def to_json(self) -> bytes:
        # PopCheckPoint's JSON names; bm is the bitmap of acked positions, d the diffs
        bm = 0
        for i, o in enumerate(self.offsets):
            if o in self.acked:
                bm |= 1 << i
        body = {
            "so": self.start_offset,
            "pt": self.pop_time,
            "it": self.invisible_time,
            "bm": bm,
            "n": len(self.offsets),
            "q": self.queue_id,
            "t": self.topic,
            "c": self.group,
            "ro": self.revive_offset,
            "d": [o - self.start_offset for o in self.offsets],
            "bn": self.broker_name,
        }
        if self.order:
            body["ord"] = 1  # ours: RocketMQ keeps FIFO state in consumerOrderInfo.json instead
        return json.dumps(body, separators=(",", ":")).encode()


@attrs.frozen
class AckRecord:
    group: str
    topic: str
    queue_id: int
    start_offset: int
    pop_time: int
    ack_offset: int
    broker_name: str

    @property
    def key(self) -> CkKey:
        return (self.group, self.topic, self.queue_id, self.start_offset, self.pop_time)

    def to_json(self) -> bytes:
        body = {
            "ao": self.ack_offset,
            "so": self.start_offset,
            "c": self.group,
            "t": self.topic,
            "q": self.queue_id,
            "pt": self.pop_time,
            "bn": self.broker_name,
        }
        return json.dumps(body, separators=(",", ":")).encode()


def decode_record_body(tag: str, body: bytes, revive_qid: int) -> Checkpoint | AckRecord | None:
    """A revive-log record back; None for one that is not ours or does not decode."""
    try:
        d = json.loads(body)
        if tag == CK_TAG:
            so = int(d["so"])
            offsets = [so + int(x) for x in d.get("d") or range(int(d["n"]))]
            bm = int(d.get("bm", 0))
            return Checkpoint(
                group=str(d["c"]),
                topic=str(d["t"]),
                queue_id=int(d["q"]),
                start_offset=so,
                pop_time=int(d["pt"]),
                invisible_time=int(d["it"]),
                revive_qid=revive_qid,
                offsets=offsets,
                broker_name=str(d.get("bn", "")),
                acked={o for i, o in enumerate(offsets) if bm >> i & 1},
                order=bool(d.get("ord")),
            )
        if tag == ACK_TAG:
            return AckRecord(
                group=str(d["c"]),
                topic=str(d["t"]),
                queue_id=int(d["q"]),
                start_offset=int(d["so"]),
                pop_time=int(d["pt"]),
                ack_offset=int(d["ao"]),
                broker_name=str(d.get("bn", "")),
            )
    except (ValueError, KeyError, TypeError):
        return None
    return None


@attrs.define(eq=False)
class CheckpointTable:
    """The undone checkpoints, by key and by revive time (sans-I/O)."""

    _cks: dict[CkKey, Checkpoint] = attrs.field(factory=dict)
    # (revive time, seq, key); stale entries (done or re-keyed CKs) are skipped when popped
    _heap: list[tuple[int, int, CkKey]] = attrs.field(factory=list)
    _seq: int = 0
    # unacked offsets per (group, queue topic, queue id), FIFO CKs not counted
    _per_queue: dict[tuple[str, str, int], int] = attrs.field(factory=dict)
    # (group, queue topic, queue id) -> keys of its undone FIFO CKs
    _order: dict[tuple[str, str, int], list[CkKey]] = attrs.field(factory=dict)

    def _count(self, ck: Checkpoint, delta: int) -> None:
        if ck.order:
            return
        k = (ck.group, ck.topic, ck.queue_id)
        n = self._per_queue.get(k, 0) + delta
        if n > 0:
            self._per_queue[k] = n
        else:
            self._per_queue.pop(k, None)

    def inflight_in_queue(self, group: str, topic: str, queue_id: int) -> int:
        return self._per_queue.get((group, topic, queue_id), 0)

    def __len__(self) -> int:
        return len(self._cks)

    def __iter__(self) -> Iterator[Checkpoint]:
        return iter(self._cks.values())

    def clear(self) -> None:
        self._cks.clear()
        self._heap.clear()
        self._per_queue.clear()
        self._order.clear()

    def add(self, ck: Checkpoint) -> None:
        if ck.done or ck.key in self._cks:
            return
        self._cks[ck.key] = ck
        if ck.order:
            self._order.setdefault((ck.group, ck.topic, ck.queue_id), []).append(ck.key)
            return
        self._count(ck, len(ck.offsets) - len(ck.acked))
        self._seq += 1
        heapq.heappush(self._heap, (ck.revive_time, self._seq, ck.key))

    def replay(self, ck: Checkpoint) -> None:
        """A CK record read back from the revive log.  A FIFO CK whose key is already held is
        a change of the batch's invisible time (I5): only that is taken from it (its bitmap may
        lag acks already applied, and its revive offset must stay the first record's, I2)."""
        held = self._cks.get(ck.key)
        if held is not None and held.order and ck.order:
            held.invisible_time = ck.invisible_time
            return
        self.add(ck)

    def change_order_invisible(self, key: CkKey, invisible_time: int) -> Checkpoint | None:
        """A FIFO batch's invisible time changed (from its pop time); the CK to write again,
        None when no undone FIFO CK has this key."""
        ck = self._cks.get(key)
        if ck is None or not ck.order:
            return None
        ck.invisible_time = invisible_time
        return ck

    def get(self, key: CkKey) -> Checkpoint | None:
        return self._cks.get(key)

    def ack(self, key: CkKey, offset: int) -> bool:
        """Clear one offset; False when no undone CK holds it unacked (a stale handle)."""
        ck = self._cks.get(key)
        if ck is None or offset not in ck.offsets or offset in ck.acked:
            return False
        ck.acked.add(offset)
        self._count(ck, -1)
        if ck.done:
            del self._cks[key]
            if ck.order:
                self._drop_order(ck)
        return True

    def _drop_order(self, ck: Checkpoint) -> None:
        k = (ck.group, ck.topic, ck.queue_id)
        keys = self._order.get(k)
        if keys is not None and ck.key in keys:
            keys.remove(ck.key)
            if not keys:
                del self._order[k]

    def order_checkpoints(self) -> list[Checkpoint]:
        return [self._cks[k] for keys in self._order.values() for k in keys]

    def ack_order(self, group: str, topic: str, queue_id: int, offset: int) -> list[Checkpoint]:
        """A FIFO offset acked (or dead-lettered): cleared in every FIFO CK of its queue; the
        CKs it was cleared in (each gets an ack record)."""
        hit = []
        for key in list(self._order.get((group, topic, queue_id), ())):
            ck = self._cks[key]
            if self.ack(key, offset):
                hit.append(ck)
        return hit

    def is_inflight(self, key: CkKey, offset: int) -> bool:
        ck = self._cks.get(key)
        return ck is not None and offset in ck.offsets and offset not in ck.acked

    def pop_due(self, now_ms: int) -> list[Checkpoint]:
        """Remove and return every undone CK whose revive time has come."""
        due: list[Checkpoint] = []
        while self._heap and self._heap[0][0] <= now_ms:
            _, _, key = heapq.heappop(self._heap)
            ck = self._cks.pop(key, None)
            if ck is not None:
                self._count(ck, -(len(ck.offsets) - len(ck.acked)))
                due.append(ck)
        return due

    def safe_revive_offsets(self, max_offsets: dict[int, int]) -> dict[int, int]:
        """I2: how far each revive queue may be committed (its oldest undone CK's record, or
        its end), in one pass over the table."""
        out = dict(max_offsets)
        for ck in self._cks.values():
            lowest = out.get(ck.revive_qid)
            if lowest is not None and 0 <= ck.revive_offset < lowest:
                out[ck.revive_qid] = ck.revive_offset
        return out

    def inflight(self, group: str, topic: str) -> int:
        """Messages popped and not yet acked nor revived, of a group on a queue topic."""
        return sum(
            len(ck.offsets) - len(ck.acked)
            for ck in self._cks.values()
            if ck.group == group and ck.topic == topic and not ck.order
        )
