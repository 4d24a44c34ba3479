"""4.x and 5.x clients share a topic: the official C++ client (remoting, `rocketmq==0.4.4`) and
the official RocketMQ 5 Python client (gRPC) against one `rmq up`.

The C++ client sends, the 5.x client receives, and the reverse; a C++ push consumer group and a
5.x group read the same topic side by side, each getting everything once. The message id each
side sees is the same: the 4.x UNIQ_KEY is the 5.x message_id.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.interop.py5_harness import Py5, acked_bodies, grpc_endpoint

if TYPE_CHECKING:
    from tests.conftest import ClusterRunner, LocalCluster

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(300)]

CPP_DRIVER = Path(__file__).with_name("cpp_driver.py")


@pytest.fixture(scope="module")
def cluster(
    cluster_runner: ClusterRunner, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    with cluster_runner(tmp_path_factory.mktemp("py5x") / "rmq") as c:
        yield c


@pytest.fixture(scope="module")
def py5(py5_python: Path, cluster: LocalCluster) -> Py5:
    return Py5(py5_python, grpc_endpoint(cluster.data_dir), cluster.namesrv_addr)


def cpp(tmp_path: Path, *args: str, timeout: float = 180.0) -> list[dict[str, Any]]:
    home = tmp_path / f"cpp-home-{args[0]}"
    home.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, str(CPP_DRIVER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HOME": str(home)},
    )
    assert proc.returncode == 0, f"C++ driver failed:\n{proc.stderr[-4000:]}"
    return [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]


def test_cpp_sends_and_the_5x_client_receives(tmp_path: Path, py5: Py5) -> None:
    topic, group, n = "CrossCppTo5", "py5-cross-in", 50
    py5.topic(topic)
    py5.group(group)
    events = cpp(
        tmp_path, "produce", "--namesrv", py5.namesrv, "--topic", topic, "--count", str(n),
        "--tags-cycle", "TagA,TagB",
    )  # fmt: skip
    sent = {e["i"]: e for e in events if e["event"] == "sent"}
    assert len(sent) == n and all(e["status"] == 0 for e in sent.values())
    ev, done = py5.simple(tmp_path, topic, group, n, "--linger", "3")
    assert done["complete"], done
    acked = acked_bodies(ev)
    assert set(acked) == {f"body-{i}" for i in range(n)}
    assert max(acked.values()) == 1
    for e in ev:
        if e["event"] != "recv":
            continue
        i = e["seq"]
        assert e["body"] == f"body-{i}" and not e.get("late")
        assert e["msg_id"] == sent[i]["msg_id"]  # UNIQ_KEY == message_id
        assert e["tag"] == ("TagA" if i % 2 == 0 else "TagB")
        assert e["keys"] == [f"key-{i}"]
        assert e["topic"] == topic
        assert e["attempt"] == 1


def test_the_5x_client_sends_and_cpp_receives(tmp_path: Path, py5: Py5) -> None:
    topic, n = "Cross5ToCpp", 50
    py5.topic(topic)
    events = py5.produce(tmp_path, topic, n, "--tags-cycle", "TagA,TagB", "--props", "k1=v1")
    sent = {e["i"]: e for e in events if e["event"] == "sent"}
    got = cpp(
        tmp_path, "consume", "--namesrv", py5.namesrv, "--topic", topic, "--group",
        "cpp-cross-out", "--expect", str(n), "--timeout", "90",
    )  # fmt: skip
    done = [e for e in got if e["event"] == "done"]
    assert done and done[0]["complete"], got[-3:]
    recv = [e for e in got if e["event"] == "recv"]
    bodies = Counter(e["body"] for e in recv)
    assert set(bodies) == {f"body-{i}" for i in range(n)} and max(bodies.values()) == 1
    for e in recv:
        i = e["seq"]
        assert e["body"] == f"body-{i}"
        assert e["id"] == sent[i]["msg_id"]  # the 5.x message_id is the 4.x UNIQ_KEY
        assert e["tags"] == ("TagA" if i % 2 == 0 else "TagB")
        assert e["keys"] == f"key-{i}"
        assert e["topic"] == topic


def test_a_cpp_group_and_a_5x_group_consume_one_topic_side_by_side(
    tmp_path: Path, py5: Py5
) -> None:
    topic, n = "CrossShared", 60
    py5.topic(topic)
    py5.group("py5-cross-shared")
    # both groups subscribe before anything is sent, and run at the same time
    cpp_home = tmp_path / "cpp-home-bg"
    cpp_home.mkdir()
    cpp_proc = subprocess.Popen(
        [sys.executable, str(CPP_DRIVER), "consume", "--namesrv", py5.namesrv, "--topic", topic,
         "--group", "cpp-cross-shared", "--expect", str(n), "--timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "HOME": str(cpp_home)},
    )  # fmt: skip
    try:
        py5_bg = py5.background(
            tmp_path, "simple-consume", "--topic", topic, "--group", "py5-cross-shared",
            "--expect", str(n), "--timeout", "120", "--linger", "3",
        )  # fmt: skip
        try:
            assert py5_bg.started.wait(60), "the 5.x consumer did not start"
            half = n // 2
            cpp(tmp_path, "produce", "--namesrv", py5.namesrv, "--topic", topic,
                "--count", str(half), "--prefix", "c-")  # fmt: skip
            py5.produce(tmp_path, topic, half, "--prefix", "p-")
            ev = py5_bg.wait(200)
        finally:
            py5_bg.stop()
        out, err = cpp_proc.communicate(timeout=200)
    finally:
        if cpp_proc.poll() is None:
            cpp_proc.kill()
            cpp_proc.wait()
    assert cpp_proc.returncode == 0, err[-3000:]
    want = {f"c-body-{i}" for i in range(half)} | {f"p-body-{i}" for i in range(half)}
    acked = acked_bodies(ev)
    assert set(acked) == want and max(acked.values()) == 1
    cpp_events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    cpp_bodies = Counter(e["body"] for e in cpp_events if e["event"] == "recv")
    assert set(cpp_bodies) == want and max(cpp_bodies.values()) == 1
