"""`rmq up --tls`: a real cluster with TLS in permissive mode. `rmq produce`/`consume` connect
with TLS (RMQ_TLS, RMQ_TLS_CA), the nodes' ports complete a TLS handshake checked against the
printed CA, and the official C++ client (plain only) produces and consumes on the same ports.

Free loopback ports in tmp_path; every process a test started is killed by pid in a `finally`.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from cli.chaos.port_blocks import free_port_block
from cli.local.certificates import ensure_local_tls
from tests.integration.test_local_json import kill_leftovers

pytestmark = [
    pytest.mark.integration,
    pytest.mark.interop,
    pytest.mark.slow,
    pytest.mark.timeout(240),
]

DRIVER = Path(__file__).with_name("cpp_driver.py")


def rmq(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def cpp(tmp_path: Path, *args: str, timeout: float = 150.0) -> list[dict[str, object]]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, str(DRIVER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HOME": str(home)},
    )
    assert proc.returncode == 0, f"C++ driver failed:\n{proc.stderr[-3000:]}\n{proc.stdout[-1500:]}"
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def tls_handshake(port: int, ca: Path) -> str:
    """Complete a TLS handshake with 127.0.0.1:port, checking the certificate against `ca`;
    the negotiated version."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            version = tls.version()
    assert version is not None
    return version


def test_up_tls_serves_rmq_over_tls_and_the_cpp_client_plain(tmp_path: Path) -> None:
    data = tmp_path / "rmq"
    base = free_port_block(20)
    namesrv = f"127.0.0.1:{base + 15}"
    seen: list[int] = []
    try:
        r = rmq(
            "up",
            "--detach",
            "--tls",
            "--slaves",
            "0",
            "--data-dir",
            str(data),
            "--namesrv-port",
            str(base + 15),
            "--broker-port",
            str(base),
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        ca = data / "tls" / "ca.pem"
        assert f"CA {ca.absolute()}" in r.stdout
        status = json.loads(rmq("status", "--json", "--data-dir", str(data)).stdout)
        seen += [status["supervisor_pid"], *(n["pid"] for n in status["nodes"])]
        assert status["tls_ca"] == str(ca.absolute())

        # every remoting port (nameserver, broker, its VIP channel) speaks TLS with that CA
        for port in (base + 15, base, base - 2):
            assert tls_handshake(port, ca).startswith("TLSv1.")

        env = {"RMQ_TLS": "1", "RMQ_TLS_CA": str(ca)}
        bodies = [f"secure-{i}" for i in range(20)]
        r = rmq("-n", namesrv, "produce", "-t", "TlsTopic", *bodies, env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("SEND_OK") == 20
        r = rmq(
            "-n",
            namesrv,
            "consume",
            "-t",
            "TlsTopic",
            "-g",
            "tls-readers",
            "--from-beginning",
            "--count",
            "20",
            env=env,
        )
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.split()) == sorted(bodies)

        # the CLI really used TLS: trusting another CA, it cannot connect
        other = ensure_local_tls(tmp_path / "other")
        r = rmq(
            "-n",
            namesrv,
            "produce",
            "-t",
            "TlsTopic",
            "x",
            env={"RMQ_TLS": "1", "RMQ_TLS_CA": str(other.ca_cert)},
        )
        assert r.returncode == 1
        assert "CERTIFICATE_VERIFY_FAILED" in r.stderr

        # the official C++ client speaks plain on the same (permissive) ports
        events = cpp(
            tmp_path,
            "produce",
            "--namesrv",
            namesrv,
            "--topic",
            "TlsTopic",
            "--count",
            "30",
            "--prefix",
            "cpp-",
        )
        sent = [e for e in events if e["event"] == "sent"]
        assert len(sent) == 30 and all(e["status"] == 0 for e in sent), events[-3:]
        events = cpp(
            tmp_path,
            "consume",
            "--namesrv",
            namesrv,
            "--topic",
            "TlsTopic",
            "--group",
            "cpp-readers",
            "--expect",
            "50",
            "--timeout",
            "60",
        )
        got = {e["body"] for e in events if e["event"] == "recv"}
        assert got == {*bodies, *(f"cpp-body-{i}" for i in range(30))}

        # and `rmq consume` over TLS reads what the C++ client sent
        r = rmq(
            "-n",
            namesrv,
            "consume",
            "-t",
            "TlsTopic",
            "-g",
            "tls-readers",
            "--count",
            "30",
            env=env,
        )
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.split()) == sorted(f"cpp-body-{i}" for i in range(30))
    finally:
        rmq("down", "--data-dir", str(data), timeout=60)
        kill_leftovers(data, seen)
