"""The official C++ client (PyPI rocketmq==0.4.4) keeps producing to a DLedger group while its
leader is SIGKILLed twice.

The client learns a new master only from its own route refresh (every 30 s in librocketmq), so
sends fail between a kill and that refresh; the driver (tests/interop/cpp_driver.py) retries a
failed send, the same message, in `--retry-for` mode and reports each retry.  The test asserts
that nothing failed beyond those retries: every message ends answered SEND_OK, and every one is
readable from the group's final master.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from rmq import PullConsumer

if TYPE_CHECKING:
    from common.remoting.client import RemotingClient
    from tests.integration.conftest import DLedgerFactory

pytestmark = [pytest.mark.integration, pytest.mark.interop, pytest.mark.slow]

DRIVER = Path(__file__).parents[1] / "interop" / "cpp_driver.py"
TOPIC = "RaftCpp"
COUNT = 300


def spawn_producer(namesrv: str, home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            str(DRIVER),
            "produce",
            "--namesrv",
            namesrv,
            "--topic",
            TOPIC,
            "--count",
            str(COUNT),
            "--interval-ms",
            "50",
            "--retry-for",
            "90",
            "--send-timeout-ms",
            "3000",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOME": str(home)},
    )


async def test_cpp_producer_keeps_producing_through_leader_kills(
    dledger_factory: DLedgerFactory, raft_client: RemotingClient, tmp_path: Path
) -> None:
    group = await dledger_factory(3)
    leader = await group.leader(raft_client, timeout=60)
    await group.create_topic(raft_client, TOPIC, queues=4)
    home = tmp_path / "home"
    home.mkdir()
    proc = spawn_producer(group.namesrv_addr, home)
    try:
        for _ in range(2):
            await trio.sleep(4.0)
            group.kill(leader)
            await trio.sleep(0.5)
            group.restart(leader)
            leader = await group.leader(raft_client, timeout=30)
        out, err = await trio.to_thread.run_sync(lambda: proc.communicate(timeout=240))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    sent = {e["i"] for e in events if e["event"] == "sent" and e["status"] == 0}
    errors = [e for e in events if e["event"] == "send_error"]
    retries = [e for e in events if e["event"] == "failover_retry"]
    print(f"C++ producer: {len(sent)} sent, {len(retries)} failover retries")
    assert not errors, errors[:3]
    assert sent == set(range(COUNT))

    bodies: set[str] = set()
    async with PullConsumer("raft-cpp-check", group.namesrv_addr) as consumer:
        for mq in await consumer.fetch_queues(TOPIC):
            offset = 0
            while True:
                result = await consumer.pull(mq, offset, 256)
                if not result.messages:
                    break
                bodies.update(m.body.decode() for m in result.messages)
                offset = result.next_begin_offset
    assert {f"body-{i}" for i in range(COUNT)} <= bodies
