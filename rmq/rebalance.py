"""Which queues this consumer pulls (Java RebalanceImpl / RebalancePushImpl + AllocateMessageQueueAveragely).

Theory of operation
-------------------
`allocate_averagely` is AllocateMessageQueueAveragely exactly: both lists sorted, this
client's index in the member list, the first `len(mqs) % len(cids)` members take one queue
more, and the queues are handed out in contiguous runs. Every member computes the same split
from the same (sorted) inputs, so no coordination is needed beyond an agreed member list.

`RebalanceImpl.do_rebalance` runs every 20 s and whenever the broker says the group changed
(NOTIFY_CONSUMER_IDS_CHANGED). Per subscribed topic (the user's and, in clustering mode,
`%RETRY%<group>`): the readable queues of the route, the member ids of the group from one
broker of that topic (GET_CONSUMER_LIST_BY_GROUP), the allocation; in broadcasting mode every
queue. Then the process queue table is brought in line:

* a queue no longer allocated is marked dropped (its pull loop stops, in-flight results are not
  committed) and its offset persisted before it is forgotten, so the next owner starts where
  this one got to; an orderly queue is also unlocked on the broker, after waiting (1 s at most,
  as Java's tryLock) for a listener call in progress on it;
* a newly allocated queue gets its start offset (`compute_pull_from_where`) and a pull loop;
  an orderly queue must first be locked on the broker (LOCK_BATCH_MQ), otherwise it is left
  for the next rebalance.

A subscribed topic the nameserver has no route for (TOPIC_NOT_EXIST, 17) is not an error of
the rebalance: the topic may simply not be created yet. It is said once per topic, at WARNING,
in words a user can act on (the group's retry topic only at DEBUG: the brokers create it); the rebalances after that repeat it at DEBUG only, until the topic
is found (then the next disappearance is said again) or fails some other way. The rebalance
that first finds it sends a heartbeat before asking for the group's members, so the new
topic's brokers know this consumer without waiting for the 30 s heartbeat.

`lock_all` (orderly, every 20 s) renews the locks of every held queue per broker and marks
the ones the broker refused as not locked, so their consume task stops until a later lock
succeeds. `unlock_all` runs at shutdown.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Mapping
from typing import Protocol

import trio

from common.errors import TopicNotExistError
from common.model import MessageQueue
from common.topics import RETRY_GROUP_TOPIC_PREFIX
from rmq.client_instance import ClientInstance
from rmq.offset_store import OffsetStore
from rmq.process_queue import ProcessQueue
from rmq.topic_publish_info import subscribe_queues

log = logging.getLogger(__name__)


def _mq_key(mq: MessageQueue) -> tuple[str, str, int]:
    return (mq.topic, mq.brokerName, mq.queueId)  # MessageQueue.compareTo


def allocate_averagely(
    group: str, me: str, mqs: list[MessageQueue], cids: list[str]
) -> list[MessageQueue]:
    """AllocateMessageQueueAveragely: this member's share of `mqs` among `cids`."""
    if not me or not mqs or not cids:
        return []
    mq_all = sorted(mqs, key=_mq_key)
    cid_all = sorted(cids)
    if me not in cid_all:
        log.info("[BUG] consumer group %s: client id %s not in %s", group, me, cid_all)
        return []
    index = cid_all.index(me)
    n, m = len(mq_all), len(cid_all)
    mod = n % m
    if n <= m:
        average = 1
    elif mod > 0 and index < mod:
        average = n // m + 1
    else:
        average = n // m
    start = index * average if mod > 0 and index < mod else index * average + mod
    count = min(average, n - start)
    return [mq_all[(start + i) % n] for i in range(max(0, count))]


class RebalanceConsumer(Protocol):
    """What a rebalance needs of its push consumer: the subscription and mode, where offsets
    are kept, the client to reach brokers with, and how a queue's pulls start."""

    @property
    def group(self) -> str: ...

    @property
    def client_id(self) -> str: ...

    @property
    def timeout(self) -> float: ...

    @property
    def subscriptions(self) -> Mapping[str, object]: ...

    @property
    def orderly(self) -> bool: ...

    @property
    def broadcasting(self) -> bool: ...

    @property
    def offset_store(self) -> OffsetStore: ...

    @property
    def client(self) -> ClientInstance: ...

    async def compute_pull_from_where(self, mq: MessageQueue) -> int: ...

    def start_pull(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None: ...


class RebalanceImpl:
    """The queue table of one push consumer."""

    def __init__(self, consumer: RebalanceConsumer) -> None:
        self.c = consumer
        # queue -> its ProcessQueue while this consumer owns it (pull loop running)
        self.process_queue_table: dict[MessageQueue, ProcessQueue] = {}
        # queues a LOCK_BATCH_MQ was sent for and no unlock since: a lock granted to a
        # rebalance that was cancelled before it recorded the queue is still released
        self.lock_requested: set[MessageQueue] = set()
        # subscribed topics whose missing route was already said at WARNING; a topic leaves
        # the set when a rebalance of it gets past the route (or fails another way)
        self.missing_topics: set[str] = set()

    # --- rebalance ----------------------------------------------------------------------------

    async def do_rebalance(self) -> None:
        topics = list(self.c.subscriptions)
        for topic in topics:
            try:
                await self._rebalance_by_topic(topic)
            except TopicNotExistError:
                self._topic_missing(topic)
            except Exception as exc:  # one topic's trouble does not stop the others
                self.missing_topics.discard(topic)
                log.warning("rebalance of %s for group %s failed: %s", topic, self.c.group, exc)
            else:
                self.missing_topics.discard(topic)
        for mq in [mq for mq in self.process_queue_table if mq.topic not in topics]:
            await self._drop(mq)

    def _topic_missing(self, topic: str) -> None:
        if topic in self.missing_topics:
            log.debug("group %s: topic %s still has no route", self.c.group, topic)
            return
        self.missing_topics.add(topic)
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            # the brokers create %RETRY%<group> when the group's heartbeat reaches them: not
            # the user's to fix, and said only while no subscribed topic has a broker yet
            log.debug("group %s: retry topic %s has no route yet", self.c.group, topic)
            return
        log.warning(
            "group %s: topic %s does not exist on any broker (route not found); "
            "the consumer will pick it up when it is created",
            self.c.group,
            topic,
        )

    async def _rebalance_by_topic(self, topic: str) -> None:
        c = self.c
        route = await c.client.route(topic)
        mqs = subscribe_queues(topic, route)
        if c.broadcasting:
            await self.update_process_queue_table(topic, set(mqs))
            return
        if not route.brokerDatas:
            return
        if topic in self.missing_topics:
            # it was just created: its brokers have not had our heartbeat yet, and would
            # answer that the group has no consumer until the next one (30 s)
            await c.client.send_heartbeat_to_all_brokers()
        bd = random.choice(route.brokerDatas)
        addr = bd.brokerAddrs.get(0) or next(iter(bd.brokerAddrs.values()), None)
        if addr is None:
            return
        cids = await c.client.api.get_consumer_id_list(addr, c.group, timeout=c.timeout)
        mine = allocate_averagely(c.group, c.client_id, mqs, cids)
        await self.update_process_queue_table(topic, set(mine))

    async def update_process_queue_table(self, topic: str, mq_set: set[MessageQueue]) -> bool:
        """Drop queues of `topic` not in `mq_set`, start the new ones; True when it changed."""
        changed = False
        for mq in [mq for mq in self.process_queue_table if mq.topic == topic]:
            if mq not in mq_set:
                changed |= await self._drop(mq)
        for mq in sorted(mq_set - set(self.process_queue_table), key=_mq_key):
            if self.c.orderly and not self.c.broadcasting and not await self.lock(mq):
                log.info("group %s: %s not added, its lock is held elsewhere", self.c.group, mq)
                continue
            self.c.offset_store.remove_offset(mq)  # Java removeDirtyOffset
            offset = await self.c.compute_pull_from_where(mq)
            if offset < 0:
                log.warning("group %s: no start offset for %s yet", self.c.group, mq)
                continue
            pq = ProcessQueue()
            if self.c.orderly and not self.c.broadcasting:
                pq.locked, pq.last_lock_time = True, trio.current_time()
            self.process_queue_table[mq] = pq
            self.c.start_pull(mq, pq, offset)
            changed = True
            log.info("group %s: %s now pulled from offset %d", self.c.group, mq, offset)
        return changed

    async def _drop(self, mq: MessageQueue) -> bool:
        pq = self.process_queue_table.get(mq)
        if pq is None:
            return False
        pq.dropped = True
        if not await self.remove_unnecessary_mq(mq, pq):
            return False
        self.process_queue_table.pop(mq, None)
        log.info("group %s: %s dropped", self.c.group, mq)
        return True

    def remove_process_queue(self, mq: MessageQueue) -> None:
        pq = self.process_queue_table.pop(mq, None)
        if pq is not None:
            pq.dropped = True

    async def remove_unnecessary_mq(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """Persist the queue's offset (and unlock it, orderly) before it leaves this consumer."""
        c = self.c
        if c.orderly and not c.broadcasting:
            with trio.move_on_after(1.0) as scope:
                async with pq.consume_lock:
                    await c.offset_store.persist(mq)
                    c.offset_store.remove_offset(mq)
                    await self.unlock([mq])
            if scope.cancelled_caught:
                log.info("group %s: %s is being consumed, drop it later", c.group, mq)
                return False
            return True
        await c.offset_store.persist(mq)
        c.offset_store.remove_offset(mq)
        return True

    def assigned(self) -> frozenset[MessageQueue]:
        return frozenset(self.process_queue_table)

    # --- orderly locks -----------------------------------------------------------------------

    async def _master(self, mq: MessageQueue) -> str | None:
        try:
            return await self.c.client.master_addr(mq.brokerName, mq.topic)
        except Exception as exc:
            log.warning("no master for %s: %s", mq.brokerName, exc)
            return None

    async def lock(self, mq: MessageQueue) -> bool:
        addr = await self._master(mq)
        if addr is None:
            return False
        self.lock_requested.add(mq)
        try:
            ok = await self.c.client.api.lock_batch_mq(
                addr, self.c.group, self.c.client_id, [mq], timeout=self.c.timeout
            )
        except Exception as exc:
            log.warning("LOCK_BATCH_MQ %s failed: %s", mq, exc)
            return False
        pq = self.process_queue_table.get(mq)
        if pq is not None:
            pq.locked = mq in ok
            if pq.locked:
                pq.last_lock_time = trio.current_time()
        return mq in ok

    async def lock_all(self) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in self.process_queue_table:
            by_broker.setdefault(mq.brokerName, []).append(mq)
        for mqs in by_broker.values():
            addr = await self._master(mqs[0])
            if addr is None:
                continue
            try:
                ok = await self.c.client.api.lock_batch_mq(
                    addr, self.c.group, self.c.client_id, mqs, timeout=self.c.timeout
                )
            except Exception as exc:
                log.warning("LOCK_BATCH_MQ on %s failed: %s", addr, exc)
                continue
            now = trio.current_time()
            for mq in mqs:
                pq = self.process_queue_table.get(mq)
                if pq is None:
                    continue
                pq.locked = mq in ok
                if pq.locked:
                    pq.last_lock_time = now
                else:
                    log.info("group %s: lock of %s lost", self.c.group, mq)

    async def unlock(self, mqs: Iterable[MessageQueue]) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.brokerName, []).append(mq)
        for group_mqs in by_broker.values():
            self.lock_requested.difference_update(group_mqs)
            addr = await self._master(group_mqs[0])
            if addr is None:
                continue
            try:
                await self.c.client.api.unlock_batch_mq(
                    addr, self.c.group, self.c.client_id, group_mqs, timeout=self.c.timeout
                )
            except Exception as exc:
                log.warning("UNLOCK_BATCH_MQ on %s failed: %s", addr, exc)
            for mq in group_mqs:
                pq = self.process_queue_table.get(mq)
                if pq is not None:
                    pq.locked = False

    async def unlock_all(self) -> None:
        await self.unlock(set(self.process_queue_table) | self.lock_requested)
