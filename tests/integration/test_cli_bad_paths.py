"""Every command that takes a path, given one it cannot use: ONE line on stderr, exit 1.

The paths: a directory under a regular file (ENOTDIR), one under /proc (nothing can be
created there, even by root, which is who runs the tests, so "unwritable" cannot be a mode
bit), a regular file where a directory is wanted, and a directory where a file is wanted.
Each command runs as a real process (`python -m cli.main`, or `python -m cli.servers.node` as
`rmq up` spawns it), since a traceback is what the interpreter prints when nothing caught
the error. Ports are free ones, so a command that wrongly got past its path would not meet
another cluster; every run is bounded by a timeout.

`rmq store verify` is the one exception to exit 1: like cmp(1) it exits 1 when the logs
differ and 2 when it could not compare them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli.chaos.port_blocks import free_port_block

pytestmark = pytest.mark.integration


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=60
    )


def _one_line(r: subprocess.CompletedProcess[str], path: str, code: int = 1) -> None:
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert path in r.stderr, r.stderr


def _nowhere(kind: str) -> list[str]:
    # a broker that got further than it should must not register with someone's cluster
    return ["--namesrv", "127.0.0.1:1"] if kind == "broker" else []


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    regular = tmp_path / "regular"
    regular.write_text("not a directory\n")
    not_toml = tmp_path / "cluster.toml"
    not_toml.write_text("this is = = not toml\n")
    return {
        "under_file": str(regular / "x"),
        "proc": "/proc/rmq-test-x",
        "file": str(regular),
        "dir": str(tmp_path),
        "not_toml": str(not_toml),
    }


DATA_DIRS = ("under_file", "proc", "file")


@pytest.mark.parametrize("bad", DATA_DIRS)
@pytest.mark.parametrize("detach", [False, True], ids=["foreground", "detach"])
def test_up_data_dir(paths: dict[str, str], bad: str, detach: bool) -> None:
    base = free_port_block(20)
    r = _run(
        "cli.main",
        "up",
        *(["--detach"] if detach else []),
        "--data-dir",
        paths[bad],
        "--namesrv-port",
        str(base + 15),
        "--broker-port",
        str(base),
    )
    _one_line(r, paths[bad])


@pytest.mark.parametrize("bad", DATA_DIRS)
def test_up_config_data_dir(tmp_path: Path, paths: dict[str, str], bad: str) -> None:
    base = free_port_block(20)
    conf = tmp_path / "c.toml"
    conf.write_text(
        f'data_dir = "{paths[bad]}"\nnamesrv_port = {base + 15}\nbroker_port = {base}\n'
    )
    r = _run("cli.main", "up", "--detach", "--config", str(conf))
    _one_line(r, paths[bad])


@pytest.mark.parametrize("bad", ["under_file", "proc", "dir", "not_toml"])
@pytest.mark.parametrize(
    "command",
    [
        ["up"],
        ["up", "--detach"],
        ["status"],
        ["down"],
        ["kill", "broker-a"],
        ["restart", "broker-a"],
    ],
    ids=" ".join,
)
def test_config_file(paths: dict[str, str], command: list[str], bad: str) -> None:
    r = _run("cli.main", *command, "--config", paths[bad])
    _one_line(r, paths[bad])


@pytest.mark.parametrize("bad", DATA_DIRS)
@pytest.mark.parametrize(
    "command", [["status"], ["down"], ["kill", "broker-a"], ["restart", "broker-a"]], ids=" ".join
)
def test_cluster_commands_data_dir(paths: dict[str, str], command: list[str], bad: str) -> None:
    r = _run("cli.main", *command, "--data-dir", paths[bad])
    _one_line(r, paths[bad])


@pytest.mark.parametrize("bad", DATA_DIRS)
@pytest.mark.parametrize("module", ["cli.main", "cli.servers.node"])
@pytest.mark.parametrize("kind", ["namesrv", "broker"])
def test_server_data_dir(paths: dict[str, str], kind: str, module: str, bad: str) -> None:
    port = free_port_block(10)
    r = _run(module, kind, "--port", str(port), "--data-dir", paths[bad], *_nowhere(kind))
    _one_line(r, paths[bad])


@pytest.mark.parametrize("bad", ["under_file", "proc", "dir"])
@pytest.mark.parametrize("module", ["cli.main", "cli.servers.node"])
def test_broker_config_file(paths: dict[str, str], module: str, bad: str) -> None:
    port = free_port_block(10)
    r = _run(module, "broker", "--port", str(port), "--config", paths[bad], *_nowhere("broker"))
    _one_line(r, paths[bad])


@pytest.mark.parametrize("bad", ["under_file", "proc", "file", "dir"])
def test_store_verify(tmp_path: Path, paths: dict[str, str], bad: str) -> None:
    good = tmp_path / "store"
    (good / "commitlog").mkdir(parents=True)
    for args in ([paths[bad], str(good)], [str(good), paths[bad]]):
        _one_line(_run("cli.main", "store", "verify", *args), paths[bad])


@pytest.mark.parametrize("module", ["cli.main", "cli.servers.node"])
@pytest.mark.parametrize("kind", ["namesrv", "broker"])
def test_server_port_in_use(tmp_path: Path, kind: str, module: str) -> None:
    import socket

    port = free_port_block(10)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        r = _run(
            module, kind, "--port", str(port), "--data-dir", str(tmp_path / "d"), *_nowhere(kind)
        )
    _one_line(r, "already in use")
