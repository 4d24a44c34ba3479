"""The Python client against the real nameserver and broker (in-process, TCP on 127.0.0.1).

Servers: tcp_cluster (run_namesrv and run_broker on port 0, the memory store, registered with
that nameserver). Clients: rmq.Producer / PullConsumer / Admin, rmq.sync and the CLI's pull
loop, each over a real RemotingClient.
"""

from __future__ import annotations

import pytest
import trio

from cli.messages.consume import consume_topic
from common.errors import RemotingConnectError, TopicNotExistError
from common.model import MessageQueue
from rmq import Admin, Message, Producer, PullConsumer, PullStatus, SendStatus, sync

pytestmark = pytest.mark.integration


async def test_send_new_topic_through_tbw102_then_pull_it_back(tcp_cluster):
    async with Producer("pg", tcp_cluster.namesrv) as p:
        first = await p.send(Message("AutoTopic", b"one", tags="TagA", keys="k1"))
        results = [first] + [await p.send(Message("AutoTopic", f"m{i}")) for i in range(5)]
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert {r.message_queue.brokerName for r in results} == {"broker-a"}
    assert len({r.msg_id for r in results}) == 6
    async with PullConsumer("cg", tcp_cluster.namesrv) as c:
        queues = await c.fetch_queues("AutoTopic")
        assert len(queues) == 4  # defaultTopicQueueNums
        got = {}
        for mq in queues:
            r = await c.pull(mq, 0)
            for m in r.messages:
                got[m.uniq_key] = m
    assert set(got) == {r.msg_id for r in results}
    m = got[first.msg_id]
    assert (m.body, m.tags, m.keys, m.topic) == (b"one", "TagA", "k1", "AutoTopic")
    assert m.queue_id == first.message_queue.queueId
    assert m.queue_offset == first.queue_offset
    assert m.msg_id == first.offset_msg_id


async def test_batch_pull_tags_offsets_and_admin(tcp_cluster):
    async with Admin(tcp_cluster.namesrv) as admin:
        assert await admin.create_topic("Batch", queues=2) == [tcp_cluster.addr()]
        with trio.fail_after(10):
            while True:
                try:
                    route = await admin.topic_route("Batch")
                    break
                except TopicNotExistError:
                    await trio.sleep(0.02)
        assert route.queueDatas[0].writeQueueNums == 2
        assert "Batch" in await admin.topic_list()
    mq = MessageQueue("Batch", "broker-a", 1)
    async with Producer("pg", tcp_cluster.namesrv) as p:
        batch = await p.send_batch(
            [Message("Batch", f"b{i}", tags="A" if i % 2 else "B") for i in range(4)], queue=mq
        )
    assert batch.status is SendStatus.SEND_OK and batch.queue_offset == 0
    async with PullConsumer("cg2", tcp_cluster.namesrv) as c:
        r = await c.pull(mq, 0, tags="A")
        assert r.status is PullStatus.FOUND
        assert [m.body for m in r.messages] == [b"b1", b"b3"]
        assert [m.uniq_key for m in r.messages] == batch.msg_id.split(",")[1::2]
        r = await c.pull(mq, 4)
        assert r.status is PullStatus.NO_NEW_MSG and r.next_begin_offset == 4
        assert await c.max_offset(mq) == 4
        # no committed offset: 22 (-> -1), or 0 while the queue still starts at 0
        # (ConsumerManageProcessor.queryConsumerOffset)
        assert await c.query_offset(mq) in (-1, 0)
        await c.commit_offset(mq, 3)
        assert await c.query_offset(mq) == 3
        # a long poll is answered as soon as a message arrives
        async with trio.open_nursery() as n:

            async def late_send():
                await trio.sleep(0.3)
                async with Producer("pg", tcp_cluster.namesrv) as p:
                    await p.send(Message("Batch", b"late"), queue=mq)

            n.start_soon(late_send)
            with trio.fail_after(10):
                r = await c.pull(mq, 4, suspend=8.0)
        assert [m.body for m in r.messages] == [b"late"]


async def test_cli_pull_loop_counts_and_commits(tcp_cluster):
    async with Producer("pg", tcp_cluster.namesrv) as p:
        for i in range(5):
            await p.send(Message("Loop", f"x{i}"))
    seen: list[bytes] = []
    with trio.fail_after(20):
        n = await consume_topic(
            tcp_cluster.namesrv,
            "Loop",
            group="g1",
            from_beginning=True,
            count=3,
            on_message=lambda m: seen.append(m.body),
            handle_signals=False,
        )
    assert n == 3 and len(seen) == 3
    # the same group continues after what it consumed
    with trio.fail_after(20):
        await consume_topic(
            tcp_cluster.namesrv,
            "Loop",
            group="g1",
            count=2,
            on_message=lambda m: seen.append(m.body),
            handle_signals=False,
        )
    assert sorted(seen) == [b"x0", b"x1", b"x2", b"x3", b"x4"]


async def test_sync_clients_from_a_worker_thread(tcp_cluster):
    def work():
        with sync.Producer("pg", tcp_cluster.namesrv) as p:
            result = p.send(Message("SyncTopic", b"s"))
        with sync.PullConsumer("cg", tcp_cluster.namesrv) as c:
            r = c.pull(result.message_queue, result.queue_offset)
        return result, r

    result, r = await trio.to_thread.run_sync(work)
    assert [m.uniq_key for m in r.messages] == [result.msg_id]


async def test_connection_refused_is_one_error_class():
    async with Producer("pg", "127.0.0.1:1") as p:
        with pytest.raises(RemotingConnectError):
            await p.send(Message("T", b"x"))
