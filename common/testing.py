"""Helpers shared by the tests of several packages (test modules cannot import each other).

Ports for servers a test starts as separate processes: those processes bind fixed ports the
test chooses beforehand, so a chosen port must stay free until they bind it. Ports inside the
kernel's ephemeral range (`net.ipv4.ip_local_port_range`, 32768-60999 by default) can be taken
at any moment by an outgoing connection of any process on the machine (seen in CI: a broker's
port grabbed between the check and the bind), so blocks are drawn only outside that range.
"""

from __future__ import annotations

import os
import random
import socket
import time

_LOW = 20000  # below: well-known and registered services


def ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(width: int = 10) -> int:
    """A base port B such that B-2 .. B+width are all free now and outside the ephemeral range
    (a broker needs B-2 for its VIP channel and B+1 for HA). Drawn at random so concurrent test
    runs rarely collide."""
    low, high = ephemeral_range()
    spans = [(lo, hi) for lo, hi in ((_LOW, low - 1), (high + 1, 65535)) if hi - lo > width + 12]
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(500):
        lo, hi = rng.choice(spans)
        base = rng.randrange(lo + 2, hi - width, 10)
        if all(_bindable(p) for p in range(base - 2, base + width + 1)):
            return base
    raise RuntimeError("no free block of loopback ports outside the ephemeral range")
