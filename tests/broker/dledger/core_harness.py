"""A tiny synchronous driver for RaftCore unit tests: every Send is delivered at once (or
refused, when the pair is cut), answers go straight back, time moves only when told."""

from __future__ import annotations

import collections
import random
from typing import Any

import attrs

from broker.dledger.raft.core import (
    Action,
    AppendDone,
    Committed,
    CoreConfig,
    PersistState,
    RaftCore,
    RoleChanged,
    Send,
    TransferDone,
)
from broker.dledger.raft.log import MemoryLog, RaftLog
from broker.dledger.raft.member_state import HardState
from broker.dledger.raft.messages import PushEntryRequest, PushType, Request, Role

FAST = {
    "heart_beat_time_interval_ms": 200,
    "max_heart_beat_leak": 3,
    "min_vote_interval_ms": 30,
    "max_vote_interval_ms": 100,
    "max_wait_ack_time_ms": 250,
    "max_push_time_out_ms": 100,
    "leadership_transfer_wait_timeout_ms": 100,
}


def config(self_id: str = "n0", n: int = 3, **overrides: object) -> CoreConfig:
    peers = tuple(f"n{i}" for i in range(n))
    fields: dict[str, object] = {**FAST, **overrides}
    return CoreConfig("g", self_id, peers, **fields)  # type: ignore[arg-type]


def core(
    self_id: str = "n0",
    n: int = 3,
    *,
    log: RaftLog | None = None,
    state: HardState | None = None,
    now: float = 0.0,
    committed: int = -1,
    **overrides: Any,
) -> RaftCore:
    return RaftCore(
        config(self_id, n, **overrides),
        log if log is not None else MemoryLog(),
        state if state is not None else HardState(),
        rng=random.Random(f"{self_id}/{n}"),  # members must not draw the same vote delays
        now=now,
        committed_index=committed,
    )


def log_of(*terms: int) -> MemoryLog:
    log = MemoryLog()
    for term in terms:
        log.append(term, b"x%d" % log.end_index)
    return log


@attrs.define(eq=False)
class Cluster:
    cores: dict[str, RaftCore]
    now: float = 0.0
    # unordered pairs whose messages are refused
    cut: set[frozenset[str]] = attrs.field(factory=set)
    # every (from, to, request) delivered or refused, in order
    sent: list[tuple[str, str, Request]] = attrs.field(factory=list)
    # every action executed, by member
    actions: dict[str, list[Action]] = attrs.field(factory=lambda: collections.defaultdict(list))
    persisted: dict[str, HardState] = attrs.field(factory=dict)
    _queue: collections.deque[tuple[str, Send]] = attrs.field(factory=collections.deque)

    @classmethod
    def of(cls, n: int = 3, **overrides: Any) -> Cluster:
        return cls({f"n{i}": core(f"n{i}", n, **overrides) for i in range(n)})

    def absorb(self, member: str, actions: list[Action]) -> None:
        for action in actions:
            self.actions[member].append(action)
            if isinstance(action, Send):
                self._queue.append((member, action))
            elif isinstance(action, PersistState):
                self.persisted[member] = action.state

    def deliver(self) -> None:
        while self._queue:
            src, send = self._queue.popleft()
            self.sent.append((src, send.to, send.request))
            if frozenset((src, send.to)) in self.cut:
                self.absorb(src, self.cores[src].handle_failure(send.request, self.now))
                continue
            actions, response = self.cores[send.to].handle_request(send.request, self.now)
            self.absorb(send.to, actions)
            self.absorb(src, self.cores[src].handle_response(send.request, response, self.now))

    def advance(self, seconds: float, step: float = 0.005) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + step)
            for member, c in self.cores.items():
                if c.next_deadline() <= self.now:
                    self.absorb(member, c.tick(self.now))
            self.deliver()

    def leader(self) -> str | None:
        found = [m for m, c in self.cores.items() if c.role is Role.LEADER]
        return found[0] if len(found) == 1 else None

    def elect(self, limit: float = 5.0) -> str:
        waited = 0.0
        while self.leader() is None and waited < limit:
            self.advance(0.05)
            waited += 0.05
        leader = self.leader()
        assert leader is not None, "no leader elected"
        return leader

    def propose(self, member: str, *bodies: bytes) -> list[Action]:
        code, entries, actions = self.cores[member].propose(list(bodies), self.now)
        self.absorb(member, actions)
        self.deliver()
        return actions

    def of_kind(self, member: str, kind: type) -> list[Action]:
        return [a for a in self.actions[member] if isinstance(a, kind)]

    def pushes(self, src: str, to: str) -> list[PushType]:
        return [
            r.type
            for s, t, r in self.sent
            if s == src and t == to and isinstance(r, PushEntryRequest)
        ]


__all__ = [
    "AppendDone",
    "Cluster",
    "Committed",
    "RoleChanged",
    "TransferDone",
    "config",
    "core",
    "log_of",
]
