"""Proposals: bodies handed to the leader's log, and the wait for their outcome.

Theory of operation
-------------------
``DLedgerNode.propose`` appends at once (the core's ``propose``) and returns a
:class:`Proposal`: ``code`` says whether the bodies are in the leader's log (SUCCESS, with the
stored ``entries``) or why not (NOT_LEADER, LEADER_TRANSFERRING, LEADER_PENDING_FULL,
DISK_FULL).  ``await proposal.wait()`` gives the final outcome, which the core announces with
AppendDone actions over index ranges: SUCCESS (committed), WAIT_QUORUM_ACK_TIMEOUT or
TERM_CHANGED (not acknowledged; the entries may still commit under a later leader).
:class:`PendingProposals` matches those ranges to proposals (DLedger's
``pendingAppendResponsesByTerm``).  A proposal may span several ranges; it ends when all of its
entries have an outcome, with SUCCESS only if all of them succeeded.

Invariants: pending proposals are kept in index order; each proposal's ``wait`` returns one
outcome, never changed once set.
"""

from __future__ import annotations

import itertools
from collections import deque

import attrs
import trio

from broker.dledger.raft.messages import Entry
from common.remoting.codes import DLedgerResponseCode

__all__ = ["PendingProposals", "Proposal"]


@attrs.define(eq=False)
class Proposal:
    code: DLedgerResponseCode
    entries: list[Entry]
    # the first non-SUCCESS outcome of any of its entries; None while none
    _failure: DLedgerResponseCode | None = None
    # entries whose outcome is not known yet
    _remaining: int = 0
    # set once every entry has an outcome
    _done: trio.Event = attrs.field(factory=trio.Event)

    @property
    def first(self) -> int:
        return self.entries[0].index

    @property
    def last(self) -> int:
        return self.entries[-1].index

    @property
    def finished(self) -> bool:
        return self.code is not DLedgerResponseCode.SUCCESS or self._done.is_set()

    async def wait(self) -> DLedgerResponseCode:
        """SUCCESS once every entry is committed; else WAIT_QUORUM_ACK_TIMEOUT or TERM_CHANGED
        (or the refusal ``code`` when nothing was appended)."""
        if self.code is not DLedgerResponseCode.SUCCESS:
            await trio.lowlevel.checkpoint()
            return self.code
        await self._done.wait()
        return self._failure or DLedgerResponseCode.SUCCESS

    def _settle(self, first: int, last: int, code: DLedgerResponseCode) -> None:
        lo, hi = max(first, self.first), min(last, self.last)
        if lo > hi or self._done.is_set():
            return
        if code is not DLedgerResponseCode.SUCCESS and self._failure is None:
            self._failure = code
        self._remaining -= hi - lo + 1
        if self._remaining <= 0:
            self._done.set()


def _no_proposals() -> deque[Proposal]:
    return deque()


@attrs.define(eq=False)
class PendingProposals:
    # appended proposals without a final outcome, in index order
    _pending: deque[Proposal] = attrs.field(factory=_no_proposals)

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, proposal: Proposal) -> None:
        """Track a SUCCESS proposal (the node adds it before running the core's actions)."""
        if proposal.code is DLedgerResponseCode.SUCCESS and proposal.entries:
            proposal._remaining = len(proposal.entries)
            self._pending.append(proposal)

    def settle(self, first: int, last: int, code: DLedgerResponseCode) -> None:
        """Entries ``first..last`` have outcome ``code`` (an AppendDone)."""
        pending = self._pending
        while pending and pending[0].first <= last:
            head = pending[0]
            head._settle(first, last, code)
            if not head.finished:
                break
            pending.popleft()
        else:
            return
        # the head is still open: later proposals may have ended (ranges out of order, rare)
        ended = False
        for proposal in itertools.islice(pending, 1, None):
            if proposal.first > last:
                break
            proposal._settle(first, last, code)
            ended |= proposal.finished
        if ended:
            self._pending = deque(p for p in pending if not p.finished)

    def close(self, code: DLedgerResponseCode) -> None:
        """End every pending proposal with ``code`` (the node is stopping)."""
        for proposal in self._pending:
            proposal._settle(proposal.first, proposal.last, code)
        self._pending.clear()
