"""The official RocketMQ C++ client (PyPI `rocketmq==0.4.4`) against `rmq up`, unchanged.

Compatibility is judged by a real client, not by ours. Each scenario runs `cpp_driver.py` in a
subprocess with a scratch HOME and reads its JSON event lines. If the client cannot be
imported or started, the driver exits non-zero and the test fails: it never skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.interop, pytest.mark.slow]

DRIVER = Path(__file__).with_name("cpp_driver.py")


def run_driver(tmp_path: Path, *args: str, timeout: float = 180.0) -> list[dict]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, str(DRIVER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HOME": str(home)},
    )
    assert proc.returncode == 0, (
        f"C++ client driver failed ({proc.returncode}):\n{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}"
    )
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def produce(tmp_path, cluster, topic, count, *, tags="TagA,TagB", prefix=""):
    events = run_driver(
        tmp_path,
        "produce",
        "--namesrv",
        cluster.namesrv_addr,
        "--topic",
        topic,
        "--count",
        str(count),
        "--tags-cycle",
        tags,
        "--prefix",
        prefix,
    )
    sent = [e for e in events if e["event"] == "sent"]
    errors = [e for e in events if e["event"] == "send_error"]
    assert not errors, errors[:5]
    assert len(sent) == count
    assert all(e["status"] == 0 for e in sent), Counter(e["status"] for e in sent)
    return sent


def consume(tmp_path, cluster, topic, group, expect, *, timeout=90.0, extra=()):
    events = run_driver(
        tmp_path,
        "consume",
        "--namesrv",
        cluster.namesrv_addr,
        "--topic",
        topic,
        "--group",
        group,
        "--expect",
        str(expect),
        "--timeout",
        str(timeout),
        *extra,
        timeout=timeout + 60,
    )
    done = [e for e in events if e["event"] == "done"]
    assert done, events[-5:]
    return events, done[0]


def test_produce_then_push_consume_exactly_once(tmp_path, module_cluster):
    n = 1000
    sent = produce(tmp_path, module_cluster, "InteropBasic", n)
    # The server spreads them over the topic's queues, with increasing offsets per queue.
    assert len({e["msg_id"] for e in sent}) == n

    events, done = consume(tmp_path, module_cluster, "InteropBasic", "interop-g1", n)
    assert done["complete"], done
    recv = [e for e in events if e["event"] == "recv"]
    bodies = Counter(e["body"] for e in recv)
    assert set(bodies) == {f"body-{i}" for i in range(n)}
    dupes = {b: c for b, c in bodies.items() if c > 1}
    assert not dupes, f"delivered more than once: {list(dupes.items())[:10]}"
    for e in recv:
        i = e["seq"]
        assert e["body"] == f"body-{i}"
        assert e["tags"] == ("TagA" if i % 2 == 0 else "TagB")
        assert e["keys"] == f"key-{i}"
        assert e["topic"] == "InteropBasic"
    # msg.id seen by the consumer is the UNIQ_KEY the producer generated
    assert {e["id"] for e in recv} == {e["msg_id"] for e in sent}


def test_failed_messages_come_back_through_the_retry_topic(tmp_path, module_cluster):
    n = 40
    produce(tmp_path, module_cluster, "InteropRetry", n, prefix="r-")
    # Every 10th message fails on first delivery; RocketMQ redelivers it through
    # %RETRY%<group> after delay level 3 (10 s).
    events, done = consume(
        tmp_path,
        module_cluster,
        "InteropRetry",
        "interop-retry",
        n,
        # returns as soon as all have come back; the window only matters on a loaded host
        timeout=120,
        extra=("--fail-first-every", "10"),
    )
    assert done["complete"], done
    failed = {e["body"] for e in events if e["event"] == "fail"}
    every_tenth = {f"r-body-{i}" for i in range(0, n, 10)}
    assert failed, "no message failed: the retry path was not exercised"
    assert failed <= every_tenth
    recv = [e for e in events if e["event"] == "recv"]
    # Every tenth message fails whenever it arrives with reconsumeTimes 0, so its successful
    # delivery is proof it travelled %RETRY%<group> -> SCHEDULE_TOPIC_XXXX -> %RETRY%<group>.
    # (librocketmq's C listener stops a batch at the first failure and sends the whole batch
    # back, so some of them never arrive with reconsumeTimes 0 at all.)
    ok_tenth = [e for e in recv if e["body"] in every_tenth]
    assert {e["body"] for e in ok_tenth} == every_tenth
    assert all(e["reconsume_times"] >= 1 for e in ok_tenth)
    # the client restores the original topic on retried messages
    assert all(e["topic"] == "InteropRetry" for e in recv)


def test_offsets_survive_a_consumer_restart(tmp_path, module_cluster):
    topic, group = "InteropOffsets", "interop-offsets"
    produce(tmp_path, module_cluster, topic, 200, prefix="a-")
    _, done = consume(tmp_path, module_cluster, topic, group, 200, timeout=60)
    assert done["complete"], done
    produce(tmp_path, module_cluster, topic, 100, prefix="b-")
    events, done = consume(tmp_path, module_cluster, topic, group, 100, timeout=60)
    assert done["complete"], done
    bodies = [e["body"] for e in events if e["event"] == "recv"]
    assert {b for b in bodies if b.startswith("b-")} == {f"b-body-{i}" for i in range(100)}
    redelivered = [b for b in bodies if b.startswith("a-")]
    assert not redelivered, f"{len(redelivered)} old messages delivered after restart"


def test_send_to_unknown_topic_auto_creates_it(tmp_path, module_cluster):
    topic = "InteropAutoCreated"
    produce(tmp_path, module_cluster, topic, 10, prefix="auto-")
    events, done = consume(tmp_path, module_cluster, topic, "interop-auto", 10, timeout=60)
    assert done["complete"], done
    got = {e["body"] for e in events if e["event"] == "recv"}
    assert got == {f"auto-body-{i}" for i in range(10)}


def test_a_tag_expression_selects_on_the_broker(tmp_path, module_cluster):
    # the C++ client's TAG subscriptions beside SQL92 support (broker/filter): unchanged
    produce(tmp_path, module_cluster, "InteropTags", 20, tags="TagA,TagB,TagC")
    events, done = consume(
        tmp_path, module_cluster, "InteropTags", "interop-tags", 13,
        extra=("--expression", "TagA || TagC"),
    )  # fmt: skip
    assert done["complete"], done
    recv = [e for e in events if e["event"] == "recv"]
    assert len(recv) == 13 and {e["tags"] for e in recv} == {"TagA", "TagC"}
