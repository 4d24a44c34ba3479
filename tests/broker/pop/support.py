"""A broker controller with pop, on an in-memory (or file) store and the Trio clock."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.pop.service import PopMessageService
from broker.schedule import trio_wall_clock_ms
from broker.store import MessageStoreConfig, run_memory_store
from broker.store.api import MessageStore
from common.message import MessageExtBrokerInner
from common.model import SubscriptionGroupConfig, TopicConfig


async def make_pop_broker(
    nursery: trio.Nursery,
    tmp_path: Path,
    *,
    store: MessageStore | None = None,
    queues: int = 2,
    revive: bool = True,
    store_cfg: dict[str, Any] | None = None,
    clock: Callable[[], int] | None = None,
    **cfg: object,
) -> tuple[BrokerController, PopMessageService]:
    config = BrokerConfig(
        listen_port=10911,
        store=MessageStoreConfig(store_path_root_dir=tmp_path, **(store_cfg or {})),
        **cfg,  # type: ignore[arg-type]
    )
    if store is None:
        store = await nursery.start(run_memory_store, config.store)
    clock = clock or trio_wall_clock_ms()
    if hasattr(store, "clock"):
        store.clock = clock
    b = BrokerController(config, store, io_threads=False)
    b.load()
    pop = PopMessageService(b, now_ms=clock)
    b.pop = pop
    store.add_arrival_listener(b.pull_hold.notify_message_arriving)
    store.add_arrival_listener(pop.on_message_arriving)
    if b.topic_config_manager.select_topic_config("T") is None:
        b.topic_config_manager.update_topic_config(
            TopicConfig(topicName="T", readQueueNums=queues, writeQueueNums=queues)
        )
    if revive:
        await nursery.start(pop.run_revive)
    return b, pop


def set_group(b: BrokerController, group: str, **kw: Any) -> None:
    sgc = b.subscription_group_manager.find_subscription_group_config(group)
    if sgc is None:
        sgc = SubscriptionGroupConfig(groupName=group)
    b.subscription_group_manager.update_subscription_group_config(attrs.evolve(sgc, **kw))


async def put(
    b: BrokerController, body: bytes, *, topic: str = "T", queue_id: int = 0, tags: str = ""
) -> None:
    props = {"UNIQ_KEY": body.hex().upper() or "00"}
    if tags:
        props["TAGS"] = tags
    msg = MessageExtBrokerInner(
        topic=topic, queue_id=queue_id, body=body, properties=props, store_host=b.store_host
    )
    r = await b.store.put_message(msg)
    assert r.ok
