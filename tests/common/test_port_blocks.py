"""The port blocks tests and the chaos harness draw for their processes (common.testing)."""

from __future__ import annotations

from common.testing import ephemeral_range, free_port_block


def test_blocks_drawn_back_to_back_never_overlap():
    # Every block is drawn before anything binds it, so only memory of what was handed out
    # keeps a slave's block off its master's (CI once lost a test to EADDRINUSE that way).
    # 150 draws of 13 ports from ~1,700 bases would overlap with near certainty at random.
    taken: set[int] = set()
    low, high = ephemeral_range()
    for _ in range(150):
        base = free_port_block(10)
        span = set(range(base - 2, base + 11))
        assert not span & taken, base
        assert all(not low <= p <= high for p in span)
        taken |= span
