"""The README's promise: every command has examples in `--help`, and `--json` for scripts.

The command tree is walked from the typer app, so a command added later is checked too. A
command without `--json` must say why in its help ("No --json: ..."), and say where the
same facts are found as JSON.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import typer
from typer.testing import CliRunner

from cli.main import app


def _commands(
    group: object, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:  # Any: typer's vendored click.Command
    for name, command in sorted(getattr(group, "commands", {}).items()):
        if command.hidden:
            continue
        if getattr(command, "commands", None):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


# Rendered once per command (the app does not change while the suite runs): two tests read
# every command's help, and rendering it all took tens of seconds on a busy machine.
@functools.cache
def _help(path: tuple[str, ...]) -> str:
    r = CliRunner().invoke(app, [*path, "--help"])
    assert r.exit_code == 0, r.output
    return r.output


COMMANDS = list(_commands(typer.main.get_command(app)))


def test_the_walk_finds_the_commands_of_the_issue():
    found = {" ".join(path) for path, _ in COMMANDS}
    assert {
        "up",
        "down",
        "kill",
        "restart",
        "status",
        "top",
        "store verify",
        "produce",
        "consume",
        "namesrv",
    } <= found, found


def test_every_command_has_examples():
    missing = [" ".join(path) for path, _ in COMMANDS if "Examples:" not in _help(path)]
    assert missing == []


def test_every_command_has_json_or_says_why_not():
    without = []
    for path, command in COMMANDS:
        options = {opt for param in command.params for opt in getattr(param, "opts", ())}
        if "--json" in options:
            assert "--json" in _help(path)
            continue
        text = _help(path)
        if "No --json" not in text or "--json" not in text.split("No --json", 1)[1]:
            without.append(" ".join(path))
    assert without == []


def test_the_local_cluster_commands_have_json():
    for name in ("up", "down", "kill", "restart", "status"):
        [command] = [c for path, c in COMMANDS if path == (name,)]
        assert "--json" in {o for p in command.params for o in getattr(p, "opts", ())}, name
