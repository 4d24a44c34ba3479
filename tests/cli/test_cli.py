"""`rmq` parsing, help and error paths through typer's CliRunner (no servers needed)."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from cli.local.up_arguments import fast_up_arguments
from cli.main import app
from cli.servers.node import broker_properties, properties_text
from namesrv.config import parse_properties

runner = CliRunner()

COMMANDS = [
    ["namesrv"],
    ["broker"],
    ["up"],
    ["cluster"],
    ["produce"],
    ["consume"],
    ["topic"],
    ["topic", "create"],
    ["topic", "list"],
    ["topic", "route"],
    ["topic", "update"],
    ["topic", "delete"],
    ["topic", "status"],
    ["cluster", "list"],
    ["broker", "status"],
    ["group", "list"],
    ["group", "progress"],
    ["message", "query"],
    ["group", "reset"],
    ["message", "trace"],
]


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_an_example(cmd):
    result = runner.invoke(app, [*cmd, "--help"])
    assert result.exit_code == 0, result.output
    assert "Examples:" in result.stdout
    examples = result.stdout.split("Examples:", 1)[1]
    assert "rmq " + (cmd[0] if cmd[0] != "cluster" else "cluster") in examples


def test_no_arguments_shows_help():
    result = runner.invoke(app, [])
    assert "Usage:" in result.output and "produce" in result.output


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


@pytest.mark.parametrize(
    "args",
    [
        ["topic", "list"],
        ["topic", "route", "T"],
        ["topic", "create", "T"],
        ["cluster"],
        ["produce", "--topic", "T", "hello"],
        ["consume", "--topic", "T", "--count", "1"],
        ["cluster", "list", "--json"],
        ["topic", "update", "T", "--queues", "2"],
        ["topic", "delete", "T"],
        ["topic", "status", "T", "--json"],
        ["group", "list"],
        ["group", "progress", "g"],
        ["group", "reset", "g", "--topic", "T", "--to-latest"],
        ["message", "query", "--topic", "T", "--key", "k"],
        ["message", "query", "--id", "7F000001000029AF0000000000000000"],
        ["message", "trace", "7F000001000029AF0000000000000000"],
    ],
    ids=lambda a: " ".join(a[:3]),
)
def test_connection_refused_is_one_line_on_stderr(args):
    result = runner.invoke(app, ["--namesrv", f"127.0.0.1:{closed_port()}", *args])
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: cannot connect")
    assert "Traceback" not in result.stderr


def test_namesrv_env_var_is_the_default(monkeypatch):
    monkeypatch.setenv("RMQ_NAMESRV", f"127.0.0.1:{closed_port()}")
    result = runner.invoke(app, ["topic", "list"])
    assert result.exit_code == 1
    assert "127.0.0.1:" in result.stderr and ":9876" not in result.stderr


def test_bad_namesrv_address_is_one_line():
    result = runner.invoke(app, ["-n", "nohost", "topic", "list"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: bad nameserver address")


def test_produce_without_bodies_or_stdin_fails_cleanly():
    result = runner.invoke(app, ["produce", "--topic", "T"], input="\n\n")
    assert result.exit_code == 1
    assert "nothing to send" in result.stderr


def test_produce_refuses_bad_topic_and_property_before_connecting():
    result = runner.invoke(
        app, ["-n", f"127.0.0.1:{closed_port()}", "produce", "-t", "bad topic", "x"]
    )
    assert result.exit_code == 1 and "characters" in result.stderr
    result = runner.invoke(app, ["produce", "-t", "T", "-P", "novalue", "x"])
    assert result.exit_code == 2 and "K=V" in result.output


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["broker", "--flush", "SOMETIMES"], "SYNC_FLUSH"),
        (["broker", "--role", "BOSS"], "SLAVE"),
        (["consume", "--topic", "T", "--count", "0"], "count"),
        (["up", "--masters", "0"], "masters"),
    ],
)
def test_bad_flags_are_usage_errors(args, fragment):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert fragment in result.output


def test_up_rejects_overlapping_ports():
    result = runner.invoke(app, ["up", "--namesrv-port", "10912"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error:") and "10912" in result.stderr


def test_up_refuses_a_busy_port(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        result = runner.invoke(
            app,
            [
                "up",
                "--data-dir",
                str(tmp_path),
                "--namesrv-port",
                str(busy),
                "--broker-port",
                str(closed_port() + 20 if busy < 60000 else 20000),
            ],
        )
    assert result.exit_code == 1
    assert f"port {busy}" in result.stderr and "in use" in result.stderr
    assert not (tmp_path / "logs").exists()  # nothing was spawned


def test_broker_flags_override_the_config_file():
    conf = "brokerName=broker-x\nlistenPort = 20911\n# comment\nbrokerRole=SYNC_MASTER\n"
    props = broker_properties(
        conf, {"name": "broker-y", "port": None, "role": None, "data_dir": "/tmp/a b"}
    )
    assert props == {
        "brokerName": "broker-y",
        "listenPort": "20911",
        "brokerRole": "SYNC_MASTER",
        "storePathRootDir": "/tmp/a b",
    }


def test_properties_text_round_trips_awkward_values():
    props = {"storePathRootDir": "C:\\data\\rmq", "a b": " lead", "k=v": "x:y"}
    assert parse_properties(properties_text(props)) == props


UP_LINES = [
    ["up"],
    ["up", "--data-dir", "/tmp/rmq x", "--namesrv-port", "19876", "--broker-port", "20911"],
    ["up", "--masters", "2", "--slaves", "1", "--sync-master", "--cluster", "C1"],
    ["up", "--ready-timeout", "2.5", "--masters", "3", "--masters", "1"],  # last one wins
    ["up", "--cluster", ""],
]


@pytest.mark.parametrize("argv", UP_LINES, ids=" ".join)
def test_fast_up_arguments_are_what_typer_parses(argv):
    import typer.core
    import typer.main

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    command = group.commands["up"]
    with command.make_context("up", argv[1:]) as ctx:
        expected = ctx.params
    assert fast_up_arguments(argv) == expected


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["topic", "list"],
        ["-n", "h:1", "up"],
        ["up", "--help"],
        ["up", "-h"],
        ["up", "--masters", "0"],
        ["up", "--slaves", "-1"],
        ["up", "--masters", "two"],
        ["up", "--masters"],
        ["up", "--bogus", "1"],
        ["up", "--masters=2"],
        ["up", "--no-sync-master"],
        ["up", "extra"],
    ],
    ids=lambda a: " ".join(a) or "empty",
)
def test_anything_unusual_is_left_to_typer(argv):
    assert fast_up_arguments(argv) is None
