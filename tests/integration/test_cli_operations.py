"""The operations commands (`rmq broker config|perm`, `rmq group create|delete|describe`,
`rmq producer list`, `rmq stats`) through typer's CliRunner against real in-process servers.

The servers come from test_cli_admin's module fixture (a nameserver and a memory-store broker
in a background thread). Members and producers that must be online while a command runs are
raw connections held open by another thread (`online_clients`), which heartbeat as a 4.9 Java
client does, so the broker sees exactly what a Java application would show it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import pytest
import trio

from tests.integration.test_cli_admin import ns, ok_json, one_error_line, rmq

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

__all__ = ["ns"]  # the fixture, used by name


@contextmanager
def online_clients(broker_addr: str, heartbeat: Mapping[str, object]) -> Iterator[None]:
    """One connection to the broker that sent ``heartbeat`` and stays open until the block ends."""
    from common.remoting.client import open_remoting_client
    from common.remoting.codes import RequestCode, ResponseCode
    from common.remoting.command import RemotingCommand

    ready = threading.Event()
    done = threading.Event()
    failed: list[BaseException] = []

    async def main() -> None:
        async with open_remoting_client() as c:
            cmd = RemotingCommand.request(
                RequestCode.HEART_BEAT, None, json.dumps(heartbeat).encode()
            )
            r = await c.invoke(broker_addr, cmd)
            assert r.code == ResponseCode.SUCCESS, r
            ready.set()
            await trio.to_thread.run_sync(done.wait)

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:
            failed.append(exc)
            ready.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(10) and not failed, failed
    try:
        yield
    finally:
        done.set()
        t.join(10)


def test_broker_config_get_and_set(ns):
    addr = ns[1]
    doc = ok_json(ns, "broker", "config", "get", addr)
    assert doc["addr"] == addr and doc["config"]["brokerName"] == "broker-a"
    assert json.loads(doc["version"])["counter"] >= 0
    one = rmq(ns, "broker", "config", "get", addr, "brokerName")
    assert one.exit_code == 0 and one.stdout == "brokerName=broker-a\n"
    one_error_line(rmq(ns, "broker", "config", "get", addr, "noSuchKey"), "noSuchKey")

    done = ok_json(ns, "broker", "config", "set", addr, "shortPollingTimeMills=700")
    assert done == {
        "set": {"shortPollingTimeMills": "700"},
        "brokers": [{"addr": addr, "note": None}],
    }
    assert ok_json(ns, "broker", "config", "get", addr)["config"]["shortPollingTimeMills"] == "700"
    # on every broker of the cluster; a key that waits for a restart is named
    text = rmq(ns, "broker", "config", "set", "-c", "DefaultCluster", "maxMessageSize=4194304")
    assert text.exit_code == 0, text.output
    assert f"updated maxMessageSize=4194304 on {addr}" in text.stdout
    assert "takes effect after a restart: maxMessageSize" in text.stdout

    one_error_line(
        rmq(ns, "broker", "config", "set", addr, "bogusKey=1"),
        "unknown broker config key bogusKey",
    )
    one_error_line(
        rmq(ns, "broker", "config", "set", addr, "longPollingEnable=sometimes"),
        "bad value for longPollingEnable",
    )
    assert rmq(ns, "broker", "config", "set", "longPollingEnable=false").exit_code == 2
    assert rmq(ns, "broker", "config", "set", addr, "novalue").exit_code == 2


def test_broker_perm_wipe_and_add(ns):
    ok_json(ns, "topic", "create", "OpsPerm", "--queues", "2")

    def perm() -> int:
        route = ok_json(ns, "topic", "route", "OpsPerm")
        return route["queues"][0]["perm"]

    assert perm() == 6
    wiped = ok_json(ns, "broker", "perm", "wipe", "broker-a")
    assert wiped["nameservers"][0]["addr"] == ns[0] and wiped["nameservers"][0]["topics"] >= 1
    assert perm() == 4  # read only
    added = ok_json(ns, "broker", "perm", "add", "broker-a")
    assert added["nameservers"][0]["topics"] >= 1
    assert perm() == 6
    one_error_line(rmq(ns, "broker", "perm", "wipe", "no-such-broker"), "no-such-broker")


def test_group_create_describe_delete(ns):
    created = ok_json(ns, "group", "create", "cg-ops", "--retry-max-times", "3")
    assert created == {"group": "cg-ops", "action": "created", "brokers": [ns[1]]}
    doc = ok_json(ns, "group", "describe", "cg-ops")
    assert doc["config"]["retryMaxTimes"] == 3 and doc["online"] is False
    assert doc["members"] == [] and doc["running_info"] is None
    heartbeat = {
        "clientID": "10.0.0.9@ops-1",
        "producerDataSet": [],
        "consumerDataSet": [
            {
                "groupName": "cg-ops",
                "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                "subscriptionDataSet": [
                    {"topic": "OpsT", "subString": "a || b", "tagsSet": ["a", "b"], "subVersion": 1}
                ],
                "unitMode": False,
            }
        ],
    }
    with online_clients(ns[1], heartbeat):
        doc = ok_json(ns, "group", "describe", "cg-ops")
        assert doc["online"] is True and doc["message_model"] == "CLUSTERING"
        assert [m["client_id"] for m in doc["members"]] == ["10.0.0.9@ops-1"]
        assert doc["subscriptions"] == {"OpsT": "a || b"}
        text = rmq(ns, "group", "describe", "cg-ops")
        assert text.exit_code == 0 and "1 member(s) online" in text.stdout
        assert "10.0.0.9@ops-1" in text.stdout
        # running info is relayed by the broker to the client (GET_CONSUMER_RUNNING_INFO);
        # this client answers no broker request: its entry says so, the command goes on
        running = ok_json(ns, "group", "describe", "cg-ops", "--running")
        (entry,) = running["running_info"].values()
        assert "not supported" in entry["error"], entry
    deleted = ok_json(ns, "group", "delete", "cg-ops")
    assert deleted["action"] == "deleted" and deleted["brokers"] == [ns[1]]
    one_error_line(rmq(ns, "group", "describe", "cg-ops"), "cg-ops", "not known")
    assert "cg-ops" not in ok_json(ns, "group", "list")["groups"]


def test_group_create_orderly(ns):
    # RocketMQ 5's consumeMessageOrderly, in the 4.x admin code's SubscriptionGroupConfig body
    assert ok_json(ns, "group", "create", "cg-fifo", "--orderly")["action"] == "created"
    doc = ok_json(ns, "group", "describe", "cg-fifo")
    assert doc["config"]["consumeMessageOrderly"] is True
    text = rmq(ns, "group", "describe", "cg-fifo")
    assert "consumeMessageOrderly=True" in text.stdout
    ok_json(ns, "group", "create", "cg-fifo")
    assert ok_json(ns, "group", "describe", "cg-fifo")["config"]["consumeMessageOrderly"] is False
    ok_json(ns, "group", "delete", "cg-fifo")


def test_producer_list(ns):
    assert ok_json(ns, "producer", "list", "--group", "pg-ops") == {"producers": []}
    heartbeat = {
        "clientID": "10.0.0.7@prod-1",
        "producerDataSet": [{"groupName": "pg-ops"}],
        "consumerDataSet": [],
    }
    with online_clients(ns[1], heartbeat):
        doc = ok_json(ns, "producer", "list", "--group", "pg-ops")
        (p,) = doc["producers"]
        assert (p["group"], p["client_id"], p["language"]) == ("pg-ops", "10.0.0.7@prod-1", "JAVA")
        assert p["client_addr"].startswith("127.0.0.1:") and p["last_heartbeat"].endswith("Z")
        text = rmq(ns, "producer", "list")
        assert text.exit_code == 0 and "10.0.0.7@prod-1" in text.stdout
    # the connection closed: the broker forgets the producer
    assert ok_json(ns, "producer", "list", "--group", "pg-ops") == {"producers": []}


def test_stats_topic_and_groups(ns):
    ok_json(ns, "produce", "-t", "OpsStats", "a", "b", "c", "d")
    doc = ok_json(ns, "stats", "--topic", "OpsStats")
    assert doc["rows"] == [
        {
            "topic": "OpsStats",
            "group": None,
            "accumulation": 0,
            "in_tps": round(4 / 60, 2),
            "out_tps": None,
            "in_msg_24h": 4,
            "out_msg_24h": None,
        }
    ]
    got = ok_json(ns, "consume", "-t", "OpsStats", "-g", "cg-stats", "--from-beginning")
    assert got["count"] == 4
    ok_json(ns, "produce", "-t", "OpsStats", "e")
    (row,) = ok_json(ns, "stats", "--topic", "OpsStats")["rows"]
    assert (row["group"], row["accumulation"]) == ("cg-stats", 1)
    assert (row["in_msg_24h"], row["out_msg_24h"]) == (5, 4)
    every = ok_json(ns, "stats")["rows"]
    assert any(r["topic"] == "OpsStats" for r in every)
    assert not any(r["topic"] == "TBW102" for r in every)
    assert any(r["topic"] == "TBW102" for r in ok_json(ns, "stats", "--all")["rows"])
    text = rmq(ns, "stats", "--topic", "OpsStats")
    assert text.exit_code == 0 and "cg-stats" in text.stdout
    one_error_line(rmq(ns, "stats", "--topic", "NoSuchTopicOps"), "NoSuchTopicOps")
