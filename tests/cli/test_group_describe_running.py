"""`rmq group describe --running`: what a member's ConsumerRunningInfo (or its failure) looks
like in the JSON document and the text output."""

from __future__ import annotations

import json

from cli.admin import render_ops
from common.model import MessageQueue
from rmq.admin_api import ConsumerConnection, ConsumerRunningInfo

INFO = ConsumerRunningInfo(
    properties={"PROP_CLIENT_VERSION": "V4_9_7", "PROP_CONSUME_TYPE": "CONSUME_PASSIVELY"},
    subscriptions=[{"topic": "T", "subString": "a || b"}],
    mq_table=[
        (
            MessageQueue("T", "broker-a", 1),
            {"commitOffset": 9, "cachedMsgCount": 2, "locked": False},
        ),
        (
            MessageQueue("T", "broker-a", 0),
            {"commitOffset": 5, "cachedMsgCount": 0, "locked": False},
        ),
    ],
    status_table={"T": {"consumeOKTPS": 1.5}},
)
CONN = ConsumerConnection("c@1", "10.0.0.1:5000", "JAVA", 407, {"T": "a || b"})


def test_running_info_doc():
    doc = render_ops.running_info_doc(INFO)
    assert doc["subscriptions"] == {"T": "a || b"}
    assert [(q["queue"], q["commitOffset"]) for q in doc["queues"]] == [(0, 5), (1, 9)]
    assert doc["status"] == {"T": {"consumeOKTPS": 1.5}}
    json.dumps(doc)  # the --json document is plain JSON


def test_describe_prints_each_members_queues_or_its_error(capsys):
    running = {"c@1": render_ops.running_info_doc(INFO), "c@2": {"error": "code 207: Timeout"}}
    render_ops.group_describe("g", None, [CONN], running)
    out = capsys.readouterr().out
    assert "running info of c@1: V4_9_7, CONSUME_PASSIVELY" in out
    assert "queues held by c@1" in out and "commit offset" in out
    assert "running info of c@2: code 207: Timeout" in out
