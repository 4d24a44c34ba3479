"""PushConsumer: the broker's messages delivered to a listener (Java DefaultMQPushConsumerImpl).

Theory of operation
-------------------
`async with PushConsumer(group, namesrv) as c:` registers the group with its ClientInstance,
fetches the routes of the subscribed topics (and of `%RETRY%<group>` in clustering mode, which
Java subscribes automatically), sends HEART_BEAT to their brokers and rebalances at once. Then
these tasks run in the consumer's nursery until the `async with` ends:

* rebalance: every `rebalance_interval` (20 s) and whenever the broker sends
  NOTIFY_CONSUMER_IDS_CHANGED (`rebalance_immediately`), `RebalanceImpl.do_rebalance`.
* one pull loop per assigned queue (`rmq/pull_service.py`, Java's PullMessageService and
  PullCallback): long-polling PULL_MESSAGE, client-side tag filtering, flow control, the
  OFFSET_ILLEGAL reset; what it pulls goes to the consume service (`rmq/consume_service.py`).
* offsets: `persist_interval` (5 s) persistAll of the assigned queues.
* orderly only: `lock_all` every 20 s.

Start offsets are Java's RebalancePushImpl.computePullFromWhere, on purpose: the group's
offset from the broker (QUERY_CONSUMER_OFFSET) when it answers one, and only when it answers
"not found" (-1) the consume_from policy: LAST_OFFSET -> the queue's max offset (0 for a retry
topic), FIRST_OFFSET -> 0, TIMESTAMP -> the broker's SEARCH_OFFSET_BY_TIMESTAMP for
`consume_timestamp_ms` (default: 30 minutes ago; a retry topic starts at its max offset).
A broker that cannot be asked (-2) leaves the queue for the next rebalance. Consequence, kept
as RocketMQ has it: the broker answers 0 for a group that never committed while the queue
still starts at offset 0, so a new LAST_OFFSET group reads such a queue from its first
message (RocketMQ's way of not losing what a new topic received before its first consumer
started). We keep it because Java, C++ and Python members of one group must agree on where a
queue starts, and users of RocketMQ expect it. `rmq consume` is a tool, not a group member,
and promises "a new group starts at the queue's end": it checks the 0 itself
(cli/messages/consume.py).

Leaving the `async with` stops pulling, persists every offset, unlocks orderly queues and
sends UNREGISTER_CLIENT to every broker (shielded, 3 s at most), so the group rebalances
without waiting 120 s for the broker to expire us. Deviation: our client objects each own
their ClientInstance (Java shares one per instance name and JVM).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Self

import trio

from common import serde
from common.message import MessageExt, decode_record
from common.model import (
    ConsumeFromWhere,
    ConsumerData,
    ConsumeType,
    MessageModel,
    MessageQueue,
    SubscriptionData,
)
from common.mq_map import encode_mq_map
from common.remoting.codes import ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.network import Network
from common.session_credentials import SessionCredentials
from common.topics import RETRY_GROUP_TOPIC_PREFIX
from rmq.client_instance import ClientBase, ClientInstance
from rmq.consume_service import (
    ConsumeMessageConcurrentlyService,
    ConsumeMessageOrderlyService,
    ConsumeStatus,
    Listener,
    OrderlyStatus,
)
from rmq.errors import ClientError
from rmq.message_selector import MessageSelector
from rmq.offset_store import (
    LocalFileOffsetStore,
    OffsetStore,
    ReadOffsetType,
    RemoteBrokerOffsetStore,
)
from rmq.process_queue import ProcessQueue
from rmq.producer import open_trace_dispatcher
from rmq.pull_service import PullMessageService
from rmq.rebalance import RebalanceImpl, allocate_averagely
from rmq.remoting import Remoting
from rmq.trace.hooks import ConsumeTracer

log = logging.getLogger(__name__)

__all__ = [
    "ConsumeFromWhere",
    "ConsumeStatus",
    "MessageModel",
    "OrderlyStatus",
    "PushConsumer",
    "allocate_averagely",
]

LOCK_INTERVAL = 20.0


def build_subscription(topic: str, expression: str | MessageSelector) -> SubscriptionData:
    """FilterAPI.build: tags split on '||', hash codes of each; a SQL92 expression as it is."""
    return MessageSelector.of(expression).subscription(topic)


class PushConsumer(ClientBase):
    """`async with PushConsumer("cg", ns) as c:` after `subscribe` and `register_listener`."""

    def __init__(
        self,
        group: str,
        namesrv: str | list[str] = "127.0.0.1:9876",
        *,
        message_model: MessageModel = MessageModel.CLUSTERING,
        consume_from: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_timestamp_ms: int | None = None,
        max_reconsume_times: int = 16,
        pull_batch_size: int = 32,
        consume_batch_max_size: int = 1,
        consume_concurrency: int = 20,
        pull_threshold_for_queue: int = 1000,
        pull_threshold_size_for_queue_mib: int = 100,
        offset_store_dir: str | os.PathLike[str] | None = None,
        instance_name: str | None = None,
        rebalance_interval: float = 20.0,
        persist_interval: float = 5.0,
        heartbeat_interval: float = 30.0,
        timeout: float = 3.0,
        remoting: Remoting | None = None,
        network: Network | None = None,
        credentials: SessionCredentials | None = None,
        enable_trace: bool = False,
        trace_topic: str | None = None,
    ) -> None:
        super().__init__(
            namesrv,
            remoting=remoting,
            network=network,
            timeout=timeout,
            instance_name=instance_name,
            heartbeat_interval=heartbeat_interval,
            credentials=credentials,
        )
        if not group:
            raise ClientError("consumer group is empty")
        if not 1 <= pull_batch_size <= 1024:
            raise ClientError("pull_batch_size must be within 1..1024")
        if not 1 <= consume_batch_max_size <= 1024:
            raise ClientError("consume_batch_max_size must be within 1..1024")
        if consume_concurrency < 1:
            raise ClientError("consume_concurrency must be >= 1")
        self.group = group
        # a member, its name ("BROADCASTING", "FIRST_OFFSET") or its wire ordinal, as on the wire
        self.message_model = serde.converter.structure(message_model, MessageModel)
        self.consume_from = serde.converter.structure(consume_from, ConsumeFromWhere)
        self.consume_timestamp_ms = consume_timestamp_ms
        self.max_reconsume_times = max_reconsume_times
        self.pull_batch_size = pull_batch_size
        self.consume_batch_max_size = consume_batch_max_size
        self.consume_concurrency = consume_concurrency
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.pull_threshold_size = pull_threshold_size_for_queue_mib * 1024 * 1024
        self.offset_store_dir = Path(
            offset_store_dir if offset_store_dir is not None else Path.home() / ".rocketmq_offsets"
        )
        self.rebalance_interval = rebalance_interval
        self.persist_interval = persist_interval
        self.timeout = timeout
        # topic -> subscription (the user's, plus %RETRY%group in clustering mode)
        self.subscriptions: dict[str, SubscriptionData] = {}
        self._listener: Listener | None = None
        self.orderly = False
        self.rebalance = RebalanceImpl(self)
        # all made by `_start`: the remote store needs the client, the services the nursery
        self._offset_store: OffsetStore | None = None
        self._consume_service: (
            ConsumeMessageOrderlyService | ConsumeMessageConcurrentlyService | None
        ) = None
        self._pull_service: PullMessageService | None = None
        # set to run a rebalance now rather than at the next interval
        self._rebalance_wakeup = trio.Event()
        self._start_ms = 0
        # the ClientInstance from start until the end of shutdown
        self._live: ClientInstance | None = None
        self.stats_consumed = 0
        self.stats_failed = 0
        # message trace: SubBefore/SubAfter records around each listener call
        self.enable_trace = enable_trace
        self.trace_topic = trace_topic

    @property
    def client(self) -> ClientInstance:
        # ClientBase forgets its instance before the exit stack runs; our shutdown still needs it
        if self._live is not None:
            return self._live
        return super().client

    @property
    def offset_store(self) -> OffsetStore:
        if self._offset_store is None:
            raise ClientError("the consumer is not started: no offset store yet")
        return self._offset_store

    @property
    def _service(self) -> ConsumeMessageOrderlyService | ConsumeMessageConcurrentlyService:
        if self._consume_service is None:
            raise ClientError("the consumer is not started: no consume service yet")
        return self._consume_service

    @property
    def _pulls(self) -> PullMessageService:
        if self._pull_service is None:
            raise ClientError("the consumer is not started: no pull service yet")
        return self._pull_service

    @property
    def broadcasting(self) -> bool:
        return self.message_model is MessageModel.BROADCASTING

    # --- configuration -----------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        """Consume ``topic``: a tag expression ('A || B', '*') or a MessageSelector
        (``MessageSelector.by_sql("amount > 100")``, evaluated by the broker)."""
        if self._stack is not None:
            raise ClientError("subscribe before entering `async with PushConsumer(...)`")
        if not topic:
            raise ClientError("topic is empty")
        self.subscriptions[topic] = build_subscription(topic, expression)

    def register_listener(self, fn: Listener) -> None:
        self._listener, self.orderly = fn, False

    def register_orderly_listener(self, fn: Listener) -> None:
        self._listener, self.orderly = fn, True

    def assigned_queues(self) -> frozenset[MessageQueue]:
        return self.rebalance.assigned()

    def rebalance_immediately(self) -> None:
        self._rebalance_wakeup.set()

    # --- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        listener = self._listener
        if listener is None:
            raise ClientError("register a listener before starting the consumer")
        if not self.subscriptions:
            raise ClientError("subscribe to at least one topic before starting the consumer")
        if not self.broadcasting:
            retry = RETRY_GROUP_TOPIC_PREFIX + self.group
            self.subscriptions.setdefault(retry, build_subscription(retry, "*"))
        await super().__aenter__()
        try:
            await self._start(listener)
        except BaseException:
            await super().__aexit__(None, None, None)
            raise
        return self

    async def _start(self, listener: Listener) -> None:
        client = self._live = self.client
        assert self._stack is not None
        self._stack.callback(setattr, self, "_live", None)
        self._start_ms = int(time.time() * 1000)
        store: OffsetStore
        if self.broadcasting:
            store = LocalFileOffsetStore(self.offset_store_dir, self.client_id, self.group)
        else:
            store = RemoteBrokerOffsetStore(client, self.group, self.timeout)
        store.load()
        self._offset_store = store
        client.register_consumer(self.group, self)
        self._stack.callback(client.unregister_consumer, self.group)
        tracer = None
        if self.enable_trace:  # entered before the consume nursery: flushed after it stopped
            dispatcher = await open_trace_dispatcher(self, "CONSUME", self.trace_topic)
            tracer = ConsumeTracer(dispatcher, self.group)
        nursery = await self._stack.enter_async_context(trio.open_nursery())
        self._stack.callback(nursery.cancel_scope.cancel)
        # runs first on exit (LIFO): persist/unlock/unregister while the connections are alive
        self._stack.push_async_callback(self._shutdown, nursery)
        service = (
            ConsumeMessageOrderlyService if self.orderly else ConsumeMessageConcurrentlyService
        )
        self._consume_service = service(self, listener, nursery, tracer)
        self._pull_service = PullMessageService(self, self._consume_service, nursery)
        await client.update_routes()
        for sub in self.subscriptions.values():  # before the heartbeat, as Java's start
            await client.check_client_in_broker(self.group, sub, self.timeout)
        await client.send_heartbeat_to_all_brokers()
        await self.rebalance.do_rebalance()
        nursery.start_soon(self._rebalance_loop)
        nursery.start_soon(self._persist_loop)
        if self.orderly and not self.broadcasting:
            nursery.start_soon(self._lock_loop)

    async def _shutdown(self, nursery: trio.Nursery) -> None:
        nursery.cancel_scope.cancel()  # stop pulling and consuming first
        with trio.CancelScope(shield=True), trio.move_on_after(3 * self.timeout):
            mqs = list(self.rebalance.process_queue_table)
            for pq in self.rebalance.process_queue_table.values():
                pq.dropped = True
            await self.offset_store.persist_all(mqs)
            if self.orderly and not self.broadcasting:
                await self.rebalance.unlock_all()
            self.client.unregister_consumer(self.group)
            for addr in self.client.heartbeat_addrs():
                try:
                    await self.client.api.unregister_client(
                        addr, self.client_id, consumer_group=self.group, timeout=self.timeout
                    )
                except Exception as exc:
                    log.info("unregister from %s failed: %s", addr, exc)

    async def _rebalance_loop(self) -> None:
        while True:
            with trio.move_on_after(self.rebalance_interval):
                await self._rebalance_wakeup.wait()
            self._rebalance_wakeup = trio.Event()
            await self.rebalance.do_rebalance()

    async def _persist_loop(self) -> None:
        while True:
            await trio.sleep(self.persist_interval)
            await self.offset_store.persist_all(list(self.rebalance.process_queue_table))

    async def _lock_loop(self) -> None:
        while True:
            await trio.sleep(LOCK_INTERVAL)
            await self.rebalance.lock_all()

    # --- what rebalance and the consume services call ------------------------------------

    def consumer_data(self) -> ConsumerData:
        return ConsumerData(
            groupName=self.group,
            consumeType=ConsumeType.CONSUME_PASSIVELY,
            messageModel=self.message_model,
            consumeFromWhere=self.consume_from,
            subscriptionDataSet=list(self.subscriptions.values()),
        )

    async def compute_pull_from_where(self, mq: MessageQueue) -> int:
        last = await self.offset_store.read_offset(mq, ReadOffsetType.STORE)
        if last >= 0:
            return last
        if last != -1:
            return -1  # the broker could not be asked: try at the next rebalance
        is_retry = mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        try:
            addr = await self.client.any_addr(mq.brokerName, mq.topic)
            api = self.client.api
            if self.consume_from is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
                return 0
            if self.consume_from is not ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
                # LAST_OFFSET, and as in Java its deprecated variants (MIN/MAX_OFFSET, ...)
                if is_retry:
                    return 0
                return await api.get_max_offset(addr, mq, timeout=self.timeout)
            if is_retry:
                return await api.get_max_offset(addr, mq, timeout=self.timeout)
            ts = self.consume_timestamp_ms
            if ts is None:
                ts = self._start_ms - 30 * 60 * 1000
            return await api.search_offset(addr, mq, ts, timeout=self.timeout)
        except Exception as exc:
            log.warning("start offset of %s: %s", mq, exc)
            return -1

    def start_pull(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        self._pulls.start(mq, pq, offset)

    async def send_message_back(self, msg: MessageExt, delay_level: int, mq: MessageQueue) -> bool:
        """CONSUMER_SEND_MSG_BACK to the master of the queue's broker; False when it failed."""
        try:
            addr = await self.client.master_addr(mq.brokerName, mq.topic)
            await self.client.api.consumer_send_msg_back(
                addr,
                msg,
                self.group,
                delay_level,
                self.max_reconsume_times,
                timeout=self.timeout,
            )
        except Exception as exc:
            log.warning("send back of %s failed: %s", msg.msg_id, exc)
            return False
        return True

    # --- broker requests ----------------------------------------------------------------------

    def running_info_json(self) -> bytes:
        """ConsumerRunningInfo (MQClientInstance.consumerRunningInfo): properties,
        subscriptionSet, mqTable (ProcessQueueInfo per owned queue) and statusTable; jstack
        is Java's thread dump and left out."""
        props = {
            "PROP_NAMESERVER_ADDR": "".join(a + ";" for a in self.client.namesrv_addrs),
            "PROP_CONSUME_TYPE": "CONSUME_PASSIVELY",
            "PROP_CONSUMEORDERLY": str(self.orderly).lower(),
            "PROP_THREADPOOL_CORE_SIZE": str(self.consume_concurrency),
            "PROP_CONSUMER_START_TIMESTAMP": str(self._start_ms),
            "PROP_CLIENT_VERSION": "V4_9_7",
            "consumerGroup": self.group,
            "messageModel": self.message_model.name,
            "consumeFromWhere": self.consume_from.name,
            "pullBatchSize": str(self.pull_batch_size),
            "consumeMessageBatchMaxSize": str(self.consume_batch_max_size),
            "maxReconsumeTimes": str(self.max_reconsume_times),
        }
        offsets = self.offset_store.table() if self._offset_store is not None else {}
        mq_table = []
        for mq, pq in sorted(
            self.rebalance.process_queue_table.items(),
            key=lambda kv: (kv[0].topic, kv[0].brokerName, kv[0].queueId),
        ):
            held = list(pq.msgs) + list(pq.consuming)
            mq_table.append(
                (
                    mq,
                    {
                        "commitOffset": offsets.get(mq, -1),
                        "cachedMsgMinOffset": min(held) if held else 0,
                        "cachedMsgMaxOffset": max(held) if held else 0,
                        "cachedMsgCount": pq.msg_count,
                        "cachedMsgSizeInMiB": pq.msg_size // (1024 * 1024),
                        "transactionMsgMinOffset": 0,
                        "transactionMsgMaxOffset": 0,
                        "transactionMsgCount": 0,
                        "locked": pq.locked,
                        "tryUnlockTimes": 0,
                        "lastLockTimestamp": 0,
                        "droped": pq.dropped,
                        "lastPullTimestamp": 0,
                        "lastConsumeTimestamp": 0,
                    },
                )
            )
        status = {
            topic: {
                "pullRT": 0.0,
                "pullTPS": 0.0,
                "consumeRT": 0.0,
                "consumeOKTPS": 0.0,
                "consumeFailedTPS": 0.0,
                "consumeFailedMsgs": self.stats_failed,
            }
            for topic in sorted(self.subscriptions)
        }
        subs = [serde.converter.unstructure(s) for s in self.subscriptions.values()]
        return b"".join(
            (
                b'{"mqTable":',
                encode_mq_map(mq_table),
                b',"properties":',
                serde.dumps(props),
                b',"statusTable":',
                serde.dumps(status),
                b',"subscriptionSet":',
                serde.dumps(subs),
                b"}",
            )
        )

    def offset_table_of(self, topic: str) -> dict[MessageQueue, int]:
        """GET_CONSUMER_STATUS_FROM_CLIENT: the in-memory offsets of `topic`'s queues."""
        if self._offset_store is None:
            return {}
        return {mq: off for mq, off in self._offset_store.table().items() if mq.topic == topic}

    async def reset_offset_table(self, topic: str, table: Mapping[MessageQueue, int]) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET (MQClientInstance.resetOffset): every owned queue of
        `topic` in `table` drops what it pulled and not yet consumed (results of listener
        calls still running are not committed) and pulls on from its new offset, which is
        also committed to the broker. Queues this member does not own are left to their
        owners (the broker told them too)."""
        if self._offset_store is None or self._pull_service is None:
            return
        rb = self.rebalance
        moved = []
        for mq, old in list(rb.process_queue_table.items()):
            offset = table.get(mq)
            if mq.topic != topic or offset is None or offset < 0:
                continue
            # swap in a fresh queue at once (no await in between), so nothing pulled for
            # the old position is handed to the listener after this point
            old.dropped = True
            pq = ProcessQueue(locked=old.locked, last_lock_time=old.last_lock_time)
            rb.process_queue_table[mq] = pq
            self._offset_store.update_offset(mq, offset)
            self._pull_service.start(mq, pq, offset)
            moved.append(mq)
            log.info("group %s: %s reset to offset %d", self.group, mq, offset)
        for mq in moved:
            await self._offset_store.persist(mq)

    async def consume_message_directly(self, cmd: RemotingCommand) -> RemotingCommand:
        """CONSUME_MESSAGE_DIRECTLY: run the listener on the record in the body."""
        listener = self._listener
        if listener is None:  # not registered with a broker before `async with` checked it
            return cmd.response(ResponseCode.SYSTEM_ERROR, "no listener registered")
        try:
            msg = decode_record(cmd.body_bytes())
        except ValueError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad message body: {exc}")
        started = time.monotonic()
        remark = None
        try:
            status = await listener([msg])
        except Exception as exc:
            status, remark = None, repr(exc)
            result = "CR_THROW_EXCEPTION"
        else:
            ok = status is None or status in (ConsumeStatus.SUCCESS, OrderlyStatus.SUCCESS)
            result = "CR_SUCCESS" if ok else "CR_LATER"
        body = {
            "order": self.orderly,
            "autoCommit": True,
            "consumeResult": result,
            "remark": remark,
            "spentTimeMills": int((time.monotonic() - started) * 1000),
        }
        return cmd.response(body=serde.dumps(body))
