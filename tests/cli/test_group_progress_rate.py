"""`rmq group progress` shows the group's consume TPS rounded, as `rmq top` does its rates."""

from __future__ import annotations

import json

from cli.admin import render as admin_render
from common.model import MessageQueue
from rmq.admin_api import ConsumeStats, QueueConsumeStats


def _stats() -> ConsumeStats:
    q = QueueConsumeStats(MessageQueue("Orders", "broker-a", 0), 100, 90, 1_700_000_000_000)
    return ConsumeStats("billing", (q,), consume_tps=32 / 15)  # 2.1333...


def test_text_rounds_the_rate(capsys):
    admin_render.group_progress(_stats(), [])
    out = capsys.readouterr().out
    assert "consume TPS 2.1," in out and "2.13" not in out, out


def test_json_rounds_the_rate(capsys):
    admin_render.group_progress(_stats(), [], as_json=True)
    assert json.loads(capsys.readouterr().out)["consume_tps"] == 2.13
