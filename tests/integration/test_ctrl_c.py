"""Ctrl-C (SIGINT) ends every long-running `rmq` command with status 130, as shells expect
of a process Ctrl-C stopped, after the command's own clean stop: offsets committed, what was
read sent and reported, nodes stopped (`rmq up` in the foreground: test_local_cli.py).

Each command runs as a real process against the nameserver and broker of test_cli_admin's
`ns` fixture; SIGINT is sent once the command shows it is in its loop (a line it prints).
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.integration import test_cli_admin

ns = test_cli_admin.ns

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


class Proc:
    """`python -m cli.main ARGS` with its stdout and stderr lines collected by threads."""

    def __init__(self, *args: str, tty: bool = False) -> None:
        # with `tty`, stdout is a pseudo-terminal (what `rmq top` draws its live view on)
        master, slave = pty.openpty() if tty else (None, None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args],
            stdin=subprocess.PIPE,
            stdout=slave if tty else subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            text=True,
        )
        if slave is not None:
            os.close(slave)
        stdout = self.proc.stdout if master is None else open(master, errors="replace")
        self._tty = None if master is None else stdout
        self.out: list[str] = []
        self.err: list[str] = []
        self.threads = [
            threading.Thread(target=self._read, args=(stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self.threads:
            t.start()

    @staticmethod
    def _read(stream: IO[str], into: list[str]) -> None:
        try:
            for line in stream:
                into.append(line.rstrip("\r\n"))
        except OSError:  # a pseudo-terminal whose other end closed: EIO, the end
            pass

    def wait_for(self, pred: Callable[[], bool], what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{what}: rc={self.proc.poll()} {self.out} {self.err}")
            time.sleep(0.05)

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=30)
        for t in self.threads:
            t.join(timeout=5)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for t in self.threads:
            t.join(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr, self._tty):
            if stream is not None:
                stream.close()


@pytest.fixture
def started():
    procs: list[Proc] = []

    def start(*args: str, tty: bool = False) -> Proc:
        procs.append(Proc(*args, tty=tty))
        return procs[-1]

    yield start
    for p in procs:
        p.close()


def _produce(ns_addr: str, topic: str, *bodies: str) -> None:
    r = CliRunner().invoke(app, ["-n", ns_addr, "produce", "-t", topic, *bodies])
    assert r.exit_code == 0, r.output


def test_consume_follow(ns, started):
    _produce(ns[0], "CtrlCConsume", "old")
    p = started("-n", ns[0], "consume", "-t", "CtrlCConsume", "-g", "cg-ctrl-c", "-f")
    p.wait_for(lambda: any("starts at the end" in line for line in p.err), "the new-group note")
    _produce(ns[0], "CtrlCConsume", "new")
    p.wait_for(lambda: p.out == ["new"], "the new message")
    assert p.interrupt() == 130, p.err
    assert not any("Traceback" in line for line in p.err), p.err
    # the offsets were committed on the way out: nothing left for the group
    again = CliRunner().invoke(
        app, ["-n", ns[0], "consume", "-t", "CtrlCConsume", "-g", "cg-ctrl-c"]
    )
    assert again.exit_code == 0 and again.stdout == "", again.output


def test_produce_from_stdin(ns, started):
    p = started("-n", ns[0], "produce", "-t", "CtrlCProduce", "--no-progress")
    assert p.proc.stdin is not None
    p.proc.stdin.write("one\n")
    p.proc.stdin.flush()
    p.wait_for(lambda: any(line.startswith("SEND_OK") for line in p.out), "the first SEND_OK")
    assert p.interrupt() == 130, p.err
    assert p.out[-1].startswith("sent 1 message(s) to CtrlCProduce"), p.out


def test_top(ns, started):
    p = started("-n", ns[0], "top", "--interval", "0.2", tty=True)
    p.wait_for(lambda: any("broker-a" in line for line in p.out), "a frame")
    assert p.interrupt() == 130, p.err
    assert not any("Traceback" in line for line in p.err), p.err


def test_bench(ns, started):
    p = started(
        "-n", ns[0], "bench", "produce", "-t", "CtrlCBench", "--duration", "0.3", "--runs", "1000"
    )
    p.wait_for(lambda: len(p.out) >= 1, "the first run's line")
    assert p.interrupt() == 130, p.err
    assert not any("Traceback" in line for line in p.err), p.err
