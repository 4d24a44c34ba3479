"""The port blocks tests and the chaos harness draw for their processes (cli.chaos.port_blocks).

Each test keeps its own registry, so its hundreds of draws do not fill the one the rest of the
suite shares for five minutes."""

from __future__ import annotations

from pathlib import Path

from cli.chaos import port_blocks
from cli.chaos.port_blocks import ephemeral_range, free_port_block


def test_blocks_drawn_back_to_back_never_overlap(tmp_path: Path) -> None:
    # Every block is drawn before anything binds it, so only the record of what was handed out
    # keeps a slave's block off its master's.
    # 120 draws of 13 ports from ~1,700 bases would overlap with near certainty at random.
    taken: set[int] = set()
    low, high = ephemeral_range()
    for _ in range(120):
        base = free_port_block(10, registry=tmp_path / "blocks")
        span = set(range(base - 2, base + 11))
        assert not span & taken, base
        assert all(not low <= p <= high for p in span)
        taken |= span


def _draw_blocks(registry: Path) -> list[int]:
    return [free_port_block(10, registry=registry) for _ in range(60)]


def test_blocks_drawn_by_two_processes_at_once_never_overlap(tmp_path: Path) -> None:
    # Parallel test workers are separate processes: the registry file, not a process's memory,
    # keeps their blocks apart.
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(2) as pool:
        a, b = pool.map(_draw_blocks, [tmp_path / "blocks"] * 2)
    spans = [set(range(base - 2, base + 11)) for base in a + b]
    for i, s in enumerate(spans):
        for other in spans[i + 1 :]:
            assert not s & other


def test_a_block_just_drawn_is_still_reserved_when_read_at_once(tmp_path: Path) -> None:
    # Another process reads the registry right after a draw, on a clock a hair behind the
    # writer's: the fresh entry must count, however its time was written.
    import os

    fd = os.open(tmp_path / "blocks", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        drawn_at = 1_000_000.000_6
        port_blocks._write_registry(fd, {22_000: drawn_at + port_blocks._ISSUED_FOR})
        assert 22_000 in port_blocks._read_registry(fd, drawn_at - 0.000_5)
        assert 22_000 not in port_blocks._read_registry(fd, drawn_at + port_blocks._ISSUED_FOR)
    finally:
        os.close(fd)
