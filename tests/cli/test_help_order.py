"""`rmq --help` lists commands and groups in the order `cli/main.py` registers them.

Users know this order; a command added or moved in `register_commands` must keep it.
"""

from __future__ import annotations

from typer.testing import CliRunner

from cli.main import app

TOP_LEVEL = [
    "produce",
    "consume",
    "up",
    "status",
    "kill",
    "restart",
    "down",
    "namesrv",
    "broker",
    "top",
    "chaos",
    "stats",
    "topic",
    "cluster",
    "group",
    "producer",
    "message",
    "bench",
    "dledger",
    "store",
]
SUBCOMMANDS = {
    "topic": ["create", "update", "delete", "list", "route", "status"],
    "cluster": ["list"],
    "group": ["list", "progress", "create", "delete", "describe", "reset"],
    "producer": ["list"],
    "message": ["query", "trace"],
    "dledger": ["leadership-transfer"],
}


def _listed(args: list[str]) -> list[str]:
    r = CliRunner().invoke(app, [*args, "--help"], terminal_width=100)
    assert r.exit_code == 0, r.output
    section = r.output.split("\nCommands:\n", 1)[1]
    names = []
    for line in section.splitlines():
        if not line.startswith("  ") or line.startswith("   "):
            break  # the end of the section (a blank line, or the examples' deeper indent)
        names.append(line.split()[0])
    return names


def test_top_level_commands_keep_their_order() -> None:
    assert _listed([]) == TOP_LEVEL


def test_admin_groups_keep_their_subcommand_order() -> None:
    for group, expected in SUBCOMMANDS.items():
        assert _listed([group]) == expected, group
