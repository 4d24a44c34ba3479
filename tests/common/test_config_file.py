"""WriteBehind: snapshots written off the loop, newest wins, durability awaited, failures retried.

Real threads and real files: no autojump clock here (the clock could jump while a thread writes).
"""

from __future__ import annotations

import threading
from pathlib import Path

import trio

from common.config_file import WriteBehind, atomic_write


def test_without_a_run_task_submit_writes_at_once(tmp_path: Path) -> None:
    w = WriteBehind()
    gen = w.submit(tmp_path / "a" / "t.json", b"one")
    assert (tmp_path / "a" / "t.json").read_bytes() == b"one"
    assert w.durable[tmp_path / "a" / "t.json"] == gen
    assert w.pending(tmp_path / "a" / "t.json") is None


async def test_newest_snapshot_wins_and_durability_is_awaited(tmp_path: Path) -> None:
    gate = threading.Event()
    writes: list[bytes] = []

    def slow_write(path: Path, data: bytes) -> None:
        gate.wait(10)
        writes.append(data)
        atomic_write(path, data)

    w = WriteBehind(write=slow_write)
    path = tmp_path / "t.json"
    async with trio.open_nursery() as n:
        await n.start(w.run)
        first = w.submit(path, b"v1")
        await trio.sleep(0.05)  # the writer has taken v1 and is stuck in the thread
        w.submit(path, b"v2")
        last = w.submit(path, b"v3")  # replaces v2, which is never written on its own
        assert w.pending(path) == last
        done = trio.Event()

        async def waiter() -> None:
            await w.wait_durable(path, first + 1)  # v2's generation: satisfied by v3
            done.set()

        n.start_soon(waiter)
        await trio.sleep(0.1)
        assert not done.is_set() and not path.exists()  # nothing is durable yet
        gate.set()
        with trio.fail_after(5):
            await done.wait()
        assert path.read_bytes() == b"v3"
        assert writes == [b"v1", b"v3"]
        assert w.pending(path) is None and w.durable[path] == last
        n.cancel_scope.cancel()


async def test_failed_write_is_retried_until_it_succeeds(tmp_path: Path) -> None:
    blocker = tmp_path / "config"
    blocker.write_text("a file where the directory should be")
    path = blocker / "t.json"
    w = WriteBehind(retry_interval=0.05)
    async with trio.open_nursery() as n:
        await n.start(w.run)
        gen = w.submit(path, b"data")
        with trio.fail_after(5):
            while w.failures == 0:  # noqa: ASYNC110 - the writer counts in its own task
                await trio.sleep(0.01)
        assert w.pending(path) == gen  # still waiting, not dropped
        blocker.unlink()  # the disk recovers
        with trio.fail_after(5):
            await w.wait_durable(path, gen)
        assert path.read_bytes() == b"data"
        n.cancel_scope.cancel()
