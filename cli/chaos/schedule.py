"""The chaos harness's schedules: which faults, on which nodes, when, drawn from a seed.

Pure (no I/O): :func:`draw` turns ``(seed, mode, count, kinds)`` into a list of
:class:`PlannedFault`, and run.py carries them out one after another.  Drawing the whole
schedule first lets a test see which kinds a seed brings without starting a process
(``tests/chaos/test_schedules.py`` checks that the short form meets every kind).

The kinds, and where each may strike (nodes are named as cluster.py names them):

=============  ================================================================================
``kill``       SIGKILL, then a restart on the same store; any node, the nameserver too
``pause``      SIGSTOP, then SIGCONT; any node
``partition``  a broker's replication links refuse and drop every connection (link_proxy.py)
``delay``      the links between two brokers add latency with jitter, in order
``drop``       the links between two brokers lose chunks: stalls and connection resets
``slow_disk``  a broker's fsync, fdatasync, msync and sync_file_range sleep (disk.py)
``full_disk``  a broker's posix_fallocate fails with ENOSPC and statvfs reads 95% used
``torn``       SIGKILL, the tail of the newest segment zeroed or garbled, then a restart
=============  ================================================================================

``torn`` strikes only where the mode promises to survive a power cut (docs/guarantees.md): a
master in ASYNC_FLUSH loses its unflushed tail by design, so in ``sync`` and ``async`` only the
slave is torn, whose tail the master still holds; in ``dledger`` any member, whose tail the
leader (or the new leader, which has every committed entry) sends again.

Each fault is held ``U(1.0, 2.5)`` s after a pause of ``U(0.5, 1.5)`` s; the draws are made in
a fixed order (pause, kind, node, hold, then the kind's parameters), so a seed always names the
same schedule.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

FAULT_KINDS = ("kill", "pause", "partition", "delay", "drop", "slow_disk", "full_disk", "torn")
# the link faults act on the proxies between two brokers
LINK_KINDS = frozenset({"delay", "drop"})
DISK_KINDS = frozenset({"slow_disk", "full_disk"})

_BROKERS = {
    "sync": ("master", "slave"),
    "async": ("master", "slave"),
    "dledger": ("n0", "n1", "n2"),
}


def brokers_of(mode: str) -> tuple[str, ...]:
    return _BROKERS[mode]


def nodes_of(mode: str) -> tuple[str, ...]:
    return ("namesrv", *_BROKERS[mode])


def parse_kinds(text: str) -> tuple[str, ...]:
    """``"kill,torn"`` -> the kinds in FAULT_KINDS order; ``"all"`` or "" -> every kind.
    ValueError naming an unknown one."""
    wanted = {k.strip() for k in text.split(",") if k.strip()}
    if not wanted or wanted == {"all"}:
        return FAULT_KINDS
    unknown = wanted - set(FAULT_KINDS)
    if unknown:
        raise ValueError(
            f"unknown fault kind {', '.join(sorted(unknown))}: expected {', '.join(FAULT_KINDS)}"
        )
    return tuple(k for k in FAULT_KINDS if k in wanted)


@attrs.frozen
class PlannedFault:
    kind: str
    node: str  # the node it strikes; for a link fault the first of the two
    peer: str | None  # the link fault's other end
    wait: float  # seconds after the previous fault ended
    hold: float  # seconds before it is ended
    delay: float = 0.0  # delay: added latency per chunk; slow_disk: per sync call
    jitter: float = 0.0  # delay: U(0, jitter) more
    loss: float = 0.0  # drop: probability a chunk is lost
    reset: float = 0.0  # drop: probability a loss resets the connection
    tear_bytes: int = 0  # torn: bytes damaged at the end of the written part
    tear_fill: str = ""  # torn: zero or garbage
    seed: int = 0  # the link's or the garbage's own random draws

    @property
    def label(self) -> str:
        """The node the checker names: ``n0`` or, for a link, ``n0-n2``."""
        return self.node if self.peer is None else f"{self.node}-{self.peer}"


def eligible(kind: str, mode: str) -> tuple[str, ...]:
    """The nodes ``kind`` may strike in ``mode`` (module docstring)."""
    if kind in ("kill", "pause"):
        return nodes_of(mode)
    if kind == "torn" and mode != "dledger":
        return ("slave",)
    return brokers_of(mode)


def draw(
    seed: int, mode: str, count: int, kinds: Sequence[str] = FAULT_KINDS
) -> list[PlannedFault]:
    """The schedule of ``seed``: ``count`` faults of the given kinds."""
    rng = random.Random(seed)
    plan = []
    for _ in range(count):
        wait = rng.uniform(0.5, 1.5)
        kind = rng.choice(list(kinds))
        node = rng.choice(eligible(kind, mode))
        hold = rng.uniform(1.0, 2.5)
        fault = PlannedFault(kind, node, None, wait, hold)
        if kind in LINK_KINDS:
            peer = rng.choice([b for b in brokers_of(mode) if b != node])
            fault = attrs.evolve(fault, peer=peer, seed=rng.getrandbits(32))
        if kind == "delay":
            latency = rng.uniform(0.02, 0.2)
            fault = attrs.evolve(fault, delay=latency, jitter=latency / 2)
        elif kind == "drop":
            fault = attrs.evolve(fault, loss=rng.uniform(0.05, 0.3), reset=0.25)
        elif kind == "slow_disk":
            fault = attrs.evolve(fault, delay=rng.uniform(0.05, 0.5))
        elif kind == "torn":
            fill = rng.choice(("zero", "garbage"))
            fault = attrs.evolve(
                fault, tear_bytes=rng.randint(1, 16384), tear_fill=fill, seed=rng.getrandbits(32)
            )
        plan.append(fault)
    return plan
