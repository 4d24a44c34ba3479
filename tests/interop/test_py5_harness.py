"""The harness of the official RocketMQ 5 Python client: its venv, and its driver really runs it.

No server here: these prove the venv is built from the pinned requirements with the client
importable at the pinned version, and that the driver starts the real client and reports what
it does (a send to an endpoint where nothing listens fails, as an event, not as a hang).
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tests.interop.py5_harness import DRIVER, done_of, run_py5
from tests.interop.py5_venv import CLIENT_VERSION, REQUIREMENTS, ensure_py5_python, venv_key

pytestmark = [pytest.mark.interop, pytest.mark.timeout(600)]


def test_the_venv_holds_the_pinned_client_and_is_reused(py5_python: Path) -> None:
    assert f"rocketmq-python-client=={CLIENT_VERSION}" in REQUIREMENTS.read_text()
    assert py5_python.parent.parent.name == venv_key()
    out = subprocess.run(
        [str(py5_python), "-m", "pip", "freeze"], capture_output=True, text=True, timeout=60
    ).stdout
    pinned = {ln for ln in REQUIREMENTS.read_text().splitlines() if "==" in ln and ln[0] != "#"}
    assert pinned <= set(out.splitlines())
    # a second ask finds the same venv, ready
    assert ensure_py5_python() == py5_python


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_driver_runs_the_client_and_reports_a_failed_send(
    py5_python: Path, tmp_path: Path
) -> None:
    port = _closed_port()
    events = run_py5(
        py5_python, tmp_path, "produce", "--endpoint", f"127.0.0.1:{port}",
        "--topic", "Py5Nowhere", "--count", "2", "--request-timeout", "2", timeout=60,
    )  # fmt: skip
    assert events[0]["event"] == "started"
    errors = [e for e in events if e["event"] == "send_error"]
    assert [e["i"] for e in errors] == [0, 1]
    assert "route" in errors[0]["error"]
    assert done_of(events)["failures"] == 2


def test_the_driver_fails_when_the_client_is_missing(tmp_path: Path) -> None:
    import sys

    # the project's interpreter has the C++ client's `rocketmq`, not the 5.x one
    proc = subprocess.run(
        [sys.executable, str(DRIVER), "produce", "--endpoint", "127.0.0.1:1", "--topic", "T"],
        capture_output=True, text=True, timeout=60, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr or "ModuleNotFoundError" in proc.stderr
