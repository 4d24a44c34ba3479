"""A pure, seeded model of the network between DLedger members, for the simulator.

Theory of operation
-------------------
The model only decides *when* (or whether) a message sent now arrives; the simulator keeps
the event queue.  Messages travel on directed channels ``(src, dst, stream)``: ``stream`` is
"req" for ``src``'s requests to ``dst`` and "resp" for ``src``'s answers to ``dst``'s requests,
as a TCP connection carries them.  Each message gets a random delay (usually short, sometimes
long), may be lost, and -- when the profile is not FIFO -- may overtake earlier messages or be
delivered twice.

With ``fifo`` (the default, what TCP gives DLedger's transport) a channel delivers in send
order: a message never arrives before one sent earlier on the same channel.  Losing a message
breaks its connection, as a TCP reset does: everything still in flight on that channel is lost
too, and later messages travel on a new connection.  Partitions and crashes break connections
the same way (:meth:`SimNetwork.break_channels`).  Every in-flight message carries its channel's
*epoch*; the simulator drops a message whose epoch is no longer current when it arrives.

Invariants
* with ``fifo``, deliveries on one channel and epoch are in send order;
* no message crosses a cut pair: it is dropped at send, and a cut breaks the channels.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import attrs

__all__ = ["Channel", "NetworkProfile", "SimNetwork"]

# (src, dst, stream): stream is "req" or "resp"
Channel = tuple[str, str, str]


@attrs.frozen
class NetworkProfile:
    """How messages behave; times in seconds."""

    min_delay: float = 0.0005
    max_delay: float = 0.005
    # a message is slow with this probability: up to ``slow_delay``
    slow_probability: float = 0.02
    slow_delay: float = 0.1
    loss: float = 0.0
    # deliver a second copy (only without ``fifo``: TCP does not duplicate)
    duplicate: float = 0.0
    fifo: bool = True


@attrs.define(eq=False)
class SimNetwork:
    rng: random.Random
    profile: NetworkProfile = NetworkProfile()
    # unordered pairs that cannot talk, as (smaller id, larger id)
    _cut: set[tuple[str, str]] = attrs.field(factory=set)
    # channel -> current connection number; in-flight messages of older epochs are lost
    _epoch: dict[Channel, int] = attrs.field(factory=dict)
    # channel -> latest delivery time scheduled on it in the current epoch (fifo)
    _last: dict[Channel, float] = attrs.field(factory=dict)

    @staticmethod
    def _pair(a: str, b: str) -> tuple[str, str]:
        return (a, b) if a < b else (b, a)

    def connected(self, a: str, b: str) -> bool:
        return not self._cut or self._pair(a, b) not in self._cut

    def epoch(self, channel: Channel) -> int:
        return self._epoch.get(channel, 0)

    def alive(self, channel: Channel, epoch: int) -> bool:
        """Whether a message sent in ``epoch`` on ``channel`` may still arrive."""
        return self._epoch.get(channel, 0) == epoch and self.connected(channel[0], channel[1])

    def _break(self, channel: Channel) -> None:
        self._epoch[channel] = self._epoch.get(channel, 0) + 1
        self._last.pop(channel, None)

    def break_channels(self, a: str, b: str) -> None:
        """Reset every connection between ``a`` and ``b`` (both directions, both streams)."""
        for src, dst in ((a, b), (b, a)):
            for stream in ("req", "resp"):
                self._break((src, dst, stream))

    def partition(self, groups: Iterable[Iterable[str]]) -> None:
        """Cut every pair of members that are in different groups (on top of existing cuts)."""
        sets = [sorted(g) for g in groups]
        for i, left in enumerate(sets):
            for right in sets[i + 1 :]:
                for a in left:
                    for b in right:
                        self._cut.add(self._pair(a, b))
                        self.break_channels(a, b)

    def heal(self) -> None:
        self._cut.clear()

    def cut_pairs(self) -> set[tuple[str, str]]:
        return set(self._cut)

    def _delay(self) -> float:
        p = self.profile
        if p.slow_probability and self.rng.random() < p.slow_probability:
            return self.rng.uniform(p.max_delay, max(p.max_delay, p.slow_delay))
        return self.rng.uniform(p.min_delay, p.max_delay)

    def transmit(self, now: float, channel: Channel) -> list[tuple[float, int]]:
        """Send one message on ``channel`` at ``now``: its arrival times (none when lost, two
        when duplicated) with the epoch to check on arrival."""
        p = self.profile
        if not self.connected(channel[0], channel[1]):
            return []
        if p.loss and self.rng.random() < p.loss:
            if p.fifo:
                self._break(channel)
            return []
        epoch = self._epoch.get(channel, 0)
        at = now + self._delay()
        if p.fifo:
            at = max(at, self._last.get(channel, at))
            self._last[channel] = at
            return [(at, epoch)]
        arrivals = [(at, epoch)]
        if p.duplicate and self.rng.random() < p.duplicate:
            arrivals.append((now + self._delay(), epoch))
        return arrivals
