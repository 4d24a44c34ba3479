"""The port blocks tests and the chaos harness draw for their processes (cli.chaos.port_blocks)."""

from __future__ import annotations

from cli.chaos.port_blocks import ephemeral_range, free_port_block


def test_blocks_drawn_back_to_back_never_overlap():
    # Every block is drawn before anything binds it, so only the record of what was handed out
    # keeps a slave's block off its master's.
    # 150 draws of 13 ports from ~1,700 bases would overlap with near certainty at random.
    taken: set[int] = set()
    low, high = ephemeral_range()
    for _ in range(150):
        base = free_port_block(10)
        span = set(range(base - 2, base + 11))
        assert not span & taken, base
        assert all(not low <= p <= high for p in span)
        taken |= span


def _draw_blocks(n: int) -> list[int]:
    return [free_port_block(10) for _ in range(n)]


def test_blocks_drawn_by_two_processes_at_once_never_overlap():
    # Parallel test workers are separate processes: the registry file, not a process's memory,
    # keeps their blocks apart.
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(2) as pool:
        a, b = pool.map(_draw_blocks, [60, 60])
    spans = [set(range(base - 2, base + 11)) for base in a + b]
    for i, s in enumerate(spans):
        for other in spans[i + 1 :]:
            assert not s & other
