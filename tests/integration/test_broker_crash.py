"""SIGKILL a real broker process mid-write, many times; acknowledged messages must survive.

The broker runs as its own process with SYNC_FLUSH and 256 KiB CommitLog segments (so kills
land around file rollovers too). Several producers pipeline SEND_MESSAGE_V2 requests while the
test kills the process at a random moment. After every restart the test pulls every queue from
offset 0 and checks: each message the broker acknowledged is there, at the queue offset and
physical offset the acknowledgement named, with the right body; every record served decodes
with a valid body CRC; offsets within a queue are dense.

A second test tears already-flushed bytes: a lone SYNC_FLUSH master is killed once its sends
were acknowledged (so flushed), the last 1-500 bytes of written CommitLog data are zeroed (a
write the disk lost), and the broker restarts on that, four rounds on the same store.  Every
acknowledged record before the tear must be served unchanged, none with a bad body CRC, and
new sends take the next physical and queue offsets.  A third: a CommitLog segment shorter than
the configured size stops the broker with one error line and exit status 1.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from broker.store.commitlog_scan import scan_segment
from cli.chaos.port_blocks import free_port_block
from cli.chaos.queue_readback import pull_queue
from common.message_id import decode_offset_msg_id
from common.remoting.client import open_remoting_client
from common.remoting.codes import ResponseCode
from common.remoting.command import RemotingCommand
from tests.support.wire import send_v2, wait_serving

if TYPE_CHECKING:
    from common.remoting.client import RemotingClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "CrashTopic"
QUEUES = 4
ROUNDS = 20
TORN_ROUNDS = 4
SEGMENT = 262144


def _free_port_block() -> int:
    """A free port block outside the ephemeral range (cli.chaos.port_blocks)."""
    return free_port_block()


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def _send_cmd(i: int) -> RemotingCommand:
    body = b"crash-body-%d-" % i + b"x" * (i % 700)
    return send_v2(TOPIC, i % QUEUES, body, group="crash-pg", queues=QUEUES)


async def _verify(
    client: RemotingClient, addr: str, acked: dict[tuple[int, int], tuple[bytes, int]]
) -> None:
    # the first round has sent nothing yet: the topic is auto-created by the first send
    ends = {ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED}
    if not acked:
        ends.add(ResponseCode.TOPIC_NOT_EXIST)
    for qid in range(QUEUES):
        seen = {}
        for m in await pull_queue(client, addr, TOPIC, qid, group="crash-check", ends=ends):
            assert m.queue_id == qid
            seen[m.queue_offset] = (m.body, m.commit_log_offset)
        assert sorted(seen) == list(range(len(seen))), f"queue {qid} offsets not dense"
        for (q, qoff), (body, phys) in acked.items():
            if q != qid:
                continue
            assert qoff in seen, f"acknowledged message lost: queue {q} offset {qoff}"
            assert seen[qoff] == (body, phys), f"queue {q} offset {qoff} differs"


async def test_sigkill_mid_write_loses_no_acknowledged_message(tmp_path):
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    nbase = _free_port_block()
    bbase = _free_port_block()
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "\n".join(
            [
                "brokerName=broker-crash",
                f"listenPort={bbase}",
                f"namesrvAddr=127.0.0.1:{nbase}",
                f"storePathRootDir={tmp_path / 'store'}",
                "flushDiskType=SYNC_FLUSH",
                "mapedFileSizeCommitLog=262144",
                "mappedFileSizeConsumeQueue=2000",
            ]
        )
    )
    namesrv = _start(
        ["namesrv", "--port", str(nbase), "--data-dir", str(tmp_path / "ns")], tmp_path / "ns.log"
    )
    acked: dict[tuple[int, int], tuple[bytes, int]] = {}
    addr = f"127.0.0.1:{bbase}"
    counter = 0
    try:
        for round_no in range(ROUNDS + 1):
            broker = _start(["broker", "-c", str(conf)], tmp_path / "broker.log")
            try:
                async with open_remoting_client() as client:
                    await wait_serving(client, addr, broker)
                    await _verify(client, addr, acked)
                    if round_no == ROUNDS:
                        break

                    async def producer(client: RemotingClient = client) -> None:
                        nonlocal counter
                        while True:
                            counter += 1
                            cmd = _send_cmd(counter)
                            try:
                                r = await client.invoke(addr, cmd, timeout=5)
                            except Exception:
                                return  # the broker died under us
                            if r.code == ResponseCode.SUCCESS:
                                (_host, phys) = decode_offset_msg_id(r.ext_fields["msgId"])
                                key = (
                                    int(r.ext_fields["queueId"]),
                                    int(r.ext_fields["queueOffset"]),
                                )
                                acked[key] = (cmd.body_bytes(), phys)

                    async with trio.open_nursery() as nursery:
                        for _ in range(4):
                            nursery.start_soon(producer)
                        await trio.sleep(rng.uniform(0.05, 0.6))
                        broker.send_signal(signal.SIGKILL)
                        broker.wait()
                        nursery.cancel_scope.cancel()
            finally:
                if broker.poll() is None:
                    broker.kill()
                    broker.wait()
        assert len(acked) > 100, "too few acknowledged messages for the test to mean anything"
    finally:
        namesrv.terminate()
        namesrv.wait(timeout=10)


def _records(store: Path) -> list[tuple[int, int]]:
    """(start, end) of every CommitLog record of ``store``, in order."""
    out: list[tuple[int, int]] = []
    for seg in sorted((store / "commitlog").iterdir()):
        data = seg.read_bytes()
        base = int(seg.name)
        for p in scan_segment(data, base).starts.tolist():
            out.append((base + p, base + p + int.from_bytes(data[p : p + 4], "big")))
    return out


def _checkpoint_dispatched(store: Path) -> int:
    """The checkpoint's ``dispatched`` offset (broker/store/checkpoint.py: a long at 32)."""
    return int.from_bytes((store / "checkpoint").read_bytes()[32:40], "big")


def _tear(store: Path, end: int, n: int) -> None:
    """Zero the ``n`` CommitLog bytes before absolute offset ``end``, across segment files."""
    pos = end - n
    while pos < end:
        base = pos - pos % SEGMENT
        upto = min(end, base + SEGMENT)
        with open(store / "commitlog" / f"{base:020d}", "r+b") as f:
            f.seek(pos - base)
            f.write(bytes(upto - pos))
        pos = upto


async def test_torn_flushed_tail_after_sigkill_repeated(tmp_path):
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    nbase = _free_port_block()
    bbase = _free_port_block()
    store = tmp_path / "store"
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "\n".join(
            [
                "brokerName=broker-torn",
                f"listenPort={bbase}",
                f"namesrvAddr=127.0.0.1:{nbase}",
                f"storePathRootDir={store}",
                "flushDiskType=SYNC_FLUSH",
                f"mapedFileSizeCommitLog={SEGMENT}",
                "mappedFileSizeConsumeQueue=2000",
            ]
        )
    )
    namesrv = _start(
        ["namesrv", "--port", str(nbase), "--data-dir", str(tmp_path / "ns")], tmp_path / "ns.log"
    )
    acked: dict[tuple[int, int], tuple[bytes, int]] = {}
    addr = f"127.0.0.1:{bbase}"
    counter = 0
    torn_from = 0  # the first CommitLog offset the last tear touched
    try:
        for round_no in range(TORN_ROUNDS + 1):
            broker = _start(["broker", "-c", str(conf)], tmp_path / "broker.log")
            try:
                async with open_remoting_client() as client:
                    await wait_serving(client, addr, broker)
                    # what the tear touched is gone for good; the rest must all be served
                    acked = {k: v for k, v in acked.items() if v[1] < torn_from}
                    await _verify(client, addr, acked)
                    if round_no == TORN_ROUNDS:
                        break
                    first = True
                    for _ in range(rng.randrange(150, 400)):
                        counter += 1
                        cmd = _send_cmd(counter)
                        r = await client.invoke(addr, cmd, timeout=5)
                        assert r.code == ResponseCode.SUCCESS, r.remark
                        (_host, phys) = decode_offset_msg_id(r.ext_fields["msgId"])
                        key = (int(r.ext_fields["queueId"]), int(r.ext_fields["queueOffset"]))
                        # the next offsets after the cut: physical and per queue
                        assert key[1] == len([k for k in acked if k[0] == key[0]])
                        if first and round_no:
                            assert phys == torn_from, "the first send after the cut"
                        first = False
                        acked[key] = (cmd.body_bytes(), phys)
                    # every send was acknowledged, so flushed; once the checkpoint covers them
                    # too, the tear below hits bytes recovery was told are on disk
                    for _ in range(200):
                        if _checkpoint_dispatched(store) >= _records(store)[-1][1]:
                            break
                        await trio.sleep(0.1)
                    else:
                        raise AssertionError("the checkpoint did not catch up with the sends")
                    broker.send_signal(signal.SIGKILL)
                    broker.wait()
            finally:
                if broker.poll() is None:
                    broker.kill()
                    broker.wait()
            records = _records(store)
            end = records[-1][1]
            n = rng.randint(1, 500)
            _tear(store, end, n)
            torn_from = next(start for start, stop in records if stop > end - n)
    finally:
        namesrv.terminate()
        namesrv.wait(timeout=10)


def test_short_commit_log_segment_is_one_error_line(tmp_path):
    store = tmp_path / "store"
    seg = store / "commitlog" / f"{0:020d}"
    seg.parent.mkdir(parents=True)
    seg.write_bytes(bytes(1000))  # a filesystem that lost the rest of the file
    conf = tmp_path / "broker.conf"
    port = _free_port_block()
    conf.write_text(
        f"brokerName=b\nlistenPort={port}\nnamesrvAddr=127.0.0.1:{port + 5}\n"
        f"storePathRootDir={store}\nmapedFileSizeCommitLog={SEGMENT}\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "cli.main", "broker", "-c", str(conf)],
        capture_output=True,
        timeout=60,
    )
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert str(seg) in lines[0] and f"1000 bytes, shorter than the configured {SEGMENT}" in lines[0]
    assert "move the file away" in lines[0]
