"""`rmq --help` lists commands and groups in the order their modules register them.

The mqadmin-style commands live in one module per area (cli/cmd_cluster.py, cmd_topic.py,
cmd_group.py, cmd_message.py, cmd_produce_consume.py) and are registered by importing
cli/cmd_admin.py; moving or renaming one of them can silently reorder the help. This pins the
order users have seen since the commands were written.
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
    "topic",
    "cluster",
    "group",
    "message",
    "bench",
    "dledger",
    "store",
]
SUBCOMMANDS = {
    "topic": ["create", "update", "delete", "list", "route", "status"],
    "cluster": ["list"],
    "group": ["list", "progress"],
    "message": ["query"],
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
