"""`-n/--namesrv` after the command (`rmq topic list -n HOST:PORT`) as well as before it.

The commands are walked from the typer app, so a command added later is checked too. Where the
address ends up is seen in the one-line connection error for a port nothing listens on.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from cli.main import app

pytestmark = pytest.mark.timeout(60)

runner = CliRunner()


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for name, command in sorted(getattr(group, "commands", {}).items()):
        if getattr(command, "commands", None):
            yield (*path, name), command
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


COMMANDS = list(_commands(typer.main.get_command(app)))


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # closed again when the block ends


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=" ".join)
def test_every_command_and_group_takes_dash_n_after_its_name(path):
    command = dict(COMMANDS)[path]
    opts = {o for p in command.params for o in getattr(p, "opts", ())}
    assert "-n" in opts, f"rmq {' '.join(path)} has no -n"
    assert "-n" in runner.invoke(app, [*path, "--help"]).output


@pytest.mark.parametrize(
    "args",
    [
        ["topic", "list", "-n", "{addr}"],
        ["topic", "list", "--namesrv", "{addr}"],
        ["topic", "list", "--namesrv={addr}"],
        ["-n", "{addr}", "topic", "list"],
        ["-n", "127.0.0.1:1", "topic", "list", "-n", "{addr}"],  # the later one wins
        ["topic", "-n", "{addr}", "list"],
        ["cluster", "-n", "{addr}"],
        ["group", "list", "-n", "{addr}"],
        ["consume", "-t", "T", "-n", "{addr}"],
    ],
    ids=" ".join,
)
def test_the_address_after_the_command_is_the_one_used(args):
    addr = _closed_port()
    result = runner.invoke(app, [a.format(addr=addr) for a in args])
    assert result.exit_code == 1, result.output
    assert "No such option" not in result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("error: ") and addr in line, line
