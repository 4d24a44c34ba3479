"""TLS: the official RocketMQ 5 Python client with `tls_enable` against `rmq up --tls`.

`rmq up --tls` makes a local CA (`<data-dir>/tls/ca.pem`) and serves every port in permissive
mode. The 5.x client verifies the server certificate against grpc's roots (docs/grpc-clients.md):
told to trust the CA (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH) it sends and receives over TLS; not told,
it refuses the server, which proves the connection really was TLS and really checked. A plain
5.x client and the official C++ client (plain remoting) keep working on the same ports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.interop.py5_harness import Py5, acked_bodies, grpc_endpoint, run_py5

if TYPE_CHECKING:
    from tests.conftest import ClusterRunner, LocalCluster

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(300)]

CPP_DRIVER = Path(__file__).with_name("cpp_driver.py")


@pytest.fixture(scope="module")
def cluster(
    cluster_runner: ClusterRunner, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    with cluster_runner(tmp_path_factory.mktemp("py5tls") / "rmq", "--tls") as c:
        yield c


@pytest.fixture(scope="module")
def ca(cluster: LocalCluster) -> Path:
    path = cluster.data_dir / "tls" / "ca.pem"
    assert path.is_file(), f"`rmq up --tls` made no CA at {path}:\n{cluster.output()}"
    return path


@pytest.fixture(scope="module")
def tls5(py5_python: Path, cluster: LocalCluster, ca: Path) -> Py5:
    return Py5(
        py5_python, grpc_endpoint(cluster.data_dir), cluster.namesrv_addr, tls=True, ca=str(ca)
    )


@pytest.fixture(scope="module")
def plain5(py5_python: Path, cluster: LocalCluster) -> Py5:
    return Py5(py5_python, grpc_endpoint(cluster.data_dir), cluster.namesrv_addr)


def cpp(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    home = tmp_path / f"cpp-home-{args[0]}"
    home.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, str(CPP_DRIVER), *args],
        capture_output=True, text=True, timeout=180, env={**os.environ, "HOME": str(home)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]


def test_the_5x_client_sends_and_receives_over_tls(tmp_path: Path, tls5: Py5) -> None:
    topic, group, n = "Py5Tls", "py5-tls", 30
    tls5.topic(topic)
    tls5.group(group)
    tls5.produce(tmp_path, topic, n)
    ev, done = tls5.simple(tmp_path, topic, group, n, "--linger", "2")
    assert done["complete"], done
    acked = acked_bodies(ev)
    assert set(acked) == {f"body-{i}" for i in range(n)} and max(acked.values()) == 1


def test_the_5x_push_consumer_over_tls(tmp_path: Path, tls5: Py5) -> None:
    topic, group, n = "Py5TlsPush", "py5-tls-push", 20
    tls5.topic(topic)
    tls5.group(group)
    tls5.produce(tmp_path, topic, n)
    ev, done = tls5.push(tmp_path, topic, group, n, "--linger", "2")
    assert done["complete"], done
    assert {e["body"] for e in ev if e["event"] == "recv"} == {f"body-{i}" for i in range(n)}


def test_a_tls_client_that_does_not_trust_the_ca_is_refused(
    tmp_path: Path, py5_python: Path, cluster: LocalCluster
) -> None:
    events = run_py5(
        py5_python, tmp_path, "produce", "--endpoint", grpc_endpoint(cluster.data_dir), "--tls",
        "--topic", "Py5TlsUntrusted", "--count", "1", "--request-timeout", "3", timeout=90,
    )  # fmt: skip
    assert [e["event"] for e in events if e["event"] in ("sent", "send_error")] == ["send_error"]
    # refused by the client's own check of the certificate: the server did speak TLS
    log = tmp_path / "home-produce" / "logs" / "rocketmq_python" / "rocketmq_client.log"
    assert "CERTIFICATE_VERIFY_FAILED" in log.read_text(errors="replace")


def test_plain_clients_keep_working_in_permissive_mode(
    tmp_path: Path, plain5: Py5, tls5: Py5
) -> None:
    topic, n = "Py5TlsPlain", 20
    plain5.topic(topic)
    plain5.group("py5-tls-plain")
    # a plain 5.x producer, a TLS 5.x consumer; the C++ client both ways on the plain port
    plain5.produce(tmp_path, topic, n, "--prefix", "p-")
    cpp(tmp_path, "produce", "--namesrv", plain5.namesrv, "--topic", topic, "--count", str(n),
        "--prefix", "c-")  # fmt: skip
    want = {f"p-body-{i}" for i in range(n)} | {f"c-body-{i}" for i in range(n)}
    ev, done = tls5.simple(tmp_path, topic, "py5-tls-plain", 2 * n, "--linger", "2")
    assert done["complete"], done
    assert set(acked_bodies(ev)) == want
    got = cpp(tmp_path, "consume", "--namesrv", plain5.namesrv, "--topic", topic, "--group",
              "cpp-tls-plain", "--expect", str(2 * n), "--timeout", "90")  # fmt: skip
    done_cpp = [e for e in got if e["event"] == "done"]
    assert done_cpp and done_cpp[0]["complete"], got[-3:]
    assert {e["body"] for e in got if e["event"] == "recv"} == want
