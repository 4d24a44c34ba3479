"""Offset reset with the official C++ client (PyPI `rocketmq==0.4.4`) against `rmq up`: a
running C++ push consumer told RESET_CONSUMER_CLIENT_OFFSET (220, in the ResetOffsetBodyForC
form it parses) by `rmq group reset --to-time` consumes again from the reset time, and a
stopped group reset with `--to-earliest` starts there when it comes back."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rmq.sync import Admin
from tests.interop.test_cpp_client import DRIVER, produce

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(300)]

TOPIC, GROUP = "InteropReset", "interop-reset-g"


def rmq(cluster: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "-n", cluster.namesrv_addr, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


class Driver:
    """The C++ consumer in a subprocess; its JSON events read by a thread into a queue."""

    def __init__(self, tmp_path: Path, cluster: Any, *args: str) -> None:
        home = tmp_path / "home"
        home.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), "consume", "--namesrv", cluster.namesrv_addr, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "HOME": str(home)},
        )
        self.events: queue.Queue[dict] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))
        self.events.put({"event": "eof"})

    def recv(self, n: int, limit: float) -> list[dict]:
        """The next `n` deliveries (fails after `limit` seconds or if the driver ends)."""
        out: list[dict] = []
        deadline = time.monotonic() + limit
        while len(out) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"only {len(out)} of {n} deliveries within {limit}s: {out[-3:]}"
            try:
                e = self.events.get(timeout=left)
            except queue.Empty:
                continue
            assert e["event"] != "eof", f"the driver ended early: {self.stderr()}"
            if e["event"] == "recv":
                out.append(e)
        return out

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        if self.proc.poll() is None or self.proc.stderr.closed:
            return ""
        return self.proc.stderr.read()[-3000:]

    def finish(self) -> None:
        try:
            self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()  # our own child, by its Popen handle
                self.proc.wait()
            self.reader.join(timeout=10)
            err = self.stderr()
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
        assert self.proc.returncode == 0, err


def reset(cluster: Any, *args: str, limit: float = 30.0) -> dict:
    """`rmq group reset ... --json`, retried while the group has no committed offsets yet
    (the C++ client commits them every 5 s)."""
    deadline = time.monotonic() + limit
    while True:
        r = rmq(cluster, "group", "reset", GROUP, "--topic", TOPIC, *args, "--json")
        if r.returncode == 0:
            return json.loads(r.stdout)
        assert "no offsets" in r.stderr and time.monotonic() < deadline, r.stderr
        time.sleep(0.5)


def check_running_info(cluster: Any) -> None:
    """GET_CONSUMER_RUNNING_INFO relayed to the C++ consumer: what `rmq group describe` shows."""
    with Admin(cluster.namesrv_addr) as admin:
        (member,) = admin.consumer_connections(GROUP)
        assert member.language == "CPP"
        info = admin.consumer_running_info(GROUP, member.client_id)
    assert info.properties["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
    assert TOPIC in {s.get("topic") for s in info.subscriptions}
    assert {mq.topic for mq, _ in info.mq_table} >= {TOPIC}


def test_running_cpp_consumer_consumes_again_from_the_reset_time(tmp_path, module_cluster):
    produce(tmp_path, module_cluster, TOPIC, 12, prefix="a-")
    time.sleep(1.5)
    produce(tmp_path, module_cluster, TOPIC, 12, prefix="b-")
    later = {f"b-body-{i}" for i in range(12)}

    driver = Driver(
        tmp_path, module_cluster, "--topic", TOPIC, "--group", GROUP, "--expect", "24",
        "--expect-total", "36", "--timeout", "120",
    )  # fmt: skip
    try:
        first = driver.recv(24, 90)
        assert {e["body"] for e in first} == {f"a-body-{i}" for i in range(12)} | later
        check_running_info(module_cluster)
        # the store time of the first b-* message: RocketMQ's search by time answers the unit
        # closest to the time asked (ConsumeQueue.getOffsetInQueueByTime), so a time read off
        # the test's clock between the two sends could land nearer an a-* message when the
        # second producer is slow to start; the stored time itself is exact
        reset_ms = min(e["store_timestamp"] for e in first if e["body"].startswith("b-"))
        doc = reset(module_cluster, "--to-time", str(reset_ms))
        assert not doc["dry_run"] and doc["queues"]
        # each queue moves back to its first b-* message, read from what the client delivered
        first_b: dict[int, int] = {}
        for e in first:
            if e["body"].startswith("b-"):
                key = e["queue_id"]
                first_b[key] = min(first_b.get(key, e["queue_offset"]), e["queue_offset"])
        for q in doc["queues"]:
            if q["queue"] in first_b:
                assert q["new_offset"] == first_b[q["queue"]], doc
        again = driver.recv(12, 90)
        assert {e["body"] for e in again} == later  # from the reset time on, nothing earlier
    finally:
        driver.finish()


def test_stopped_cpp_group_starts_at_the_reset_offsets(tmp_path, module_cluster):
    topic_args = ("--topic", TOPIC, "--group", GROUP + "-2")
    produce(tmp_path, module_cluster, TOPIC, 6, prefix="c-")
    driver = Driver(tmp_path, module_cluster, *topic_args, "--expect", "1", "--expect-total", "1")
    driver.recv(1, 90)
    driver.finish()
    # the group is offline now: the broker changes its stored offsets itself
    r = rmq(module_cluster, "group", "reset", GROUP + "-2", "--topic", TOPIC, "--to-earliest")
    assert r.returncode == 0, r.stderr
    assert "earliest" in r.stdout
    progress = json.loads(rmq(module_cluster, "group", "progress", GROUP + "-2", "--json").stdout)
    assert all(q["consumer_offset"] == 0 for q in progress["queues"]), progress
    stored = sum(q["broker_offset"] for q in progress["queues"])
    driver = Driver(
        tmp_path, module_cluster, *topic_args, "--expect", str(stored), "--timeout", "90"
    )
    try:
        got = driver.recv(stored, 90)
        assert min(e["queue_offset"] for e in got) == 0
        assert len({e["body"] for e in got}) == stored
    finally:
        driver.finish()
