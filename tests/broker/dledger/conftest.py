"""Fixtures for the DLedger tests.

``FakeNode`` stands in for ``broker.dledger.driver.node.DLedgerNode`` where a test is about the
broker on top of it (the store, the role handler), not about Raft: one member on a
``MemoryLog``, whose proposals commit at once unless ``auto_commit`` is off (then ``commit(i)``
does it), whose role changes when the test says so, and which can be told to refuse or fail
proposals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import pytest
import trio

from broker.dledger.raft.log import MemoryLog
from broker.dledger.raft.messages import Entry, Role
from common.message import MessageExtBrokerInner
from common.remoting.codes import DLedgerResponseCode

STORE_HOST = ("127.0.0.1", 10911)


@attrs.frozen
class FakeConfig:
    group: str = "broker-a"
    self_id: str = "n0"
    peers: str = "n0-127.0.0.1:40911"


@attrs.frozen
class FakeRoleChanged:
    role: Role
    term: int
    leader_id: str | None


@attrs.define(eq=False)
class FakeProposal:
    node: FakeNode
    code: DLedgerResponseCode
    entries: list[Entry]
    # what wait() answers instead of waiting for the commit (a quorum timeout, a term change)
    outcome: DLedgerResponseCode | None = None

    async def wait(self) -> DLedgerResponseCode:
        if self.code is not DLedgerResponseCode.SUCCESS:
            return self.code
        if self.outcome is not None:
            await trio.lowlevel.checkpoint()
            return self.outcome
        await self.node.wait_committed(self.entries[-1].index)
        return DLedgerResponseCode.SUCCESS


@attrs.define(eq=False)
class FakeNode:
    config: FakeConfig = attrs.Factory(FakeConfig)
    log: MemoryLog = attrs.Factory(MemoryLog)
    role: Role = Role.LEADER
    term: int = 1
    leader_id: str | None = "n0"
    committed_index: int = -1
    auto_commit: bool = True
    # propose() answers this (no entries) when set
    refuse: DLedgerResponseCode | None = None
    # proposals' wait() answers this when set
    outcome: DLedgerResponseCode | None = None
    listeners: list[Callable[[FakeRoleChanged], None]] = attrs.Factory(list)
    _changed: trio.Event = attrs.Factory(trio.Event)

    def propose(self, bodies: Sequence[bytes]) -> FakeProposal:
        if self.refuse is not None:
            return FakeProposal(self, self.refuse, [])
        if self.role is not Role.LEADER:
            return FakeProposal(self, DLedgerResponseCode.NOT_LEADER, [])
        entries = [self.log.append(self.term, bytes(b)) for b in bodies]
        if self.auto_commit:
            self.commit(self.log.end_index)
        return FakeProposal(self, DLedgerResponseCode.SUCCESS, entries, self.outcome)

    def commit(self, index: int) -> None:
        self.committed_index = max(self.committed_index, min(index, self.log.end_index))
        ev, self._changed = self._changed, trio.Event()
        ev.set()

    async def wait_committed(self, index: int) -> None:
        while self.committed_index < index:
            await self._changed.wait()

    def add_role_listener(self, fn: Callable[[FakeRoleChanged], None]) -> None:
        self.listeners.append(fn)

    def change_role(
        self, role: Role, term: int | None = None, leader_id: str | None = None
    ) -> None:
        self.role = role
        if term is not None:
            self.term = term
        self.leader_id = leader_id
        for fn in list(self.listeners):
            fn(FakeRoleChanged(role, self.term, leader_id))


def make_message(
    topic: str = "T", qid: int = 0, body: bytes = b"x", **props: object
) -> MessageExtBrokerInner:
    return MessageExtBrokerInner(
        topic=topic,
        queue_id=qid,
        body=body,
        properties={k: str(v) for k, v in props.items()},
        born_timestamp=1,
        born_host=("10.0.0.1", 1234),
        store_host=STORE_HOST,
    )


@pytest.fixture
def new_node() -> Callable[..., FakeNode]:
    """``new_node(**fields)``: a FakeNode (test modules cannot import this one)."""
    return FakeNode


@pytest.fixture
def mk() -> Callable[..., MessageExtBrokerInner]:
    return make_message
