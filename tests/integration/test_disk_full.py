"""A broker whose filesystem fills: clean refusals with a code, never a crash.

The broker runs as its own process with its store on a small tmpfs that a ballast file half
fills.  Producers send until every answer is a refusal; then the test checks that the process is
alive (a store through a mapped hole on a full filesystem is SIGBUS, exit -7), that every
acknowledged message reads back intact, and that after the ballast is deleted writes resume by
themselves.  Two disk guards are checked, each on its own: the ratio check
(``diskSpaceWarningLevelRatio``, answered before the disk is full) and, with that check turned
off, the blocks reserved ahead of the writes (ENOSPC at ``posix_fallocate``).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import pytest
import trio

from cli.chaos.queue_readback import pull_queue
from common.errors import RemotingError
from common.remoting.client import open_remoting_client
from common.remoting.codes import ResponseCode
from common.remoting.command import RemotingCommand
from tests.support.tmpfs import small_tmpfs
from tests.support.wire import send_v2

if TYPE_CHECKING:
    from common.remoting.client import RemotingClient
    from tests.conftest import Node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOPIC = "DiskFullTopic"
QUEUES = 4
DISK_MIB = 24
BALLAST_MIB = 6


def _send(i: int) -> RemotingCommand:
    body = b"disk-body-%06d-" % i + b"x" * 4000
    return send_v2(TOPIC, i % QUEUES, body, group="disk-pg", queues=QUEUES)


async def _pull_all(client: RemotingClient, addr: str) -> dict[tuple[int, int], bytes]:
    got: dict[tuple[int, int], bytes] = {}
    for qid in range(QUEUES):
        for m in await pull_queue(client, addr, TOPIC, qid, group="disk-check"):
            got[(qid, m.queue_offset)] = m.body
    return got


async def _fill(
    client: RemotingClient, addr: str, broker: Node, acked: dict, start: int
) -> tuple[int, set[str]]:
    """Send (2 in flight) until 40 answers in a row are refusals; the refusal remarks."""
    refused_in_a_row = 0
    remarks: set[str] = set()
    i = start

    async def one(n: int) -> None:
        nonlocal refused_in_a_row
        cmd = _send(n)
        r = await client.invoke(addr, cmd, timeout=10)
        if r.code == ResponseCode.SUCCESS:
            acked[(int(r.ext_fields["queueId"]), int(r.ext_fields["queueOffset"]))] = cmd.body
            refused_in_a_row = 0
        else:
            assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE, (r.code, r.remark)
            remarks.add(r.remark or "")
            refused_in_a_row += 1

    with trio.fail_after(60):
        while refused_in_a_row < 40:
            assert broker.proc.poll() is None, f"broker died: {broker.proc.returncode}"
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    i += 1
                    nursery.start_soon(one, i)
    return i, remarks


@pytest.mark.parametrize("guard", ["ratio", "reserved-blocks"])
async def test_a_full_disk_is_refused_with_a_code_and_writes_resume(tmp_path, procs, guard):
    with small_tmpfs(tmp_path / "disk", DISK_MIB) as disk:
        ballast = disk / "ballast"
        ballast.write_bytes(b"\1" * (BALLAST_MIB << 20))
        ns = procs.namesrv()
        props = dict(
            namesrvAddr=ns.addr,
            storePathRootDir=disk / "store",
            mapedFileSizeCommitLog=2 << 20,
            mapedFileSizeConsumeQueue=20 * 2000,
            maxHashSlotNum=500,
            maxIndexNum=2000,
            cleanResourceInterval=200,
            # above 85% RocketMQ deletes even unexpired segments; off here, since this test
            # checks that what was acknowledged stays (tests/broker/store/test_retention.py
            # checks the forced clean)
            cleanFileForciblyEnable="false",
        )
        if guard == "reserved-blocks":
            props["diskSpaceWarningLevelRatio"] = 1.0  # only ENOSPC stands between us and SIGBUS
        broker = procs.broker("broker-disk", **props)
        addr = broker.addr
        acked: dict[tuple[int, int], bytes] = {}
        async with open_remoting_client() as client:
            with trio.fail_after(30):
                while True:
                    assert broker.proc.poll() is None, broker.log_tail()
                    with contextlib.suppress(RemotingError, OSError, trio.TooSlowError):
                        r = await client.invoke(addr, _send(0), timeout=1.0)
                        if r.code == ResponseCode.SUCCESS:
                            break
                    client.close_channel(addr)
                    await trio.sleep(0.1)
            n, remarks = await _fill(client, addr, broker, acked, 1)
            assert len(acked) > 500, "the disk filled too early for the test to mean anything"
            assert any("disk is full" in r for r in remarks), remarks
            # reads go on while writes are refused, and nothing acknowledged is lost
            got = await _pull_all(client, addr)
            missing = [k for k in acked if got.get(k) != acked[k]]
            assert not missing, f"{len(missing)} acknowledged messages lost or changed"
            assert broker.proc.poll() is None, broker.log_tail()

            ballast.unlink()
            with trio.fail_after(20):
                while True:
                    n += 1
                    r = await client.invoke(addr, _send(n), timeout=10)
                    if r.code == ResponseCode.SUCCESS:
                        break
                    assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE, (r.code, r.remark)
                    await trio.sleep(0.1)
            before = len(acked)
            await _fill(client, addr, broker, acked, n)
            assert len(acked) > before, "writes did not resume after space was freed"
            got = await _pull_all(client, addr)
            assert all(got.get(k) == v for k, v in acked.items())
        assert broker.proc.poll() is None
        assert "Traceback" not in broker.log.read_text(errors="replace"), broker.log_tail(80)
        broker.stop()
