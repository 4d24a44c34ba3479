"""A broker whose CommitLog fills its disk: refusals with a code, and nothing acknowledged lost.

The broker runs as its own process with its store on a 64 MiB tmpfs and 16 MiB CommitLog
segments, and producers send until every answer is a refusal: the CommitLog itself fills the
disk, across several segments, while a consumer group has consumed nothing.  By default
(``cleanFileForciblyEnable`` false) a full disk deletes nothing that has not expired
(docs/guarantees.md): every acknowledged message reads back intact while the disk is full,
after the tmpfs grows (``mount -o remount,size=``; puts resume within 1 s, no restart) and after
a restart.  With ``cleanFileForciblyEnable=true`` the oldest segments go, as RocketMQ's do, and
the broker's log says so.  The disk is judged full either by the ratio check
(``diskSpaceWarningLevelRatio``, before the last block) or, with that check off, by the blocks the
CommitLog reserves ahead of its writes (ENOSPC at ``posix_fallocate``, never a SIGBUS); a third
case runs the broker as a one-member DLedger group, its Raft log on the same disk.  Once puts
are refused a filler file takes the last free block, so the clean rounds, the checkpoints and
the config and offset writes all meet a disk with no room at all.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from cli.chaos.port_blocks import free_port_block
from cli.chaos.queue_readback import pull_queue
from common.errors import RemotingError
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from tests.support.tmpfs import grow_tmpfs, small_tmpfs
from tests.support.wire import send_v2

if TYPE_CHECKING:
    from common.remoting.client import RemotingClient
    from tests.conftest import Node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOPIC = "DiskFullTopic"
QUEUES = 4
GROUP = "disk-cg"
DISK_MIB = 64
SEGMENT = 16 << 20
BODY = 8000
REFUSALS_TO_STOP = 40


def _send(i: int) -> RemotingCommand:
    body = b"disk-body-%06d-" % i + b"x" * BODY
    return send_v2(TOPIC, i % QUEUES, body, group="disk-pg", queues=QUEUES)


def _props(ns_addr: str, disk: Path, **extra: object) -> dict[str, object]:
    return dict(
        namesrvAddr=ns_addr,
        storePathRootDir=disk / "store",
        mappedFileSizeCommitLog=SEGMENT,
        mappedFileSizeConsumeQueue=20 * 4000,
        maxHashSlotNum=500,
        maxIndexNum=2000,
        cleanResourceInterval=300,
        flushConsumerOffsetInterval=500,
        **extra,
    )


async def _wait_ready(client: RemotingClient, addr: str, broker: Node) -> None:
    with trio.fail_after(30):
        while True:
            assert broker.proc.poll() is None, broker.log_tail()
            with contextlib.suppress(RemotingError, OSError, trio.TooSlowError):
                r = await client.invoke(
                    addr,
                    RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}),
                    timeout=1.0,
                )
                if r.code == ResponseCode.SUCCESS:
                    return
            client.close_channel(addr)
            await trio.sleep(0.1)


async def _wait_writable(
    client: RemotingClient, addr: str, acked: dict[tuple[int, int], bytes]
) -> None:
    """Send until one is accepted (a DLedger member first elects itself)."""
    with trio.fail_after(30):
        while True:
            cmd = _send(999_999)
            r = await client.invoke(addr, cmd, timeout=10)
            if r.code == ResponseCode.SUCCESS:
                acked[(int(r.ext_fields["queueId"]), int(r.ext_fields["queueOffset"]))] = (
                    cmd.body_bytes()
                )
                return
            await trio.sleep(0.1)


async def _put_refused_reason(client: RemotingClient, addr: str) -> str:
    r = await client.invoke(
        addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), timeout=10
    )
    assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
    return str(json.loads(r.body_bytes())["table"]["putRefusedReason"])


async def _pull_all(client: RemotingClient, addr: str) -> dict[tuple[int, int], bytes]:
    got: dict[tuple[int, int], bytes] = {}
    for qid in range(QUEUES):
        for m in await pull_queue(client, addr, TOPIC, qid, group="disk-check"):
            got[(qid, m.queue_offset)] = m.body
    return got


async def _fill(
    client: RemotingClient,
    addr: str,
    broker: Node,
    acked: dict[tuple[int, int], bytes],
    start: int,
) -> tuple[int, set[str]]:
    """Send (8 in flight) until ``REFUSALS_TO_STOP`` answers in a row are refusals; the next
    message number and the refusal remarks."""
    refused_in_a_row = 0
    remarks: set[str] = set()
    counter = start

    async def sender() -> None:
        nonlocal refused_in_a_row, counter
        while refused_in_a_row < REFUSALS_TO_STOP:
            assert broker.proc.poll() is None, f"broker died: {broker.proc.returncode}"
            counter += 1
            cmd = _send(counter)
            r = await client.invoke(addr, cmd, timeout=10)
            if r.code == ResponseCode.SUCCESS:
                acked[(int(r.ext_fields["queueId"]), int(r.ext_fields["queueOffset"]))] = (
                    cmd.body_bytes()
                )
                refused_in_a_row = 0
            else:
                assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE, (r.code, r.remark)
                remarks.add(r.remark or "")
                refused_in_a_row += 1

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(sender)
    return counter + 1, remarks


async def _commit_offset(client: RemotingClient, addr: str, qid: int, offset: int) -> int:
    r = await client.invoke(
        addr,
        RemotingCommand.request(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": GROUP, "topic": TOPIC, "queueId": qid, "commitOffset": offset},
        ),
        timeout=10,
    )
    return r.code


async def _query_offset(client: RemotingClient, addr: str, qid: int) -> int:
    r = await client.invoke(
        addr,
        RemotingCommand.request(
            RequestCode.QUERY_CONSUMER_OFFSET,
            {"consumerGroup": GROUP, "topic": TOPIC, "queueId": qid},
        ),
        timeout=10,
    )
    assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
    return int(r.ext_fields["offset"])


def _top_off(path: Path) -> None:
    """Fill what the broker left free to the last block: the disk at 100%."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\1" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


def _assert_intact(acked: dict, got: dict, when: str) -> None:
    missing = [k for k in acked if k not in got]
    changed = [k for k in acked if k in got and got[k] != acked[k]]
    assert not missing and not changed, (
        f"{when}: {len(missing)} of {len(acked)} acknowledged messages gone, {len(changed)} changed"
    )


@pytest.mark.parametrize("guard", ["ratio", "reserved-blocks", "dledger"])
async def test_a_disk_filled_by_the_commitlog_keeps_every_acknowledged_message(
    tmp_path, procs, guard
):
    with small_tmpfs(tmp_path / "disk", DISK_MIB) as disk:
        ns = procs.namesrv()
        props = _props(ns.addr, disk)
        if guard == "reserved-blocks":
            # the ratio check off: the disk fills to the last block, and ENOSPC at
            # posix_fallocate is all that stands between the broker and SIGBUS
            props["diskSpaceWarningLevelRatio"] = 1.0
        if guard == "dledger":
            # a one-member group: the Raft log's data files are its CommitLog (written once)
            props.update(
                enableDLegerCommitLog="true",
                dLegerGroup="broker-a",
                dLegerPeers=f"n0-127.0.0.1:{free_port_block(1)}",
                dLegerSelfId="n0",
                heartBeatTimeIntervalMs=500,
                minVoteIntervalMs=150,
                maxVoteIntervalMs=400,
            )
        broker = procs.broker("broker-disk", **props)
        addr = broker.addr
        acked: dict[tuple[int, int], bytes] = {}
        async with open_remoting_client() as client:
            await _wait_ready(client, addr, broker)
            await _wait_writable(client, addr, acked)
            # the consumer group behind, and the checker's, exist before the disk fills
            assert await _commit_offset(client, addr, 0, 0) == ResponseCode.SUCCESS
            assert await _pull_all(client, addr) == acked
            n, remarks = await _fill(client, addr, broker, acked, 0)
            assert len(acked) * BODY > 2 * SEGMENT, "the log should span several segments"
            assert any("disk is full" in r for r in remarks), remarks
            # the disk at 100%, for several clean rounds and offset writes: nothing unexpired
            # may go, and a config or offsets write that finds no space must not kill the broker
            await trio.to_thread.run_sync(_top_off, disk / "filler")
            await trio.sleep(1.5)
            # reads and offset commits go on while writes are refused
            _assert_intact(acked, await _pull_all(client, addr), "disk full")
            r = await client.invoke(addr, _send(n), timeout=10)
            assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE, (r.code, r.remark)
            why = await _put_refused_reason(client, addr)  # what `rmq top` shows
            assert "disk is full" in why and "(cleanFileForciblyEnable=false)" in why, why
            assert await _commit_offset(client, addr, 0, 10) == ResponseCode.SUCCESS
            assert await _query_offset(client, addr, 0) == 10
            assert broker.proc.poll() is None, broker.log_tail()

            # space comes back: puts resume within 1 s, no restart
            await grow_tmpfs(disk, 4 * DISK_MIB)
            t0 = trio.current_time()
            with trio.fail_after(10):
                while True:
                    n += 1
                    r = await client.invoke(addr, _send(n), timeout=10)
                    if r.code == ResponseCode.SUCCESS:
                        break
                    assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE, (r.code, r.remark)
                    await trio.sleep(0.02)
            resumed_after = trio.current_time() - t0
            assert resumed_after < 1.0, f"puts resumed {resumed_after:.2f} s after space came back"
            acked[(int(r.ext_fields["queueId"]), int(r.ext_fields["queueOffset"]))] = _send(
                n
            ).body_bytes()
            _assert_intact(acked, await _pull_all(client, addr), "space freed")
            assert await _put_refused_reason(client, addr) == ""
            await trio.sleep(1.0)  # the offsets' periodic write now finds room

        text = broker.log.read_text(errors="replace")
        assert text.count("refusing puts") == 1, broker.log_tail(80)
        assert text.count("accepting puts again") == 1, broker.log_tail(80)
        assert "Traceback" not in text, broker.log_tail(80)
        broker.stop()

        broker = procs.broker("broker-disk", port=broker.port, **props)
        async with open_remoting_client() as client:
            await _wait_ready(client, addr, broker)
            await _wait_writable(client, addr, acked)
            _assert_intact(acked, await _pull_all(client, addr), "after a restart")
            assert await _query_offset(client, addr, 0) == 10
        broker.stop()


async def test_forced_clean_deletes_the_oldest_segments_and_says_so(tmp_path, procs):
    with small_tmpfs(tmp_path / "disk", DISK_MIB) as disk:
        ns = procs.namesrv()
        broker = procs.broker("broker-disk", **_props(ns.addr, disk, cleanFileForciblyEnable=True))
        addr = broker.addr
        acked: dict[tuple[int, int], bytes] = {}
        first = disk / "store" / "commitlog" / "00000000000000000000"
        async with open_remoting_client() as client:
            await _wait_ready(client, addr, broker)
            n, _ = await _fill(client, addr, broker, acked, 0)
            # the forced clean frees the disk by deleting unconsumed segments; puts resume
            with trio.fail_after(10):
                while first.exists():  # noqa: ASYNC110 - the broker's clean round polls too
                    await trio.sleep(0.1)
            with trio.fail_after(10):
                while (await client.invoke(addr, _send(n), timeout=10)).code != (
                    ResponseCode.SUCCESS
                ):
                    n += 1
                    await trio.sleep(0.05)
            got = await _pull_all(client, addr)
            assert len(got) < len(acked)  # what went is gone, as in RocketMQ
        text = broker.log.read_text(errors="replace")
        assert "cleanFileForciblyEnable" in text and "unexpired" in text, broker.log_tail(80)
        assert "Traceback" not in text, broker.log_tail(80)
        broker.stop()
