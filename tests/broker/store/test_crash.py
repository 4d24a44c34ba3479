"""kill -9 at random moments never loses a SYNC_FLUSH-acknowledged message (crash_writer.py).

Each round starts the writer on the same store directory (so each start also recovers from the
previous kill), lets it run for a random time, and SIGKILLs it by pid; some rounds kill it while
it is still starting/recovering.  At the end the store is opened in-process and every
acknowledged message must be readable at its physical offset with the right queue, queue offset
and body, and every queue must serve only decodable, CRC-valid records with consecutive offsets.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import IO

import pytest
import trio

from broker.store import GetMessageStatus, MessageStoreConfig, run_message_store
from common.message import decode_records

WRITER = Path(__file__).with_name("crash_writer.py")
ROUNDS = 22
TOPIC = "CrashT"


def run_round(
    root: Path, seed: int, kill_after: float, wait_ready: bool, log: IO[bytes]
) -> list[str]:
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(root), str(seed)],
        stdout=subprocess.PIPE,
        stderr=log,
        cwd=str(Path(__file__).parents[3]),
    )
    out = proc.stdout
    assert out is not None
    lines: list[str] = []
    ready = threading.Event()

    def reader():
        for raw in out:
            line = raw.decode()
            if not line.endswith("\n"):
                break  # a line cut by the kill was never fully acknowledged to anyone
            if line == "ready\n":
                ready.set()
            else:
                lines.append(line)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        if wait_ready:
            assert ready.wait(60), "writer did not start"
        time.sleep(kill_after)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        t.join(10)
        out.close()
    return lines


@pytest.mark.slow
def test_kill9_never_loses_acknowledged_messages(tmp_path):
    root = tmp_path / "store"
    rng = random.Random(20240611)
    acked: dict[int, tuple[int, int, int, int]] = {}
    with open(tmp_path / "writer.log", "wb") as log:
        for r in range(ROUNDS):
            wait_ready = r == 0 or rng.random() > 0.15
            kill_after = rng.uniform(0.05, 0.5) if wait_ready else rng.uniform(0.0, 0.6)
            for line in run_round(root, r + 1, kill_after, wait_ready, log):
                _, qid, qoff, phys, n, crc = line.split()
                acked[int(phys)] = (int(qid), int(qoff), int(n), int(crc))
    assert len(acked) > 100, "the writer acknowledged too little to test anything"
    trio.run(check_store, root, acked)


def writer_config() -> dict:
    # test modules cannot import each other (importlib mode): load the writer's config by path
    spec = importlib.util.spec_from_file_location("crash_writer", WRITER)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CONFIG


async def check_store(root: Path, acked: dict[int, tuple[int, int, int, int]]) -> None:
    cfg = MessageStoreConfig(store_path_root_dir=str(root), **writer_config())
    async with trio.open_nursery() as nursery:
        store = await nursery.start(run_message_store, cfg)
        for phys, (qid, qoff, n, crc) in sorted(acked.items()):
            m = store.look_message_by_offset(phys)
            assert m is not None, f"acknowledged message at {phys} is gone"
            assert (m.topic, m.queue_id, m.queue_offset) == (TOPIC, qid, qoff), phys
            assert m.commit_log_offset == phys
            assert (len(m.body), zlib.crc32(m.body)) == (n, crc), phys
            assert store.get_commit_log_offset_in_queue(TOPIC, qid, qoff) == phys
        for qid in range(3):
            off, seen = 0, 0
            while True:
                r = store.get_message("g", TOPIC, qid, off, 32)
                if r.status is not GetMessageStatus.FOUND:
                    assert r.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
                    break
                recs = decode_records(b"".join(bytes(b) for b in r.buffers), check_crc=True)
                assert [x.queue_offset for x in recs] == list(range(off, off + len(recs)))
                assert all(x.queue_id == qid and x.body[:1].isdigit() for x in recs)
                seen += len(recs)
                off = r.next_begin_offset
            assert seen == store.get_max_offset_in_queue(TOPIC, qid)
        nursery.cancel_scope.cancel()
