"""A PushConsumer subscribed to a topic that does not exist yet says so once, clearly."""

from __future__ import annotations

import logging

import pytest
import trio

from common.message import MessageExt
from common.model import MessageQueue
from rmq import Admin, PushConsumer


async def ignore(msgs: list[MessageExt]) -> None:
    """A listener for consumers that never get a message (or whose messages do not matter)."""


def warnings_about(caplog: pytest.LogCaptureFixture, topic: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "rmq.rebalance" and r.levelno >= logging.WARNING and topic in r.getMessage()
    ]


async def test_missing_topic_is_one_clear_warning_then_debug(
    memory_cluster, caplog, autojump_clock
):
    caplog.set_level(logging.DEBUG, logger="rmq.rebalance")
    cluster = memory_cluster
    c = PushConsumer("g", cluster.namesrv, network=cluster.network, rebalance_interval=1.0)
    c.subscribe("Later")
    c.register_listener(ignore)
    async with c:
        await trio.sleep(5.5)  # the rebalance at start and five periodic ones
        warned = warnings_about(caplog, "Later")
        assert len(warned) == 1, [r.getMessage() for r in warned]
        text = warned[0].getMessage()
        assert "topic Later does not exist on any broker (route not found)" in text
        assert "pick it up when it is created" in text
        assert "CODE: 17" not in caplog.text
        # the group's retry topic is the brokers' to create: not a warning
        assert not warnings_about(caplog, "%RETRY%g")
        repeats = [
            r
            for r in caplog.records
            if r.levelno == logging.DEBUG and "Later still has no route" in r.getMessage()
        ]
        assert len(repeats) >= 4

        # created: picked up at the next rebalance, no further warning
        await cluster.create_topic("Later", 2)
        await trio.sleep(1.5)
        assert {mq for mq in c.assigned_queues() if mq.topic == "Later"} == {
            MessageQueue("Later", "broker-a", i) for i in range(2)
        }
        assert len(warnings_about(caplog, "Later")) == 1
        assert "rebalance of Later" not in caplog.text  # no "no consumer for this group"

        # gone again: a change, so it is said once more
        async with Admin(cluster.namesrv, network=cluster.network) as admin:
            await admin.delete_topic("Later")
        c.client.invalidate("Later")
        await trio.sleep(3.5)
        assert len(warnings_about(caplog, "Later")) == 2
