"""Pop consumption on the broker: pop, ack, change invisible time, revive (RocketMQ 5
``PopMessageProcessor``, ``AckMessageProcessor``, ``ChangeInvisibleTimeProcessor``,
``PopReviveService``).  ``controller.pop`` is one :class:`PopMessageService`.

Theory of operation
-------------------
*Pop* picks queues of the topic (the one asked, or all readable ones round-robin from a
per-group start) and, every fifth pop first and otherwise when room is left, the group's pop
retry queue ``%RETRY%<group>_<topic>``.  From each queue it reads from the group's consumer
offset, filtered by tag or SQL92 as the pull path filters, advances the offset past what it
read (so 4.x pulls of *other* groups are untouched, and those of the same group share it, as
in RocketMQ), and stamps what it took with a checkpoint (``broker/pop/checkpoint.py``, which
holds the invariants).  All of that happens in one synchronous step, so concurrent pops never
take the same message; the CK records are then appended to the revive topic and awaited
before the answer goes out, so an answered pop is replicated as the store replicates sends.

*Ack* clears an offset in its CK (an ``ack`` record follows); a stale handle (already acked,
revived, or replaced by a change of invisible time) changes nothing.  *ChangeInvisibleTime*
writes a one-message CK with pop time now, then acks the old handle, and answers the new handle;
the old one is stale from then on.

*Revive* (a task that runs only on a master / DLedger leader, started with that role) first
rebuilds the table from the revive topic, then every ``reviveInterval`` takes the due CKs and
re-puts each unacked message to the pop retry topic with ``reconsumeTimes + 1``, or to
``%DLQ%<group>`` when that would pass the group's ``retryMaxTimes`` (so attempts 1 to
``retryMaxTimes + 1`` are delivered, as RocketMQ 5's proxy lets through), then commits how far
each revive queue is done (invariant I2).

*FIFO* groups (``consumeMessageOrderly`` or the request's order flag) are locked per queue by
``broker/pop/order.py``; their batches are CKs marked ``order``, kept for durability and never
revived.

*Long polling* (``broker/pop/long_polling.py``): a pop that found nothing waits for an arrival
on its topic or retry topic, or a FIFO ack, up to its poll time, and looks once more at the end.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable

import attrs
import trio

from broker.broker_stats_manager import BROKER_GET_NUMS
from broker.controller import BrokerController
from broker.filter.consumer_filter_manager import is_tag_type
from broker.pop.api import (
    AckResult,
    AckStatus,
    ChangeInvisibleResult,
    ConsumeInitMode,
    PopMessage,
    PopRequest,
    PopResult,
    PopStatus,
)
from broker.pop.checkpoint import (
    ACK_TAG,
    CK_TAG,
    AckRecord,
    Checkpoint,
    CheckpointTable,
    decode_record_body,
)
from broker.pop.long_polling import PollingFull, PopLongPolling
from broker.pop.order import OrderInfoManager
from broker.pop.receipt import (
    POP_ORDER_REVIVE_QUEUE,
    REVIVE_GROUP,
    BadReceiptHandle,
    ReceiptHandle,
    pop_retry_topic,
    revive_topic,
)
from broker.schedule import trio_wall_clock_ms
from broker.store.results import MessageFilter, PutMessageStatus
from broker.subscription import TagMessageFilter, build_subscription_data
from common.message import MessageExt, MessageExtBrokerInner, decode_records
from common.message_properties import MessageConst
from common.model import PermName, SubscriptionGroupConfig
from common.topics import RETRY_GROUP_TOPIC_PREFIX, dlq_topic

log = logging.getLogger(__name__)

__all__ = ["PopMessageService"]

# RocketMQ: PopAckConstants.retryQueueNum
POP_RETRY_QUEUE_NUMS = 1
FIRST_POP_TIME = "1ST_POP_TIME"  # MessageConst.PROPERTY_FIRST_POP_TIME
# the longest a pop is held for long polling (RocketMQ 5's proxy holds a receive up to 20 s of
# long polling; its clients ask for less)
MAX_POLL_MS = 30_000


class PopMessageService:
    def __init__(self, broker: BrokerController, *, now_ms: Callable[[], int] | None = None):
        self.broker = broker
        # wall-clock ms; by default it follows the Trio clock from run_revive on (as the
        # schedule service's), so tests on the autojump clock see invisible times pass
        self.now_ms: Callable[[], int] = now_ms or (lambda: int(time.time() * 1000))
        self._clock_given = now_ms is not None
        # CK records being appended: the revive offsets are not committed meanwhile, since a
        # CK whose record is in the queue but whose offset is not known yet would be skipped
        self._ck_puts = 0
        self.table = CheckpointTable()
        self.order = OrderInfoManager()
        self.revive_topic = revive_topic(broker.config.broker_cluster_name)
        self.revive_queues = max(1, broker.config.revive_queue_num)
        self._revive_rr = itertools.count()
        self._pop_count = itertools.count()
        self._queue_rr: dict[tuple[str, str], int] = {}
        self.polling = PopLongPolling(broker.config.max_pop_polling_size)
        # True while this broker serves pop (master / leader with its table rebuilt); set with
        # _started, which requests that come while a master is still rebuilding wait for
        self.serving = False
        self._started = trio.Event()

    # --- helpers ------------------------------------------------------------------------------
    @property
    def _broker_name(self) -> str:
        return self.broker.config.broker_name

    def _group(self, group: str) -> SubscriptionGroupConfig | None:
        return self.broker.subscription_group_manager.find_subscription_group_config(group)

    def on_message_arriving(self, topic: str, queue_id: int, offset: int, tags: int) -> None:
        """Store arrival listener: wake the pops waiting on ``topic`` (or its retry topic)."""
        self.polling.on_message_arriving(topic, queue_id, offset, tags)

    # --- pop ----------------------------------------------------------------------------------
    async def _wait_serving(self) -> bool:
        """Serving now, or soon: a master that just started or was just elected rebuilds its
        table first (a few seconds at most are waited for; a slave is answered at once)."""
        if not self.serving and not self.broker.is_slave:
            with trio.move_on_after(3.0):
                await self._started.wait()
        return self.serving and not self.broker.is_slave

    async def pop(self, req: PopRequest) -> PopResult:
        b = self.broker
        if not await self._wait_serving():
            return PopResult(PopStatus.NOT_MASTER, remark="pop is served by the master only")
        if not PermName.is_readable(b.config.broker_permission):
            return PopResult(
                PopStatus.NO_PERMISSION,
                remark=f"the broker[{b.config.broker_ip1}] popping message is forbidden",
            )
        tc = b.topic_config_manager.select_topic_config(req.topic)
        if tc is None:
            return PopResult(
                PopStatus.TOPIC_NOT_EXIST,
                remark=f"topic[{req.topic}] not exist, apply first please!",
            )
        if not PermName.is_readable(tc.perm):
            return PopResult(
                PopStatus.NO_PERMISSION,
                remark=f"the topic[{req.topic}] peeking message is forbidden",
            )
        if req.queue_id >= tc.readQueueNums or req.queue_id < -1:
            return PopResult(
                PopStatus.BAD_REQUEST,
                remark=f"queueId[{req.queue_id}] is illegal, topic:[{req.topic}] "
                f"topicConfig.readQueueNums:[{tc.readQueueNums}]",
            )
        if req.max_msgs <= 0 or req.max_msgs > 32:
            return PopResult(
                PopStatus.BAD_REQUEST,
                remark=f"the broker msg num[{req.max_msgs}] cannot exceed 32 or be below 1",
            )
        if req.invisible_time_ms <= 0:
            return PopResult(
                PopStatus.BAD_REQUEST,
                remark=f"invisibleTime[{req.invisible_time_ms}] is illegal",
            )
        # (RocketMQ's order of checks: the broker, the topic, the queue, then the group)
        sgc = self._group(req.group)
        if sgc is None:
            return PopResult(
                PopStatus.SUBSCRIPTION_GROUP_NOT_EXIST,
                remark=f"subscription group [{req.group}] does not exist",
            )
        if not sgc.consumeEnable:
            return PopResult(
                PopStatus.NO_PERMISSION, remark=f"subscription group no permission, {req.group}"
            )
        try:
            mfilter = self._filter(req)
        except ValueError as exc:
            return PopResult(
                PopStatus.FILTER_ERROR, remark=f"parse the consumer's subscription failed: {exc}"
            )
        order = req.order or sgc.consumeMessageOrderly
        if req.queue_id >= 0:
            queues = [req.queue_id]
        else:
            n = tc.readQueueNums
            start = self._queue_rr.get((req.group, req.topic), 0)
            self._queue_rr[(req.group, req.topic)] = (start + 1) % max(n, 1)
            queues = [(start + i) % n for i in range(n)]

        # a pop is held at most MAX_POLL_MS whatever it asks (the pull path caps its suspend
        # the same way): a held pop is a task and a slot of maxPopPollingSize
        deadline = trio.current_time() + min(max(req.poll_time_ms, 0), MAX_POLL_MS) / 1000.0
        while True:
            # the waiter is registered before the look, so no arrival slips in between; the
            # look after the deadline is the last one (a FIFO lock may have lapsed meanwhile)
            if req.poll_time_ms <= 0 or trio.current_time() >= deadline:
                return await self._pop_once(req, sgc, queues, mfilter, order)
            try:
                with self.polling.waiter(req.topic) as ev:
                    result = await self._pop_once(req, sgc, queues, mfilter, order)
                    if result.status is not PopStatus.NO_NEW_MSG:
                        return result
                    with trio.move_on_at(deadline):
                        await ev.wait()
            except PollingFull:
                return PopResult(PopStatus.POLLING_FULL, remark="polling full")
            if not self.serving:
                return PopResult(PopStatus.NOT_MASTER, remark="no longer the master")

    def _filter(self, req: PopRequest) -> MessageFilter:
        etype = req.expression_type or "TAG"
        if is_tag_type(etype):
            return TagMessageFilter.of(build_subscription_data(req.topic, req.expression, "TAG"))
        if not self.broker.config.enable_property_filter:
            raise ValueError(f"The broker does not support consumer to filter message by {etype}")
        if not req.expression:
            raise ValueError(f"Expression can't be null! {etype}")
        return self.broker.consumer_filter_manager.get(etype, req.expression)

    def _start_offset(self, group: str, topic: str, qid: int, init_mode: ConsumeInitMode) -> int:
        store = self.broker.store
        off = self.broker.consumer_offset_manager.query_offset(group, topic, qid)
        if off < 0:
            # RocketMQ getInitOffset: a retry topic always from its start; LAST pops the last
            # message there is, then goes on from it
            if init_mode is ConsumeInitMode.MIN or topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                off = store.get_min_offset_in_queue(topic, qid)
            elif store.get_min_offset_in_queue(topic, qid) <= 0:
                # RocketMQ 5 initPopOffsetByCheckMsgInMem (on by default): a queue that still
                # holds its first message is read from it, so a new group (a 5.x consumer's, whose
                # proxy pops with ConsumeInitMode.MAX) sees what was sent before it started
                off = 0
            else:
                off = max(store.get_max_offset_in_queue(topic, qid) - 1, 0)
            self.broker.consumer_offset_manager.commit_offset(group, topic, qid, off)
        return max(off, store.get_min_offset_in_queue(topic, qid))

    async def _pop_once(
        self,
        req: PopRequest,
        sgc: SubscriptionGroupConfig,
        queues: list[int],
        mfilter: MessageFilter,
        order: bool,
    ) -> PopResult:
        now = self.now_ms()
        retry = pop_retry_topic(req.topic, req.group)
        # (a new master may hold revived messages before the retry topic's config reached it)
        has_retry = (
            self.broker.topic_config_manager.select_topic_config(retry) is not None
            or self.broker.store.get_max_offset_in_queue(retry, 0) > 0
        )
        sources = [(req.topic, q) for q in queues]
        if has_retry and not order:
            if next(self._pop_count) % 5 == 0:
                sources.insert(0, (retry, 0))
            else:
                sources.append((retry, 0))
        # one revive queue per pop (RocketMQ: the header's reviveQid names all its CKs)
        rqid = POP_ORDER_REVIVE_QUEUE if order else next(self._revive_rr) % self.revive_queues
        out: list[PopMessage] = []
        cks: list[Checkpoint] = []
        dead: list[MessageExt] = []
        rest = 0
        for topic, qid in sources:
            room = req.max_msgs - len(out)
            if room <= 0:
                rest += self._ready(req.group, topic, qid)
                continue
            if order:
                ck = self._pop_order(req, sgc, topic, qid, room, mfilter, now, out, dead)
            else:
                ck = self._pop_queue(req, topic, qid, room, mfilter, now, rqid, out)
            if ck is not None:
                cks.append(ck)
            rest += self._ready(req.group, topic, qid)
        # the records, then the answer: an answered pop is as durable as a send
        for ck in cks:
            await self._put_ck(ck)
        for m in dead:
            await self._put_dlq(req.group, m)
            for ck in self.table.ack_order(req.group, m.topic, m.queue_id, m.queue_offset):
                await self._put_ack(ck.key, m.queue_offset, ck.revive_qid)
        if not out:
            self.broker.stats.get_miss += 1
            return PopResult(PopStatus.NO_NEW_MSG, pop_time_ms=now, rest_num=rest)
        self._count_get(req, out)
        return PopResult(
            PopStatus.FOUND,
            out,
            pop_time_ms=now,
            invisible_time_ms=req.invisible_time_ms,
            revive_qid=rqid,
            rest_num=rest,
        )

    def _count_get(self, req: PopRequest, out: list[PopMessage]) -> None:
        """Popped messages count as gets (the pull TPS of ``rmq top``, ``rmq stats``)."""
        b = self.broker
        t = trio.current_time()
        b.stats.get_found += len(out)
        size = sum(len(p.msg.body) for p in out)
        b.stats.manager.inc_group_get(req.topic, req.group, len(out), size, t)
        b.stats.manager.inc_broker(BROKER_GET_NUMS, b.config.broker_cluster_name, len(out), t)

    def _ready(self, group: str, topic: str, qid: int) -> int:
        off = self.broker.consumer_offset_manager.query_offset(group, topic, qid)
        mx = self.broker.store.get_max_offset_in_queue(topic, qid)
        return max(0, mx - max(off, 0))

    def _read(
        self, group: str, topic: str, qid: int, offset: int, n: int, mfilter: MessageFilter
    ) -> tuple[list[MessageExt], int]:
        res = self.broker.store.get_message(group, topic, qid, offset, n, mfilter)
        msgs = decode_records(b"".join(bytes(x) for x in res.buffers)) if res.buffers else []
        nxt = res.next_begin_offset
        return msgs, nxt if nxt >= offset else offset

    def _pop_queue(
        self,
        req: PopRequest,
        topic: str,
        qid: int,
        room: int,
        mfilter: MessageFilter,
        now: int,
        rqid: int,
        out: list[PopMessage],
    ) -> Checkpoint | None:
        limit = self.broker.config.pop_inflight_message_threshold
        if self.table.inflight_in_queue(req.group, topic, qid) >= limit:
            return None  # too much unacked: the table stays bounded
        offset = self._start_offset(req.group, topic, qid, req.init_mode)
        msgs, nxt = self._read(req.group, topic, qid, offset, room, mfilter)
        if nxt != offset:
            self.broker.consumer_offset_manager.commit_offset(req.group, topic, qid, nxt)
        if not msgs:
            return None
        ck = Checkpoint(
            group=req.group,
            topic=topic,
            queue_id=qid,
            start_offset=msgs[0].queue_offset,
            pop_time=now,
            invisible_time=req.invisible_time_ms,
            revive_qid=rqid,
            offsets=[m.queue_offset for m in msgs],
            broker_name=self._broker_name,
        )
        self.table.add(ck)
        is_retry = topic != req.topic
        for m in msgs:
            handle = ReceiptHandle(
                ck.start_offset, now, req.invisible_time_ms, rqid, is_retry,
                self._broker_name, qid, m.queue_offset, m.commit_log_offset,
            )  # fmt: skip
            out.append(self._popped(m, req, handle, m.reconsume_times + 1, now))
        return ck

    def _popped(
        self, m: MessageExt, req: PopRequest, h: ReceiptHandle, attempt: int, now: int
    ) -> PopMessage:
        if m.topic != req.topic:
            m.topic = req.topic  # a revived message is answered under its own topic
        return PopMessage(m, h.encode(), attempt, now, req.invisible_time_ms)

    def _pop_order(
        self,
        req: PopRequest,
        sgc: SubscriptionGroupConfig,
        topic: str,
        qid: int,
        room: int,
        mfilter: MessageFilter,
        now: int,
        out: list[PopMessage],
        dead: list[MessageExt],
    ) -> Checkpoint | None:
        key = (req.group, topic, qid)
        if self.order.is_locked(key, now):
            return None
        offset = self._start_offset(req.group, topic, qid, req.init_mode)
        # past the max attempts: dead-lettered now, and the queue moves on (RocketMQ 5's proxy)
        while True:
            msgs, nxt = self._read(req.group, topic, qid, offset, room, mfilter)
            keep = list(msgs)
            while keep and self.order.attempt_of(key, keep[0].queue_offset) > sgc.retryMaxTimes + 1:
                m = keep.pop(0)
                dead.append(m)
                self.order.forget(key, m.queue_offset)
            if keep or not msgs:
                break
            offset = nxt
        if not keep:
            if nxt != offset or dead:
                self.broker.consumer_offset_manager.commit_offset(req.group, topic, qid, nxt)
            return None
        first = keep[0].queue_offset
        self.broker.consumer_offset_manager.commit_offset(req.group, topic, qid, first)
        self.order.begin(key, [m.queue_offset for m in keep], now, req.invisible_time_ms)
        for m in keep:
            attempt = self.order.attempt_of(key, m.queue_offset) - 1
            handle = ReceiptHandle(
                m.queue_offset, now, req.invisible_time_ms, POP_ORDER_REVIVE_QUEUE, False,
                self._broker_name, qid, m.queue_offset, m.commit_log_offset,
            )  # fmt: skip
            out.append(self._popped(m, req, handle, attempt, now))
        ck = Checkpoint(
            group=req.group,
            topic=topic,
            queue_id=qid,
            start_offset=first,
            pop_time=now,
            invisible_time=req.invisible_time_ms,
            revive_qid=next(self._revive_rr) % self.revive_queues,
            offsets=[m.queue_offset for m in keep],
            broker_name=self._broker_name,
            order=True,
        )
        self.table.add(ck)
        return ck

    # --- records ------------------------------------------------------------------------------
    def _ensure_revive_topic(self) -> None:
        self.broker.topic_config_manager.create_topic_in_send_message_back_method(
            self.revive_topic, self.revive_queues, PermName.READ | PermName.WRITE
        )

    async def _put_record(self, tag: str, body: bytes, qid: int) -> int:
        """Append one revive-log record; its queue offset, -1 when the store refused it."""
        self._ensure_revive_topic()
        b = self.broker
        msg = MessageExtBrokerInner(
            topic=self.revive_topic,
            queue_id=qid,
            body=body,
            properties={MessageConst.TAGS: tag},
            born_timestamp=self.now_ms(),
            born_host=b.store_host,
            store_host=b.store_host,
        )
        r = await b.store.put_message(msg)
        if r.append is None:
            log.error("pop: could not append a %s record: %s", tag, r.remark or r.status.name)
            return -1
        # a SYNC_MASTER answers a pop or an ack once a slave holds its record, as a send
        if b.ha is not None and b.store.broker_role == "SYNC_MASTER":
            status = await b.ha.wait_for_replica(r.append.wrote_offset + r.append.wrote_bytes)
            if status is not PutMessageStatus.PUT_OK:
                log.warning("pop: %s record not on a slave: %s", tag, status.name)
        return r.append.logics_offset

    async def _put_ck(self, ck: Checkpoint) -> None:
        self._ck_puts += 1
        try:
            ck.revive_offset = await self._put_record(CK_TAG, ck.to_json(), ck.revive_qid)
        finally:
            self._ck_puts -= 1

    async def _put_ack(
        self, ck_key: tuple[str, str, int, int, int], offset: int, rqid: int
    ) -> None:
        group, topic, qid, so, pt = ck_key
        rec = AckRecord(group, topic, qid, so, pt, offset, self._broker_name)
        await self._put_record(ACK_TAG, rec.to_json(), rqid)

    # --- ack / change -------------------------------------------------------------------------
    def _check(
        self, group: str, topic: str, receipt_handle: str
    ) -> tuple[ReceiptHandle, str] | AckResult:
        b = self.broker
        if not self.serving or b.is_slave:  # (callers waited in _wait_serving)
            return AckResult(AckStatus.NOT_MASTER, "ack is served by the master only")
        try:
            h = ReceiptHandle.parse(receipt_handle)
        except BadReceiptHandle as exc:
            return AckResult(AckStatus.BAD_HANDLE, str(exc))
        if h.broker_name != self._broker_name:
            return AckResult(AckStatus.BAD_HANDLE, f"the handle is of broker {h.broker_name}")
        if self._group(group) is None:
            return AckResult(
                AckStatus.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{group}] does not exist",
            )
        if b.topic_config_manager.select_topic_config(topic) is None:
            return AckResult(
                AckStatus.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
            )
        return h, h.real_topic(topic, group)

    async def ack(self, group: str, topic: str, receipt_handle: str) -> AckResult:
        await self._wait_serving()
        checked = self._check(group, topic, receipt_handle)
        if isinstance(checked, AckResult):
            return checked
        h, real = checked
        if h.order:
            key = (group, real, h.queue_id)
            nxt = self.order.ack(key, h.offset, h.pop_time)
            if nxt is None:
                return AckResult(AckStatus.EXPIRED, "the handle is stale")
            self.broker.consumer_offset_manager.commit_offset(group, real, h.queue_id, nxt)
            self.polling.wake(topic.removeprefix(f"{RETRY_GROUP_TOPIC_PREFIX}{group}_"))
            for ck in self.table.ack_order(group, real, h.queue_id, h.offset):
                await self._put_ack(ck.key, h.offset, ck.revive_qid)
            return AckResult(AckStatus.OK)
        ck_key = (group, real, h.queue_id, h.ck_offset, h.pop_time)
        if not self.table.ack(ck_key, h.offset):
            return AckResult(AckStatus.EXPIRED, "the handle is stale: acked, revived or changed")
        await self._put_ack(ck_key, h.offset, h.revive_qid)
        return AckResult(AckStatus.OK)

    async def change_invisible_time(
        self, group: str, topic: str, receipt_handle: str, invisible_time_ms: int
    ) -> ChangeInvisibleResult:
        await self._wait_serving()
        checked = self._check(group, topic, receipt_handle)
        if isinstance(checked, AckResult):
            return ChangeInvisibleResult(checked.status, remark=checked.remark)
        h, real = checked
        if invisible_time_ms < 0:
            return ChangeInvisibleResult(AckStatus.BAD_HANDLE, remark="invisibleTime < 0")
        now = self.now_ms()
        if h.order:
            key = (group, real, h.queue_id)
            if not self.order.change(key, h.offset, h.pop_time, now + invisible_time_ms):
                return ChangeInvisibleResult(AckStatus.EXPIRED, remark="the handle is stale")
            # RocketMQ keeps the pop time and stretches the invisible time for FIFO handles
            new_it = now + invisible_time_ms - h.pop_time
            # and persists it (ConsumerOrderInfoManager.updateNextVisibleTime): here the batch's
            # CK once more, with the new invisible time (checkpoint.py I5), answered once written
            # so a restart or a failover after the answer keeps the queue locked as long
            batch = self.order.batch(key)
            if batch is not None:
                ck = self.table.change_order_invisible(
                    (group, real, h.queue_id, batch.offsets[0], h.pop_time), new_it
                )
                if ck is not None:
                    await self._put_record(CK_TAG, ck.to_json(), ck.revive_qid)
            nh = attrs.evolve(h, invisible_time=new_it)
            return ChangeInvisibleResult(AckStatus.OK, nh.encode(), h.pop_time, new_it)
        old_key = (group, real, h.queue_id, h.ck_offset, h.pop_time)
        if not self.table.is_inflight(old_key, h.offset):
            return ChangeInvisibleResult(
                AckStatus.EXPIRED, remark="the handle is stale: acked, revived or changed"
            )
        if now == h.pop_time:
            now += 1  # the new CK must not share the old one's key
        ck = Checkpoint(
            group=group,
            topic=real,
            queue_id=h.queue_id,
            start_offset=h.offset,
            pop_time=now,
            invisible_time=invisible_time_ms,
            revive_qid=h.revive_qid,
            offsets=[h.offset],
            broker_name=self._broker_name,
        )
        # I3: the new CK first, then the old one acked, in memory and in the log alike
        self.table.add(ck)
        self.table.ack(old_key, h.offset)
        await self._put_ck(ck)
        await self._put_ack(old_key, h.offset, h.revive_qid)
        nh = attrs.evolve(h, ck_offset=h.offset, pop_time=now, invisible_time=invisible_time_ms)
        return ChangeInvisibleResult(AckStatus.OK, nh.encode(), now, invisible_time_ms)

    async def forward_to_dead_letter_queue(
        self, group: str, topic: str, receipt_handle: str
    ) -> AckResult:
        await self._wait_serving()
        checked = self._check(group, topic, receipt_handle)
        if isinstance(checked, AckResult):
            return checked
        h, real = checked
        m = self._look(group, real, h.queue_id, h.offset)
        if m is None:
            return AckResult(AckStatus.EXPIRED, "the message is gone")
        if h.order:
            if self.order.batch((group, real, h.queue_id)) is None:
                return AckResult(AckStatus.EXPIRED, "the handle is stale")
        elif not self.table.is_inflight(
            (group, real, h.queue_id, h.ck_offset, h.pop_time), h.offset
        ):
            return AckResult(AckStatus.EXPIRED, "the handle is stale: acked, revived or changed")
        await self._put_dlq(group, m)
        return await self.ack(group, topic, receipt_handle)

    def _look(self, group: str, topic: str, qid: int, offset: int) -> MessageExt | None:
        msgs, _ = self._read(group, topic, qid, offset, 1, TagMessageFilter(True, frozenset()))
        return msgs[0] if msgs and msgs[0].queue_offset == offset else None

    def _requeued(
        self, m: MessageExt, topic: str, reconsume: int, now: int
    ) -> MessageExtBrokerInner:
        props = dict(m.properties)
        if not m.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            props.setdefault(MessageConst.RETRY_TOPIC, m.topic)
        props.setdefault(MessageConst.ORIGIN_MESSAGE_ID, props.get("UNIQ_KEY") or m.msg_id)
        props.setdefault(FIRST_POP_TIME, str(now))
        return MessageExtBrokerInner(
            topic=topic,
            queue_id=0,
            flag=m.flag,
            body=m.body,
            properties=props,
            sys_flag=m.sys_flag,
            born_timestamp=m.born_timestamp,
            born_host=m.born_host,
            store_host=self.broker.store_host,
            reconsume_times=reconsume,
        )

    async def _put_dlq(self, group: str, m: MessageExt) -> bool:
        dlq = dlq_topic(group)
        self.broker.topic_config_manager.create_topic_in_send_message_back_method(
            dlq, 1, PermName.READ | PermName.WRITE
        )
        r = await self.broker.store.put_message(
            self._requeued(m, dlq, m.reconsume_times, self.now_ms())
        )
        return r.append is not None

    # --- revive -------------------------------------------------------------------------------
    async def revive_round(self) -> int:
        """Re-put the messages of every due CK; returns how many were re-put."""
        now = self.now_ms()
        n = 0
        for ck in self.table.pop_due(now):
            sgc = self._group(ck.group)
            max_times = sgc.retryMaxTimes if sgc is not None else 16
            orig = ck.topic
            if orig.startswith(RETRY_GROUP_TOPIC_PREFIX):
                orig = orig.removeprefix(f"{RETRY_GROUP_TOPIC_PREFIX}{ck.group}_")
            retry = pop_retry_topic(orig, ck.group)
            for off in ck.unacked():
                m = self._look(ck.group, ck.topic, ck.queue_id, off)
                if m is None:
                    continue  # rolled off the store
                if m.reconsume_times + 1 > max_times:
                    await self._put_dlq(ck.group, m)
                else:
                    self.broker.topic_config_manager.create_topic_in_send_message_back_method(
                        retry, POP_RETRY_QUEUE_NUMS, PermName.READ | PermName.WRITE
                    )
                    await self.broker.store.put_message(
                        self._requeued(m, retry, m.reconsume_times + 1, now)
                    )
                n += 1
        self._commit_revive_offsets()
        return n

    def _commit_revive_offsets(self) -> None:
        if self._ck_puts:
            return  # the next round commits (I2)
        store = self.broker.store
        com = self.broker.consumer_offset_manager
        ends = {
            q: store.get_max_offset_in_queue(self.revive_topic, q)
            for q in range(self.revive_queues)
        }
        for q, safe in self.table.safe_revive_offsets(ends).items():
            com.commit_offset(REVIVE_GROUP, self.revive_topic, q, safe)

    def recover(self) -> int:
        """Rebuild the table from the revive log (a master starting or a new leader)."""
        self.table.clear()
        self.order.clear()
        store = self.broker.store
        com = self.broker.consumer_offset_manager
        everything = TagMessageFilter(True, frozenset())
        records = 0
        for q in range(self.revive_queues):
            off = max(
                com.query_offset(REVIVE_GROUP, self.revive_topic, q),
                store.get_min_offset_in_queue(self.revive_topic, q),
            )
            mx = store.get_max_offset_in_queue(self.revive_topic, q)
            while off < mx:
                msgs, nxt = self._read(REVIVE_GROUP, self.revive_topic, q, off, 32, everything)
                for m in msgs:
                    tag = m.properties.get(MessageConst.TAGS, "")
                    rec = decode_record_body(tag, m.body, q)
                    records += 1
                    if isinstance(rec, Checkpoint):
                        rec.revive_offset = m.queue_offset
                        self.table.replay(rec)
                        if rec.order:
                            continue  # a FIFO group's offset stays at its first unacked
                        # I4: the pop offset is past every offset a CK holds
                        last = max(rec.offsets) + 1
                        if com.query_offset(rec.group, rec.topic, rec.queue_id) < last:
                            com.commit_offset(rec.group, rec.topic, rec.queue_id, last)
                    elif isinstance(rec, AckRecord):
                        self.table.ack(rec.key, rec.ack_offset)
                if nxt <= off:
                    break
                off = nxt
        self.order.rebuild(
            (
                (ck.group, ck.topic, ck.queue_id),
                ck.offsets,
                ck.acked,
                ck.pop_time,
                ck.invisible_time,
            )
            for ck in self.table.order_checkpoints()
        )
        return records

    async def run_revive(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The master's pop service: rebuild, then revive every ``reviveInterval``."""
        if not self._clock_given:
            self.now_ms = trio_wall_clock_ms()
        await self.broker.store.wait_dispatched()
        n = self.recover()
        log.info("pop: %d checkpoints in flight after replaying %d records", len(self.table), n)
        self.serving = True
        self._started.set()
        task_status.started()
        try:
            while True:
                await trio.sleep(self.broker.config.revive_interval)
                await self.revive_round()
        finally:
            self.serving = False
            self._started = trio.Event()
            self.polling.wake_all()

    # --- views (rmq top) ----------------------------------------------------------------------
    def inflight_in_queue(self, group: str, topic: str, queue_id: int) -> int:
        if not self.serving:
            return 0
        n = self.table.inflight_in_queue(group, topic, queue_id)
        batch = self.order.batch((group, topic, queue_id))
        if batch is not None and batch.blocks(self.now_ms()):
            n += len(batch.offsets) - len(batch.acked)
        return n

    def inflight(self, group: str, topic: str) -> int:
        return self.table.inflight(group, topic) + self.order.inflight(group, topic)

    def ready(self, group: str, topic: str) -> int:
        tc = self.broker.topic_config_manager.select_topic_config(topic)
        n = tc.readQueueNums if tc is not None else 0
        return sum(self._ready(group, topic, q) for q in range(n))
