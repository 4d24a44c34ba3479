"""A Producer announces its group to the brokers it sends to (HEART_BEAT ProducerData every
heartbeat_interval, 30 s by default, as Java's MQClientInstance) and unregisters it when closed;
against the real servers in process (memory_cluster)."""

from collections.abc import Callable

import trio

from rmq import Message, Producer


async def _until(predicate: Callable[[], object]) -> None:
    # the broker's table has no event to wait on: poll it
    with trio.fail_after(20):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.02)


async def test_producer_group_is_registered_while_open_and_gone_after(
    memory_cluster, autojump_clock
):
    producers = memory_cluster.broker().controller.producer_manager
    net = memory_cluster.network
    async with Producer(
        "pg-heartbeat", memory_cluster.namesrv, network=net, heartbeat_interval=0.2
    ) as producer:
        await producer.send(Message("HbTopic", b"x"))
        await _until(lambda: "pg-heartbeat" in producers.groups)
        (client,) = producers.groups["pg-heartbeat"].values()
        assert client.client_id == producer.client_id
    await _until(lambda: "pg-heartbeat" not in producers.groups)
