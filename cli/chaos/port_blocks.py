"""Blocks of loopback ports for servers started as separate processes.

Those processes bind fixed ports chosen beforehand, so a chosen block must stay free until they
bind it. Ports inside the kernel's ephemeral range (`net.ipv4.ip_local_port_range`, 32768-60999
by default) can be taken at any moment by an outgoing connection of any process on the machine,
so blocks are drawn only outside that range.

A block is drawn before anything binds it, so two draws made back to back (a master's and its
slave's, or two test workers starting clusters at once) could return overlapping blocks and the
loser would die of EADDRINUSE. Every draw is therefore recorded in a registry file shared by the
processes of this machine (the chaos harness, parallel test workers, a second test run), under
an exclusive lock: a block handed out in the last five minutes, by any of them, overlaps no new one.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
import time
from pathlib import Path

_LOW = 20000  # below: well-known and registered services
# How long a drawn block is kept from other draws: a test's whole time limit (pytest-timeout,
# 300 s), since a test may kill a server and start it again on the same ports, and between the
# two the ports are free. Longer would only fill the registry: the ~17,000 ports outside the
# ephemeral range hold about 1,300 blocks, and a full suite draws several hundred.
_ISSUED_FOR = 300.0
# An entry further ahead of now than the reservation plus this came from a clock that jumped.
# Without the slack a fresh entry read at once by another process, on a clock stepped back a
# little since it was written, would be dropped and its block handed out twice.
_CLOCK_SLACK = 60.0


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


def registry_path() -> Path:
    return Path(tempfile.gettempdir()) / f"trio-rmq-port-blocks-{os.geteuid()}"


def _read_registry(fd: int, now: float) -> dict[int, float]:
    """port -> wall-clock time until which it stays reserved. Wall clock, not monotonic: the
    file outlives processes and boots, and an entry from a clock that jumped (further ahead of
    now than the reservation and its slack) is dropped rather than trusted. Times are written
    exactly (repr): one rounded up would read as more than the reservation ahead."""
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    issued: dict[int, float] = {}
    for line in b"".join(chunks).decode("ascii", "replace").splitlines():
        try:
            port_text, until_text = line.split()
            port, until = int(port_text), float(until_text)
        except ValueError:
            continue
        if now < until <= now + _ISSUED_FOR + _CLOCK_SLACK:
            issued[port] = until
    return issued


def _write_registry(fd: int, issued: dict[int, float]) -> None:
    data = "".join(f"{port} {until!r}\n" for port, until in issued.items()).encode()
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, data)


def free_port_block(width: int = 10, *, registry: Path | None = None) -> int:
    """A base port B such that B-2 .. B+width are all free now, outside the ephemeral range
    (a broker needs B-2 for its VIP channel and B+1 for HA), and overlap no block any process of
    this user drew in the last five minutes (recorded in ``registry``, by default the one every
    process of this user shares). Drawn at random, so the search is short."""
    low, high = ephemeral_range()
    spans = [(lo, hi) for lo, hi in ((_LOW, low - 1), (high + 1, 65535)) if hi - lo > width + 12]
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    fd = os.open(registry or registry_path(), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        now = time.time()
        issued = _read_registry(fd, now)
        for _ in range(500):
            lo, hi = rng.choice(spans)
            base = rng.randrange(lo + 2, hi - width, 10)
            span = range(base - 2, base + width + 1)
            if not any(p in issued for p in span) and all(_bindable(p) for p in span):
                issued.update(dict.fromkeys(span, now + _ISSUED_FOR))
                _write_registry(fd, issued)
                return base
    finally:
        os.close(fd)  # releases the lock
    raise RuntimeError("no free block of loopback ports outside the ephemeral range")
