"""The page warmer reads ahead of the writer, never changes a byte, and stops cleanly."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import trio

from broker.store.mapped_file import PAGE_SIZE, MappedFile
from broker.store.page_warmer import _Warmer, run_page_warmer

MiB = 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
PROT_READ, MAP_SHARED = 1, 1


def resident(path: str, start: int, end: int) -> int:
    """How many pages of [start, end) are in the page cache (mincore on a fresh mapping)."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, PROT_READ, MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value)
        try:
            n = (end - start) // PAGE_SIZE
            vec = ctypes.create_string_buffer(n)
            assert _libc.mincore(addr + start, end - start, vec) == 0, ctypes.get_errno()
            return sum(b & 1 for b in vec.raw)
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def segment(tmp_path: Path, size: int = 16 * MiB) -> MappedFile:
    return MappedFile(str(tmp_path / "00000000000000000000"), 0, size)


def drop_cache(mf: MappedFile) -> None:
    os.posix_fadvise(mf.fileno(), 0, mf.file_size, os.POSIX_FADV_DONTNEED)


def test_pages_ahead_of_the_writer_are_warmed_and_nothing_changes(tmp_path: Path) -> None:
    mf = segment(tmp_path)
    data = os.urandom(MiB + 100)
    mf.append(data)
    drop_cache(mf)  # only clean pages go; the written MiB was not flushed, it may stay
    ahead = 4 * MiB
    assert resident(mf.path, 2 * MiB, 6 * MiB) == 0
    w = _Warmer(lambda: mf, ahead, 0.001)
    assert w._step()
    # the window from the writer's page on is in the page cache now (whole 1 MiB reads)
    assert resident(mf.path, MiB, 5 * MiB) == 4 * MiB // PAGE_SIZE
    assert not w._step()  # nothing more to do until the writer moves
    assert bytes(mf.view[: len(data)]) == data
    assert os.pread(mf.fileno(), 8 * MiB, len(data)) == bytes(8 * MiB)
    w.stop.set()
    w.run()  # returns at once and closes its descriptor
    assert w._fd == -1


def test_a_writer_that_catches_up_is_left_the_near_half(tmp_path: Path) -> None:
    mf = segment(tmp_path)
    w = _Warmer(lambda: mf, 8 * MiB, 0.001)
    assert w._step()
    assert w._warmed == 8 * MiB
    mf.wrote = 8 * MiB - 10  # the writer is inside the last warmed chunk
    assert w._step()
    # warmed from half a window past the writer's page up to a window past the writer
    assert w._warmed == 16 * MiB - PAGE_SIZE
    # (the writer's half may be resident too: the kernel reads ahead of sequential reads)
    assert resident(mf.path, 12 * MiB - PAGE_SIZE, 16 * MiB - PAGE_SIZE) == 4 * MiB // PAGE_SIZE


def test_full_missing_and_closed_segments_are_skipped(tmp_path: Path) -> None:
    current: list[MappedFile | None] = [None]
    w = _Warmer(lambda: current[0], 4 * MiB, 0.001)
    assert not w._step()
    mf = segment(tmp_path, 4 * MiB)
    mf.wrote = mf.file_size
    current[0] = mf
    assert not w._step()  # full: nothing ahead of it
    other = MappedFile(str(tmp_path / "00000000000004194304"), 4 * MiB, 4 * MiB)
    other.close()
    current[0] = other
    assert not w._step()  # closed under us: no descriptor to dup
    fresh = MappedFile(str(tmp_path / "00000000000008388608"), 8 * MiB, 8 * MiB)
    current[0] = fresh
    assert w._step()  # a new segment is picked up
    w.stop.set()
    w.run()


async def test_the_task_runs_a_thread_until_cancelled(tmp_path: Path) -> None:
    mf = segment(tmp_path)

    def warmers() -> int:
        return sum(t.name == "page-warmer" for t in threading.enumerate())

    before = warmers()
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            await nursery.start(run_page_warmer, lambda: mf)
            assert warmers() == before + 1
            for _ in range(500):
                if resident(mf.path, 0, 4 * MiB) == 4 * MiB // PAGE_SIZE:
                    break
                await trio.sleep(0.01)
            assert resident(mf.path, 0, 4 * MiB) == 4 * MiB // PAGE_SIZE
            scope.cancel()
    assert warmers() == before  # joined, not left running
    assert os.pread(mf.fileno(), 16 * MiB, 0) == bytes(16 * MiB)


def test_an_idle_warmer_looks_less_and_less_often_and_a_busy_step_resets_it() -> None:
    # every look takes the GIL from the event loop: idle looks back off from 5 ms to 50 ms
    busy = iter([False, False, False, False, False, False, True, False, False])
    waits: list[float] = []
    w = _Warmer(lambda: None, 32 * MiB, 0.005, 0.05)
    w._step = lambda: next(busy)  # type: ignore[method-assign]

    def wait(timeout: float | None = None) -> bool:
        waits.append(timeout or 0.0)
        if len(waits) == 8:
            w.stop.set()
        return w.stop.is_set()

    w.stop.wait = wait  # type: ignore[method-assign]
    w.run()
    assert waits == [0.005, 0.01, 0.02, 0.04, 0.05, 0.05, 0.005, 0.01]
