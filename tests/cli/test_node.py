"""`python -m cli.servers.node`, the lean node entry point `rmq up` spawns, parses like
`rmq broker`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cli.servers.node import _parser, broker_props_from_args, main


def parse(*args: str) -> argparse.Namespace:
    return _parser().parse_args(list(args))


def test_broker_flags_map_to_the_same_properties_as_rmq_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RMQ_NAMESRV", raising=False)
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=broker-x\nlistenPort = 20911\nbrokerRole=SYNC_MASTER\n")
    args = parse(
        "broker",
        "-c",
        str(conf),
        "--name",
        "broker-y",
        "--id",
        "1",
        "--role",
        "slave",
        "--flush",
        "sync_flush",
        "--data-dir",
        str(tmp_path / "d"),
        "--watch-stdin",
    )
    props = broker_props_from_args(args)
    assert props == {
        "brokerName": "broker-y",
        "listenPort": "20911",  # from the file: no --port flag
        "brokerRole": "SLAVE",
        "brokerId": "1",
        "flushDiskType": "SYNC_FLUSH",
        "storePathRootDir": str(tmp_path / "d"),
        "namesrvAddr": "127.0.0.1:9876",
    }
    assert args.watch_stdin


def test_broker_namesrv_defaults_to_the_environment(monkeypatch):
    monkeypatch.setenv("RMQ_NAMESRV", "10.0.0.1:9876")
    assert broker_props_from_args(parse("broker"))["namesrvAddr"] == "10.0.0.1:9876"
    props = broker_props_from_args(parse("broker", "--namesrv", "h:1"))
    assert props["namesrvAddr"] == "h:1"


def test_namesrv_defaults():
    args = parse("namesrv")
    assert (args.host, args.port, args.data_dir, args.watch_stdin) == (
        "127.0.0.1",
        9876,
        None,
        False,
    )


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["broker", "--role", "BOSS"], "--role"),
        (["broker", "--flush", "X"], "--flush"),
        (["broker", "--port", "x"], "--port"),
        (["nothing"], "invalid choice"),
        ([], "required"),
    ],
)
def test_bad_arguments_are_usage_errors(args, fragment, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    assert fragment in capsys.readouterr().err


def test_unreadable_config_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["broker", "-c", str(tmp_path / "missing.conf")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read config file") and len(err.splitlines()) == 1
