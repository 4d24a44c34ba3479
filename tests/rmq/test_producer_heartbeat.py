"""A Producer announces its group to the brokers it sends to (HEART_BEAT ProducerData every
heartbeat_interval, 30 s by default, as Java's MQClientInstance) and unregisters it when closed."""

from pathlib import Path

import trio

from broker.config import BrokerConfig
from broker.service import run_broker
from broker.store.config import MessageStoreConfig
from broker.store.memory_store import run_memory_store
from namesrv.config import NamesrvConfig
from namesrv.service import run_namesrv
from rmq import Message, Producer


async def _until(predicate) -> None:
    # the broker's table has no event to wait on: poll it
    for _ in range(1000):
        if predicate():
            return
        await trio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_producer_group_is_registered_while_open_and_gone_after(tmp_path: Path):
    async with trio.open_nursery() as nursery:
        ns = await nursery.start(
            run_namesrv, NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kv.json"))
        )
        ns_addr = f"127.0.0.1:{ns.port}"
        config = BrokerConfig(
            listen_port=0,
            namesrv_addr=ns_addr,
            store=MessageStoreConfig(store_path_root_dir=tmp_path / "store"),
        )
        broker = await nursery.start(
            lambda task_status: run_broker(
                config, store_factory=run_memory_store, task_status=task_status
            )
        )
        producers = broker.controller.producer_manager
        with trio.fail_after(20):
            async with Producer("pg-heartbeat", ns_addr, heartbeat_interval=0.2) as producer:
                while True:  # the broker registers with the nameserver right after start
                    try:
                        await producer.send(Message("HbTopic", b"x"))
                        break
                    except Exception:
                        await trio.sleep(0.05)
                await _until(lambda: "pg-heartbeat" in producers.groups)
                (client,) = producers.groups["pg-heartbeat"].values()
                assert client.client_id == producer.client_id
            await _until(lambda: "pg-heartbeat" not in producers.groups)
        nursery.cancel_scope.cancel()
