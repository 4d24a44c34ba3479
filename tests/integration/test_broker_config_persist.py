"""UPDATE_BROKER_CONFIG on a real `rmq broker -c FILE` process: the changed keys land in FILE
(RocketMQ's Configuration.persist writes to the -c path) and hold after a restart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.chaos.port_blocks import free_port_block
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from tests.support.wire import wait_serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _start(conf: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cli.main", "broker", "-c", str(conf)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


async def test_set_keys_are_written_to_the_config_file_and_survive_a_restart(tmp_path):
    port = free_port_block()
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "# written by hand\n"
        f"listenPort={port}\n"
        f"storePathRootDir={tmp_path / 'store'}\n"
        "namesrvAddr=127.0.0.1:1\n"
        "longPollingEnable=true\n"
    )
    addr = f"127.0.0.1:{port}"
    proc = _start(conf, tmp_path / "broker.log")
    try:
        async with open_remoting_client() as c:
            await wait_serving(c, addr, proc)
            body = b"longPollingEnable=false\ndefaultQueryMaxNum=7\nmaxMessageSize=2048\n"
            r = await c.invoke(
                addr, RemotingCommand.request(RequestCode.UPDATE_BROKER_CONFIG, None, body)
            )
            assert r.code == ResponseCode.SUCCESS, r.remark
            assert r.remark is not None and str(conf) in r.remark
            assert r.remark.endswith("takes effect after a restart: maxMessageSize")
        text = conf.read_text()
        assert text.startswith("# written by hand\n")
        assert "longPollingEnable=false\n" in text and "longPollingEnable=true" not in text
        assert text.endswith("defaultQueryMaxNum=7\nmaxMessageSize=2048\n")
    finally:
        _stop(proc)
    proc = _start(conf, tmp_path / "broker.log")
    try:
        async with open_remoting_client() as c:
            await wait_serving(c, addr, proc)
            r = await c.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG))
            shown = dict(
                line.split("=", 1) for line in r.body_bytes().decode().splitlines() if "=" in line
            )
            assert shown["longPollingEnable"] == "false"
            assert shown["defaultQueryMaxNum"] == "7" and shown["maxMessageSize"] == "2048"
            assert shown["brokerConfigPath"] == str(conf.resolve())
    finally:
        _stop(proc)
