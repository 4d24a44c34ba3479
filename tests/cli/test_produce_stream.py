"""`rmq produce` streams stdin: lines are sent while the input is still open, in order within
each queue, with bounded memory; answers that were stored without the replication the broker
waits for fail the command unless --allow-not-replicated.

Servers run in this process (tcp_cluster: TCP on 127.0.0.1); the command runs as a real process
(`python -m cli.main`) where stdin matters, and as `cli.messages.produce.produce` otherwise.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import BinaryIO, cast

import pytest
import trio

from cli.messages.produce import MessageTemplate, ProduceStats, produce, read_stream
from common.model import MessageQueue
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode
from rmq import PullConsumer, PullStatus, SendResult

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


async def read_queue(c: PullConsumer, mq: MessageQueue) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while True:
        result = await c.pull(mq, offset, 256)
        if result.status is not PullStatus.FOUND:
            return out
        out.extend(m.body for m in result.messages)
        offset = result.next_begin_offset


async def read_topic(ns: str, topic: str) -> dict[int, list[bytes]]:
    async with PullConsumer("checker", ns) as c:
        return {mq.queueId: await read_queue(c, mq) for mq in await c.fetch_queues(topic)}


def rmq_process(ns: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", "-n", ns, "produce", *args]


async def test_lines_are_sent_while_stdin_is_still_open(tcp_cluster):
    namesrv = tcp_cluster.namesrv
    await tcp_cluster.create_topic("Tail", 2)
    proc = await trio.lowlevel.open_process(
        rmq_process(namesrv, "-t", "Tail", "--json"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        await proc.stdin.send_all(b"first\nsecond\n")
        with trio.fail_after(60):  # interpreter start included, on a busy machine
            while True:
                seen = sorted(b for q in (await read_topic(namesrv, "Tail")).values() for b in q)
                if seen == [b"first", b"second"]:
                    break
                assert not seen or seen == [b"first"] or seen == [b"second"], seen
                await trio.sleep(0.1)
        assert proc.poll() is None  # still running: its stdin is open
        await proc.stdin.send_all(b"third")  # the last line may lack its newline
        await proc.stdin.aclose()
        with trio.fail_after(30):
            out = b""
            while chunk := await proc.stdout.receive_some():
                out += chunk
            assert await proc.wait() == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            await proc.wait()
    doc = json.loads(out)
    assert doc["sent"] == 3 and doc["statuses"] == {}
    assert [r["status"] for r in doc["results"]] == ["SEND_OK"] * 3
    stored = sorted(b for q in (await read_topic(namesrv, "Tail")).values() for b in q)
    assert stored == [b"first", b"second", b"third"]


async def test_count_and_order_within_each_queue(tcp_cluster):
    namesrv = tcp_cluster.namesrv
    await tcp_cluster.create_topic("Ordered", 4)
    n = 5000
    data = b"".join(b"%d\r\n" % i if i % 3 else b"%d\n\n" % i for i in range(n))
    results: list[SendResult] = []
    stats = await produce(
        namesrv,
        MessageTemplate("Ordered", tags="T"),
        group="pg",
        stream=cast(BinaryIO, Trickle(data, 333)),  # produce reads with read1 only
        handle_signals=False,
        on_results=results.extend,
        senders=4,
        max_lines=7,
    )
    assert (stats.sent, stats.lines_read, stats.statuses) == (n, n, {})
    assert len(results) == n and len({r.msg_id for r in results}) == n
    queues = await read_topic(namesrv, "Ordered")
    assert sum(len(q) for q in queues.values()) == n
    assert sorted(int(b) for q in queues.values() for b in q) == list(range(n))
    for q, bodies in queues.items():
        numbers = [int(b) for b in bodies]
        assert numbers == sorted(numbers), f"queue {q} out of input order"
        assert len(numbers) > n // 8  # every queue got its share of the batches
    # each result names where its message is
    by_queue = {(r.message_queue.queueId, r.queue_offset) for r in results}
    assert len(by_queue) == n


class Trickle:
    """A pipe that hands out `step` bytes per read: lines arrive cut anywhere."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data = io.BytesIO(data)
        self._step = step

    def read1(self, size: int) -> bytes:
        return self._data.read(min(size, self._step))


class CountingStream:
    """A binary stream of `chunks` 64 KiB reads of short lines that counts the reads made."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.reads = 0
        self._lock = threading.Lock()

    def read1(self, size: int) -> bytes:
        with self._lock:
            self.reads += 1
            if self.reads > self.chunks:
                return b""
        return b"x\n" * (size // 2)


async def test_reader_blocks_while_the_channel_is_full():
    stream = CountingStream(chunks=20)
    stats = ProduceStats()
    send, receive = trio.open_memory_channel[list[bytes]](2)
    async with trio.open_nursery() as nursery:
        # the reader calls read1 only
        nursery.start_soon(lambda: read_stream(cast(BinaryIO, stream), send, stats, max_lines=100))
        await trio.sleep(0.5)  # real time: the reader thread runs as far as it can
        assert stream.reads == 1  # one chunk read, its third batch waits for room
        assert receive.statistics().current_buffer_used == 2
        got = 0
        with trio.fail_after(60):
            async for batch in receive:
                got += len(batch)
                assert len(batch) <= 100
    assert got == stats.lines_read == 20 * 32 * 1024
    assert stats.input_done


async def test_not_replicated_sends_fail_the_command(tcp_cluster):
    # a SYNC_MASTER without a slave answers SLAVE_NOT_AVAILABLE: stored, not replicated
    ns = tcp_cluster.namesrv
    sync_master = dict(broker_name="broker-s", store=dict(broker_role="SYNC_MASTER"))
    await tcp_cluster.start_broker("broker-s", **sync_master)
    await tcp_cluster.create_topic("Lonely", 2, nodes=("broker-s",))

    async def run(*args: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
        with trio.fail_after(60):
            return await trio.run_process(
                rmq_process(ns, "-t", "Lonely", *args),
                stdin=stdin,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                cwd=ROOT,
                env={**os.environ, "COLUMNS": "200"},
            )

    failed = await run(stdin=b"a\nb\nc\n")
    assert failed.returncode == 1, failed.stderr
    err = failed.stderr.decode().splitlines()
    assert len(err) == 1 and err[0].startswith("error: 3 of 3 message(s)"), err
    assert "SLAVE_NOT_AVAILABLE 3" in err[0] and "--allow-not-replicated" in err[0]
    assert "(SLAVE_NOT_AVAILABLE 3)" in failed.stdout.decode().splitlines()[-1]  # summary

    allowed = await run("--allow-not-replicated", "one", stdin=b"")
    assert allowed.returncode == 0 and allowed.stderr == b"", allowed.stderr
    assert allowed.stdout.decode().startswith("SLAVE_NOT_AVAILABLE msgId=")
    stored = sorted(b for q in (await read_topic(ns, "Lonely")).values() for b in q)
    assert stored == [b"a", b"b", b"c", b"one"]


async def test_ctrl_c_stops_reading_sends_what_was_read_and_exits_cleanly(tcp_cluster):
    # `tail -f log | rmq produce`: the input never ends, Ctrl-C does; the reader thread is
    # still blocked in its read then, which must not abort the interpreter at exit
    namesrv = tcp_cluster.namesrv
    await tcp_cluster.create_topic("Interrupted", 2)
    proc = await trio.lowlevel.open_process(
        rmq_process(namesrv, "-t", "Interrupted"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        await proc.stdin.send_all(b"one\ntwo\n")
        with trio.fail_after(60):
            while True:
                stored = await read_topic(namesrv, "Interrupted")
                if sum(len(q) for q in stored.values()) == 2:
                    break
                await trio.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        with trio.fail_after(30):
            out = err = b""
            while chunk := await proc.stdout.receive_some():
                out += chunk
            while chunk := await proc.stderr.receive_some():
                err += chunk
            code = await proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            await proc.wait()
    assert code == 130, err  # Ctrl-C's status, once what was read is sent and reported
    assert b"Fatal Python error" not in err and b"Traceback" not in err, err
    assert out.decode().splitlines()[-1].startswith("sent 2 message(s) to Interrupted")


async def test_delayed_lines_are_sent_one_by_one_in_input_order(memory_cluster):
    # RocketMQ refuses delayed messages in a batch: each line is its own SEND_MESSAGE (the
    # in-memory cluster, on the real clock: the reader is a worker thread)
    await memory_cluster.create_topic("Later", 2)
    tap = memory_cluster.tap()
    results: list[SendResult] = []
    data = b"".join(b"%d\n" % i for i in range(50))
    with trio.fail_after(30):
        async with open_remoting_client(network=tap) as remoting:
            stats = await produce(
                memory_cluster.namesrv,
                MessageTemplate("Later", delay_level=3),
                group="pg",
                stream=cast(BinaryIO, Trickle(data, 7)),  # produce reads with read1 only
                on_results=results.extend,
                handle_signals=False,
                remoting=remoting,
            )
    assert stats.sent == 50 and len(results) == 50
    sends = tap.requests(RequestCode.SEND_MESSAGE_V2)
    assert len(sends) == 50 and tap.requests(RequestCode.SEND_BATCH_MESSAGE) == []
    assert sorted(int(r.body_bytes()) for r in sends) == list(range(50))
    for q in ("0", "1"):  # each queue got its lines in input order
        lines = [int(r.body_bytes()) for r in sends if r.ext_fields["e"] == q]
        assert lines == sorted(lines) and lines
    for qid in (0, 1):
        offsets = [r.queue_offset for r in results if r.message_queue.queueId == qid]
        assert offsets == sorted(offsets) and offsets
