"""The mqadmin-style `rmq` commands through typer's CliRunner against real in-process servers.

A nameserver and a broker (memory store) run in a background thread's own Trio loop for the
whole module (CliRunner's commands call `trio.run` themselves, on the test's thread). Each
test works on its own topic and group, parses `--json` output and checks it against what it
produced; error paths must print one `error:` line on stderr and exit 1.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.lowlevel
from typer.testing import CliRunner, Result

from cli.main import app

pytestmark = pytest.mark.integration

runner = CliRunner()


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(nameserver addr, broker addr) of servers running in a background thread."""
    from broker.config import BrokerConfig
    from broker.service import run_broker
    from broker.store import MessageStoreConfig, run_memory_store
    from namesrv.config import NamesrvConfig
    from namesrv.service import run_namesrv
    from rmq import Admin

    tmp = tmp_path_factory.mktemp("cli-admin")
    started: queue.Queue = queue.Queue()
    # the servers' nursery scope and Trio token, to stop them from this thread
    stop: list[tuple[trio.CancelScope, trio.lowlevel.TrioToken]] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            stop.append((nursery.cancel_scope, trio.lowlevel.current_trio_token()))
            n = await nursery.start(
                run_namesrv, NamesrvConfig(listen_port=0, kv_config_path=str(tmp / "kv.json"))
            )
            ns_addr = f"127.0.0.1:{n.port}"
            config = BrokerConfig(
                listen_port=0,
                namesrv_addr=ns_addr,
                store=MessageStoreConfig(store_path_root_dir=tmp / "store"),
            )
            b = await nursery.start(
                lambda task_status: run_broker(
                    config, store_factory=run_memory_store, task_status=task_status
                )
            )
            async with Admin(ns_addr) as admin:
                with trio.fail_after(10):
                    while True:
                        if "broker-a" in (await admin.cluster_info()).brokerAddrTable:
                            break
                        await trio.sleep(0.02)
            started.put((ns_addr, b.addr))

    def thread_main() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # reported to the fixture below
            started.put(exc)

    t = threading.Thread(target=thread_main, daemon=True)
    t.start()
    got = started.get(timeout=30)
    if isinstance(got, BaseException):
        raise got
    yield got
    scope, token = stop[0]
    trio.from_thread.run_sync(scope.cancel, trio_token=token)
    t.join(timeout=10)


def rmq(ns: tuple[str, str], *args: str, input: str | None = None) -> Result:
    return runner.invoke(app, ["-n", ns[0], *args], input=input)


def ok_json(ns: tuple[str, str], *args: str, input: str | None = None) -> Any:
    result = rmq(ns, *args, "--json", input=input)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def one_error_line(result: Result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def test_cluster_list_and_plain_cluster(ns):
    doc = ok_json(ns, "cluster", "list")
    plain = ok_json(ns, "cluster")
    assert [b["addr"] for b in doc["brokers"]] == [ns[1]] == [b["addr"] for b in plain["brokers"]]
    assert doc["brokers"][0]["broker_name"] == "broker-a"
    text = rmq(ns, "cluster", "list")
    assert text.exit_code == 0 and ns[1] in text.stdout and "broker-a" in text.stdout


def test_broker_status(ns):
    doc = ok_json(ns, "broker", "status", ns[1])
    assert doc["addr"] == ns[1]
    assert doc["runtime"]["brokerVersionDesc"] and "msgPutTotalTodayNow" in doc["runtime"]
    text = rmq(ns, "broker", "status", ns[1])
    assert text.exit_code == 0 and "commitLogMaxOffset" in text.stdout
    one_error_line(rmq(ns, "broker", "status", "127.0.0.1:1"), "cannot connect")


def test_topic_lifecycle_create_update_status_delete(ns):
    created = ok_json(ns, "topic", "create", "CliLife", "--queues", "2")
    assert created == {"topic": "CliLife", "action": "created", "brokers": [ns[1]]}
    assert "CliLife" in _wait_topic(ns, "CliLife")["topics"]
    route = ok_json(ns, "topic", "route", "CliLife")
    assert route["queues"] == [
        {"broker": "broker-a", "read": 2, "write": 2, "perm": 6, "perm_text": "RW-"}
    ]
    assert route["brokers"] == [
        {"broker": "broker-a", "cluster": "DefaultCluster", "id": 0, "addr": ns[1]}
    ]
    assert ok_json(ns, "topic", "update", "CliLife", "--queues", "3")["brokers"] == [ns[1]]
    status = ok_json(ns, "topic", "status", "CliLife")
    assert [q["queue"] for q in status["queues"]] == [0, 1, 2]
    assert status["total"]["messages"] == 0 and status["queues"][0]["last_update"] is None
    sent = ok_json(ns, "produce", "-t", "CliLife", "a", "b", "c", "d")
    status = ok_json(ns, "topic", "status", "CliLife")
    assert status["total"]["messages"] == 4 == sent["sent"]
    per_queue = {q["queue"]: q["max_offset"] for q in status["queues"]}
    for r in sent["results"]:
        assert r["queue_offset"] < per_queue[r["queue"]]
    assert all(q["last_update"] for q in status["queues"] if q["messages"])
    text = rmq(ns, "topic", "status", "CliLife")
    assert text.exit_code == 0 and "total" in text.stdout
    deleted = ok_json(ns, "topic", "delete", "CliLife", "--yes")
    assert deleted["action"] == "deleted" and deleted["brokers"] == [ns[1]]
    assert "CliLife" not in ok_json(ns, "topic", "list")["topics"]
    one_error_line(rmq(ns, "topic", "route", "CliLife"), "topic does not exist")


def _wait_topic(ns: tuple[str, str], topic: str) -> dict:
    import time

    deadline = time.monotonic() + 10
    while True:
        doc = ok_json(ns, "topic", "list")
        if topic in doc["topics"] or time.monotonic() > deadline:
            return doc
        time.sleep(0.05)


@pytest.mark.parametrize(
    "args",
    [
        ["topic", "status", "NoSuchTopic"],
        ["topic", "update", "NoSuchTopic", "--queues", "2"],
        ["topic", "delete", "NoSuchTopic"],
        ["message", "query", "--topic", "NoSuchTopic", "--key", "k"],
        ["group", "progress", "g", "--topic", "NoSuchTopic"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_unknown_topic_is_one_line(ns, args):
    one_error_line(rmq(ns, *args), "NoSuchTopic")


def test_produce_then_consume_then_group_progress(ns):
    sent = ok_json(
        ns,
        "produce",
        "-t",
        "CliFlow",
        "--tags",
        "TagA",
        "--keys",
        "k-1",
        "-P",
        "color=red",
        "one",
        "two",
        "three",
    )
    assert sent["sent"] == 3 and all(r["status"] == "SEND_OK" for r in sent["results"])
    got = ok_json(ns, "consume", "-t", "CliFlow", "-g", "cg-flow", "--from-beginning")
    assert got["count"] == 3
    assert sorted(m["body"] for m in got["messages"]) == ["one", "three", "two"]
    assert {m["msg_id"] for m in got["messages"]} == {r["msg_id"] for r in sent["results"]}
    m = got["messages"][0]
    assert (m["tags"], m["keys"], m["properties"]["color"]) == ("TagA", "k-1", "red")
    # nothing new: the default (no --follow) returns at once with nothing
    again = ok_json(ns, "consume", "-t", "CliFlow", "-g", "cg-flow")
    assert again["count"] == 0
    progress = ok_json(ns, "group", "progress", "cg-flow", "--topic", "CliFlow")
    assert progress["group"] == "cg-flow"
    assert progress["total"]["lag"] == 0
    assert progress["total"]["broker_offset"] == 3 == progress["total"]["consumer_offset"]
    ok_json(ns, "produce", "-t", "CliFlow", "four")
    progress = ok_json(ns, "group", "progress", "cg-flow")
    assert progress["total"]["lag"] == 1
    lagging = [q for q in progress["queues"] if q["lag"]]
    assert len(lagging) == 1 and lagging[0]["broker_offset"] - lagging[0]["consumer_offset"] == 1
    text = rmq(ns, "group", "progress", "cg-flow")
    assert text.exit_code == 0 and "total lag 1" in text.stdout
    groups = ok_json(ns, "group", "list")["groups"]
    assert "cg-flow" in groups and "TOOLS_CONSUMER" not in groups
    assert "TOOLS_CONSUMER" in ok_json(ns, "group", "list", "--all")["groups"]
    one_error_line(rmq(ns, "group", "progress", "no-such-group"), "no-such-group")


def test_consume_follow_waits_for_new_messages_until_idle(ns):
    ok_json(ns, "produce", "-t", "CliFollow", "x")
    # --follow long-polls; --idle-timeout ends it (Ctrl-C in a terminal)
    import time

    t0 = time.monotonic()
    got = ok_json(
        ns, "consume", "-t", "CliFollow", "-g", "cg-follow", "-f", "--idle-timeout", "0.8"
    )
    assert time.monotonic() - t0 >= 0.8  # it kept waiting
    # a new group starts at the queue's end, though the broker answers offset 0
    assert got["messages"] == []
    text = rmq(
        ns, "consume", "-t", "CliFollow", "-g", "cg-f2", "--from-beginning", "-f", "--count", "1"
    )
    assert text.exit_code == 0 and text.stdout == "x\n"


def test_produce_large_stdin_shows_progress_and_a_summary(ns):
    lines = "".join(f"line-{i}\n" for i in range(1200))
    result = rmq(ns, "produce", "-t", "CliBulk", input=lines)
    assert result.exit_code == 0, result.output
    out = result.stdout.splitlines()
    assert len(out) == 1 and out[0].startswith("sent 1200 message(s) to CliBulk")
    assert "1200/1200" in result.stderr  # the progress bar
    small = rmq(ns, "produce", "-t", "CliBulk", input="a\nb\n")
    assert small.exit_code == 0
    assert [line.split()[0] for line in small.stdout.splitlines()] == ["SEND_OK", "SEND_OK", "sent"]
    assert ok_json(ns, "topic", "status", "CliBulk")["total"]["messages"] == 1202


def test_message_query_by_key_id_uniq_key_and_offset(ns):
    sent = ok_json(
        ns,
        "produce",
        "-t",
        "CliFind",
        "--keys",
        "order-7",
        "--tags",
        "T7",
        "-P",
        "who=me",
        "payload",
    )["results"][0]
    ok_json(ns, "produce", "-t", "CliFind", "--keys", "order-8", "other")
    by_key = ok_json(ns, "message", "query", "-t", "CliFind", "--key", "order-7")
    assert by_key["count"] == 1
    m = by_key["messages"][0]
    assert (m["body"], m["tags"], m["keys"], m["msg_id"]) == (
        "payload",
        "T7",
        "order-7",
        sent["msg_id"],
    )
    assert m["properties"]["who"] == "me" and m["store_timestamp_ms"] > 0
    by_id = ok_json(ns, "message", "query", "--id", sent["offset_msg_id"])["messages"][0]
    by_uniq = ok_json(ns, "message", "query", "-t", "CliFind", "--id", sent["msg_id"])["messages"][
        0
    ]
    by_offset = ok_json(
        ns,
        "message",
        "query",
        "-t",
        "CliFind",
        "--queue",
        str(sent["queue"]),
        "--offset",
        str(sent["queue_offset"]),
    )["messages"][0]
    for doc in (by_id, by_uniq, by_offset):
        assert doc == m
    text = rmq(ns, "message", "query", "-t", "CliFind", "--key", "order-7")
    assert text.exit_code == 0
    assert "body (7 bytes):" in text.stdout and "payload" in text.stdout and "who=me" in text.stdout
    one_error_line(rmq(ns, "message", "query", "--id", "zz-not-hex"), "malformed msgId")
    one_error_line(rmq(ns, "message", "query", "--id", sent["msg_id"]), "give its topic")
    one_error_line(rmq(ns, "message", "query", "-t", "CliFind", "--key", "nope"), "nope")
    one_error_line(
        rmq(ns, "message", "query", "-t", "CliFind", "--queue", "0", "--offset", "999"),
        "offset 999",
    )


@pytest.mark.parametrize(
    "args",
    [
        ["message", "query"],
        ["message", "query", "--key", "k"],
        ["message", "query", "-t", "T", "--key", "k", "--id", "x"],
        ["message", "query", "-t", "T", "--queue", "0"],
        ["topic", "create", "T", "--perm", "5"],
    ],
    ids=" ".join,
)
def test_bad_option_combinations_are_usage_errors(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
