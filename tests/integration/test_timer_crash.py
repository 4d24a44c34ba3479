"""Timer messages in a real broker process (file store, 256 KiB CommitLog segments): SIGKILL
after some were delivered and before others are due; after the restart every timer arrives
once, none before its time.  Between the timers, filler sends roll the CommitLog over several
segments, so the restart's scan for delivery marks crosses segment ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from cli.chaos.port_blocks import free_port_block
from cli.chaos.queue_readback import pull_queue
from common.message_properties import encode_properties
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from tests.support.wire import send_v2, wait_serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOPIC = "TimerCrash"


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def _timer_send(i: int, deliver_ms: int) -> RemotingCommand:
    props = {"TIMER_DELIVER_MS": str(deliver_ms), "UNIQ_KEY": f"TIMER{i:027d}", "WAIT": "true"}
    fields = {"a": "pg", "b": TOPIC, "c": "TBW102", "d": 1, "e": 0, "f": 0, "g": 0, "h": 0}
    return RemotingCommand.request(
        RequestCode.SEND_MESSAGE_V2, fields | {"i": encode_properties(props)}, b"timer-%d" % i
    )


async def test_sigkill_between_deliveries_neither_loses_nor_doubles(tmp_path: Path) -> None:
    nbase, bbase = free_port_block(), free_port_block()
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "\n".join(
            [
                "brokerName=broker-timer",
                f"listenPort={bbase}",
                f"namesrvAddr=127.0.0.1:{nbase}",
                f"storePathRootDir={tmp_path / 'store'}",
                "mapedFileSizeCommitLog=262144",
            ]
        )
    )
    namesrv = _start(
        ["namesrv", "--port", str(nbase), "--data-dir", str(tmp_path / "ns")], tmp_path / "ns.log"
    )
    addr = f"127.0.0.1:{bbase}"
    broker = _start(["broker", "-c", str(conf)], tmp_path / "broker.log")
    dues: dict[bytes, int] = {}
    try:
        async with open_remoting_client() as client:
            await wait_serving(client, addr, broker)
            now = int(time.time() * 1000)
            # six due within 8 s, two after the restart
            offsets = [3000, 4000, 5000, 6000, 7000, 8000, 16_000, 17_000]
            for i, off in enumerate(offsets):
                r = await client.invoke(addr, _timer_send(i, now + off))
                assert r.code == ResponseCode.SUCCESS, r.remark
                dues[b"timer-%d" % i] = now + off
                for _ in range(40):  # ~80 KiB of other sends: a new segment every 3 timers
                    filler = send_v2("Filler", 0, b"f" * 2000, queues=1)
                    assert (await client.invoke(addr, filler)).code == ResponseCode.SUCCESS
            await trio.sleep(max(0.0, (now + 5600 - time.time() * 1000) / 1000))
        broker.send_signal(signal.SIGKILL)
        broker.wait(10)
        broker = _start(["broker", "-c", str(conf)], tmp_path / "broker.log")
        async with open_remoting_client() as client:
            await wait_serving(client, addr, broker)
            await trio.sleep(max(0.0, (now + 19_500 - time.time() * 1000) / 1000))
            got = await pull_queue(client, addr, TOPIC, 0, ends={ResponseCode.PULL_NOT_FOUND})
    finally:
        for proc in (broker, namesrv):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    bodies = [m.body for m in got]
    assert sorted(bodies) == sorted(dues), (bodies, (tmp_path / "broker.log").read_text()[-3000:])
    for m in got:
        # stored (delivered) no sooner than asked, and within a few seconds of it
        assert m.store_timestamp >= dues[m.body]
        assert m.store_timestamp < dues[m.body] + 5000
