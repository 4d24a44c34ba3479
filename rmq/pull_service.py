"""The pull loop of each queue a push consumer owns (Java PullMessageService, with
DefaultMQPushConsumerImpl.pullMessage and its PullCallback).

Theory of operation
-------------------
The rebalance (`rmq/rebalance.py`) decides which queues the consumer owns; for each new one it
calls the consumer's `start_pull`, which starts `PullMessageService.pull_loop` in the
consumer's nursery. The loop ends when the queue's ProcessQueue is dropped (the rebalance gave
the queue away, or the consumer is shutting down) or its topic is no longer subscribed.

Each round is one PULL_MESSAGE with long polling (the broker holds it up to 15 s; we wait
30 s), the subscription in the request (Java's postSubscriptionWhenPull, so a pull never
depends on a heartbeat having arrived), and the COMMIT_OFFSET bit plus the queue's in-memory
offset when there is one and we pull from the master. It pulls from the node the broker
suggested on the previous pull (suggestWhichBrokerId, e.g. a slave while the master is far
behind). Then, by the answer:

* FOUND: messages are tag-filtered again on the client (the broker compares tag hash codes
  only), put into the ProcessQueue and handed to the consume service.
* NO_NEW_MSG / NO_MATCHED_MSG: move on; with nothing cached, the offset store follows
  (correctTagsOffset).
* OFFSET_ILLEGAL: the queue is dropped with the broker's next offset persisted, and the next
  rebalance (asked for at once) starts it again from there.
* An error waits 3 s; a retriable one also forgets the topic's route and the suggested node.

Flow control: while the ProcessQueue holds more than `pull_threshold_for_queue` messages or
`pull_threshold_size` bytes, the loop waits 50 ms and checks again. An orderly consumer in
clustering mode pulls a queue only while the broker's lock on it is held.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

import trio

from common.model import MessageQueue, SubscriptionData
from common.remoting.codes import ResponseCode
from rmq.client_api import PULL_COMMIT_OFFSET, PULL_SUBSCRIPTION, PULL_SUSPEND, PullResponse
from rmq.client_instance import ClientInstance
from rmq.consume_service import ConsumeMessageConcurrentlyService, ConsumeMessageOrderlyService
from rmq.offset_store import OffsetStore, ReadOffsetType
from rmq.process_queue import ProcessQueue
from rmq.rebalance import RebalanceImpl

log = logging.getLogger(__name__)

BROKER_SUSPEND_MAX_TIME = 15.0  # BROKER_SUSPEND_MAX_TIME_MILLIS
CONSUMER_TIMEOUT_WHEN_SUSPEND = 30.0  # CONSUMER_TIMEOUT_MILLIS_WHEN_SUSPEND
PULL_DELAY_WHEN_FLOW_CONTROL = 0.05
PULL_DELAY_WHEN_EXCEPTION = 3.0


class PullingConsumer(Protocol):
    """What the pull loops need of their push consumer: its subscription and mode, the flow
    control limits, where offsets are kept, the client to reach brokers with, and the
    rebalance to hand a queue back to."""

    # messages pulled and handed to the consume service, counted here
    stats_consumed: int

    @property
    def group(self) -> str: ...

    @property
    def subscriptions(self) -> Mapping[str, SubscriptionData]: ...

    @property
    def orderly(self) -> bool: ...

    @property
    def broadcasting(self) -> bool: ...

    @property
    def pull_batch_size(self) -> int: ...

    @property
    def pull_threshold_for_queue(self) -> int: ...

    @property
    def pull_threshold_size(self) -> int: ...

    @property
    def client(self) -> ClientInstance: ...

    @property
    def offset_store(self) -> OffsetStore: ...

    @property
    def rebalance(self) -> RebalanceImpl: ...

    def rebalance_immediately(self) -> None: ...


class PullMessageService:
    """The pull loops of one push consumer, run in its nursery, feeding its consume service."""

    def __init__(
        self,
        consumer: PullingConsumer,
        consume_service: ConsumeMessageOrderlyService | ConsumeMessageConcurrentlyService,
        nursery: trio.Nursery,
    ) -> None:
        self.c = consumer
        self.consume_service = consume_service
        self.nursery = nursery
        # queue -> broker id the broker suggested on the last pull
        self.suggested: dict[MessageQueue, int] = {}

    def start(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        """Pull ``mq`` from ``offset`` into ``pq`` until ``pq`` is dropped."""
        self.nursery.start_soon(self.pull_loop, mq, pq, offset)

    async def pull_loop(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        c = self.c
        sub = c.subscriptions.get(mq.topic)
        # the tags to check again here; none for '*' and for SQL92 (the broker evaluated it)
        wanted = set(sub.tagsSet) if sub is not None and sub.tagsSet else None
        while not pq.dropped:
            if pq.msg_count > c.pull_threshold_for_queue or pq.msg_size > c.pull_threshold_size:
                await trio.sleep(PULL_DELAY_WHEN_FLOW_CONTROL)
                continue
            if c.orderly and not c.broadcasting and not pq.locked:
                await trio.sleep(PULL_DELAY_WHEN_EXCEPTION)
                continue
            sub = c.subscriptions.get(mq.topic)
            if sub is None:
                return
            try:
                resp = await self.pull_once(mq, offset, sub)
            except Exception as exc:
                log.warning("pull %s at %d failed: %s", mq, offset, exc)
                if getattr(exc, "retriable", False):
                    c.client.invalidate(mq.topic)
                    self.suggested.pop(mq, None)
                await trio.sleep(PULL_DELAY_WHEN_EXCEPTION)
                continue
            if pq.dropped:
                return
            self.suggested[mq] = resp.suggest_which_broker_id
            if resp.code == ResponseCode.PULL_OFFSET_MOVED:
                log.warning(
                    "%s: offset %d illegal, broker says %d", mq, offset, resp.next_begin_offset
                )
                pq.dropped = True
                c.offset_store.update_offset(mq, resp.next_begin_offset)
                await c.offset_store.persist(mq)
                c.rebalance.remove_process_queue(mq)
                c.rebalance_immediately()
                return
            offset = resp.next_begin_offset
            msgs = resp.messages
            if wanted is not None:
                msgs = [m for m in msgs if m.tags in wanted]
            if msgs:
                pq.put(msgs)
                c.stats_consumed += len(msgs)
                self.consume_service.submit(msgs, pq, mq)
            elif pq.msg_count == 0:
                # correctTagsOffset: nothing cached, so the next offset is safe to commit
                c.offset_store.update_offset(mq, offset, increase_only=True)

    async def pull_once(self, mq: MessageQueue, offset: int, sub: SubscriptionData) -> PullResponse:
        c = self.c
        client = c.client
        addr, is_slave = await client.subscribe_addr(
            mq.brokerName, self.suggested.get(mq, 0), mq.topic
        )
        commit = -1
        if not c.broadcasting:
            commit = await c.offset_store.read_offset(mq, ReadOffsetType.MEMORY)
        sys_flag = PULL_SUSPEND | PULL_SUBSCRIPTION
        if commit > 0 and not is_slave:
            sys_flag |= PULL_COMMIT_OFFSET
        return await client.api.pull_message(
            addr,
            group=c.group,
            mq=mq,
            offset=offset,
            max_nums=c.pull_batch_size,
            sys_flag=sys_flag,
            commit_offset=max(commit, 0),
            suspend_ms=int(BROKER_SUSPEND_MAX_TIME * 1000),
            subscription=sub.subString,
            sub_version=sub.subVersion,
            timeout=CONSUMER_TIMEOUT_WHEN_SUSPEND,
            expression_type=sub.expressionType or "TAG",
        )
