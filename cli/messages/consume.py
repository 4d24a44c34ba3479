"""The pull loop behind `rmq consume`: every queue of a topic, long-polled concurrently.

Theory of operation: one task per queue pulls with a 15 s long poll from the queue's start
offset: the oldest message with --from-beginning, otherwise the group's committed offset,
or the queue's end when the group has none. Messages are handed
to `on_message` in queue order. The run ends after `count` messages, after `idle_timeout`
seconds without a message, on SIGINT/SIGTERM, or never. On the way out the group's offsets
(the next offset after the last message handed over, per queue) are committed under a
shielded, bounded scope, so the next run of the same group continues where this one stopped.

"The group has none" needs care. QUERY_CONSUMER_OFFSET is RocketMQ's answer for a push
consumer: for a group that never committed on a queue it says 0 (not "not found") while the
queue still starts at offset 0, so a new Java consumer set to CONSUME_FROM_LAST_OFFSET reads
the whole queue. `rmq consume` promises the queue's end for a new group, so an answer of 0 is
checked against the broker's offset table (GET_ALL_CONSUMER_OFFSET, one request per broker,
only when some queue answered 0): a queue the group has no entry for starts at its max
offset. A broker that refuses that request (an ACL, say) leaves RocketMQ's answer in place.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from cli.app import credentials_from_env
from cli.client_network import network_from_env
from common import serde
from common.errors import RmqError
from common.message import MessageExt
from common.model import MessageQueue
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from rmq.errors import ClientError

if TYPE_CHECKING:
    from rmq.pull_consumer import PullConsumer
    from rmq.remoting import Remoting

LONG_POLL = 15.0
EMPTY_PAUSE = 0.1  # pause after an empty answer, in case the broker does not hold pulls
COMMIT_TIMEOUT = 3.0


async def consume_topic(
    namesrv: str,
    topic: str,
    *,
    group: str,
    on_message: Callable[[MessageExt], None],
    from_beginning: bool = False,
    count: int | None = None,
    tags: str = "*",
    sql: str | None = None,
    idle_timeout: float | None = None,
    long_poll: float = LONG_POLL,
    handle_signals: bool = True,
    follow: bool = True,
    remoting: Remoting | None = None,
    served_by: Callable[[str, int], None] | None = None,
    on_new_group: Callable[[int], None] | None = None,
    on_signal: Callable[[int], None] | None = None,
) -> int:
    """Consume until done; returns how many messages were handed to `on_message`.

    `served_by`, if given, is told the address and brokerId (0 the master, else a slave: in
    DLedger mode a follower; -1 not in the route) of the node that answered each pull right
    before that pull's messages go to `on_message` (no checkpoint in between, so it names
    the right node even with one task per queue).

    `on_new_group(n)`, if given, is told once, before the first pull, that the group has no
    offset on any queue of the topic and so starts at the end, skipping the `n` messages
    stored (only without `from_beginning`, and only when `n` is not 0).

    `on_signal(signum)`, if given, is told the signal (SIGINT, SIGTERM) that ended the run,
    once the offsets are committed; the run itself returns normally.

    `sql` selects by a SQL92 expression over the messages' properties instead of `tags`; a
    broker of the topic is asked first whether it takes it (ClientError with its reason)."""
    from rmq import MessageSelector, PullConsumer, PullStatus

    selector = MessageSelector.by_sql(sql) if sql is not None else None
    if selector is not None and tags.strip() not in ("", "*"):
        raise ClientError("--sql and --tags select in different ways: give one of them")

    handed = 0
    # after the block, not in it: leaving a client can swallow an exception (its nursery's own
    # cancellation), and then this still says how many were handed over
    creds = credentials_from_env() if remoting is None else None
    async with PullConsumer(
        group,
        namesrv,
        remoting=remoting,
        credentials=creds,
        network=network_from_env() if remoting is None else None,
    ) as consumer:
        queues = await consumer.fetch_queues(topic)
        if not queues:
            raise ClientError(f"topic {topic} has no readable queue")
        if selector is not None:
            await consumer.check_selector(topic, selector)
        offsets: dict[MessageQueue, int] = {}
        # what the broker has stored for the group (-1: nothing); we commit where it differs,
        # so after one run the group has a position on every queue, not only on those it read
        stored: dict[MessageQueue, int] = {}
        # broker name -> the queue ids the group has committed there (None: unknown)
        committed: dict[str, set[int] | None] = {}
        for mq in queues:
            stored[mq] = await consumer.query_offset(mq)
            if stored[mq] == 0 and mq.brokerName not in committed:
                committed[mq.brokerName] = await committed_queue_ids(consumer, topic, mq)
            known = committed.get(mq.brokerName)
            if stored[mq] == 0 and known is not None and mq.queueId not in known:
                stored[mq] = -1  # RocketMQ's 0 for a group that never committed here
            if from_beginning:
                offsets[mq] = await consumer.min_offset(mq)
            elif stored[mq] >= 0:
                offsets[mq] = stored[mq]
            else:
                offsets[mq] = await consumer.max_offset(mq)
        if on_new_group is not None and not from_beginning and all(v < 0 for v in stored.values()):
            skipped = 0
            for mq in queues:
                skipped += offsets[mq] - await consumer.min_offset(mq)
            if skipped:
                on_new_group(skipped)
        last_message_at = trio.current_time()
        stopped_by: int | None = None  # the signal that ended the run

        async def pull_loop(mq: MessageQueue, stop: trio.CancelScope) -> None:
            nonlocal handed, last_message_at
            while True:
                suspend = long_poll if follow else 0.0
                result = await consumer.pull(
                    mq, offsets[mq], tags=tags, suspend=suspend, selector=selector
                )
                if served_by is not None and result.messages:
                    served_by(result.broker_addr, result.broker_id)
                for msg in result.messages:
                    if count is not None and handed >= count:
                        return  # another queue's task reached the count first
                    on_message(msg)
                    handed += 1
                    last_message_at = trio.current_time()
                    offsets[mq] = msg.queue_offset + 1
                    if count is not None and handed >= count:
                        stop.cancel()
                        return
                offsets[mq] = result.next_begin_offset
                if result.status is not PullStatus.FOUND:
                    if not follow and offsets[mq] >= result.max_offset:
                        return  # caught up
                    await trio.sleep(EMPTY_PAUSE)

        async def idle_watch(stop: trio.CancelScope) -> None:
            assert idle_timeout is not None
            while True:
                deadline = last_message_at + idle_timeout
                if trio.current_time() >= deadline:
                    stop.cancel()
                    return
                await trio.sleep_until(deadline)

        async def signal_watch(stop: trio.CancelScope) -> None:
            nonlocal stopped_by
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    stopped_by = signum
                    stop.cancel()
                    return

        try:
            async with trio.open_nursery() as nursery:
                stop = nursery.cancel_scope

                async def pull_all() -> None:
                    async with trio.open_nursery() as pulls:
                        for mq in queues:
                            pulls.start_soon(pull_loop, mq, stop)
                    stop.cancel()  # every queue is caught up (follow=False)

                nursery.start_soon(pull_all)
                if idle_timeout is not None:
                    nursery.start_soon(idle_watch, stop)
                if handle_signals:
                    nursery.start_soon(signal_watch, stop)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(COMMIT_TIMEOUT):
                for mq, offset in offsets.items():
                    if offset != stored[mq]:
                        # a commit that fails must not hide why the loop ended
                        with contextlib.suppress(RmqError):
                            await consumer.commit_offset(mq, offset)
        if stopped_by is not None and on_signal is not None:
            on_signal(stopped_by)
    return handed


async def committed_queue_ids(
    consumer: PullConsumer, topic: str, mq: MessageQueue
) -> set[int] | None:
    """Queue ids of `topic` on `mq`'s broker that the consumer's group has an offset for, from
    the broker's whole offset table (GET_ALL_CONSUMER_OFFSET); None when it will not say."""
    client = consumer.client
    addr = await client.any_addr(mq.brokerName, topic)
    request = RemotingCommand.request(RequestCode.GET_ALL_CONSUMER_OFFSET)
    resp = await client.remoting.invoke(addr, request, consumer.timeout)
    if resp.code != ResponseCode.SUCCESS:
        return None
    try:
        doc = serde.loads(resp.body_bytes() or b"{}")
        table = doc.get("offsetTable") or {}
        queues = table.get(f"{topic}@{consumer.group}") or {}
        return {int(q) for q in queues}
    except (AttributeError, TypeError, ValueError):
        return None  # not the shape RocketMQ sends: keep QUERY_CONSUMER_OFFSET's answer
