"""Planted bugs the DLedger simulation must catch, shared by test_simulation.py and sim_cli.py.

* :class:`NoCurrentTermRule`: a leader that counts replicas for entries of any term (Raft's
  section 5.4.2 removed: DLedger's quorum ack checker only commits at an index whose entry is
  of the leader's own term).  The simulator's Figure 8 bias (a new leader dying as it takes
  the lead, a follower stalling after it took older-term entries, the leader dying the
  moment a quorum holds an older-term entry) makes the overwrite reachable; the checker's
  **leader completeness** check (a new leader must hold every committed entry) catches it.
* ``acks_before_flush`` (a simulator flag, not a core: flushing is the driver's job in a
  sans-I/O design): a follower answers a push before the entries are flushed.  A power cut
  right after the ack loses them; **leader completeness** (or **acknowledged appends**, when
  the lost entry had been acknowledged to the client) catches it.
* :class:`NoLease`: a leader that never steps down for want of a heartbeat quorum (it leads
  until a newer term reaches it, which a cut-off leader never sees).  The simulator's lease
  check (no leader past ``RaftCore.lease_end()``, broker/dledger/raft/election.py) catches it.
"""

from __future__ import annotations

import random

from broker.dledger.raft.core import CoreConfig, RaftCore
from broker.dledger.raft.election import LeaderElector
from broker.dledger.raft.entry_pusher import EntryPusher
from broker.dledger.raft.log import RaftLog
from broker.dledger.raft.member_state import HardState
from tests.broker.dledger.simulator import CoreFactory

__all__ = ["PLANTED", "NoCurrentTermRule", "NoLease", "factory_of"]


class _AnyTermPusher(EntryPusher):
    def _advance_commit(self) -> None:
        st = self.state
        marks = [st.log.end_index] + [d.watermark for d in self.dispatchers.values()]
        marks.sort(reverse=True)
        quorum_index = marks[len(marks) // 2]
        if quorum_index > st.committed_index:  # the bug: no check of the entry's term
            st.commit(quorum_index)
        self._finish_committed()


class NoCurrentTermRule(RaftCore):
    """Commits an entry of an older term as soon as a quorum holds it."""

    def __init__(
        self,
        config: CoreConfig,
        log: RaftLog,
        state: HardState,
        *,
        rng: random.Random,
        now: float,
        committed_index: int = -1,
    ) -> None:
        super().__init__(config, log, state, rng=rng, now=now, committed_index=committed_index)
        self._state.listeners.remove(self._pusher.on_role_change)
        self._pusher = _AnyTermPusher(self._state)
        self._state.listeners.append(self._pusher.on_role_change)


class _NoLeaseElector(LeaderElector):
    def check_lease(self, now: float) -> None:
        pass  # the bug: the lease is never enforced


class NoLease(RaftCore):
    """A leader that keeps leading without a heartbeat quorum."""

    def __init__(
        self,
        config: CoreConfig,
        log: RaftLog,
        state: HardState,
        *,
        rng: random.Random,
        now: float,
        committed_index: int = -1,
    ) -> None:
        super().__init__(config, log, state, rng=rng, now=now, committed_index=committed_index)
        elector = _NoLeaseElector(self._state, last_leader_heartbeat=now)
        elector.may_have_led = self._elector.may_have_led
        self._elector = elector


def factory_of(cls: type[RaftCore]) -> CoreFactory:
    def make(
        config: CoreConfig,
        log: RaftLog,
        state: HardState,
        rng: random.Random,
        now: float,
        committed: int,
    ) -> RaftCore:
        return cls(config, log, state, rng=rng, now=now, committed_index=committed)

    return make


# name -> (core class, acks_before_flush), for sim_cli's --planted
PLANTED: dict[str, tuple[type[RaftCore], bool]] = {
    "no-current-term-rule": (NoCurrentTermRule, False),
    "ack-before-flush": (RaftCore, True),
    "no-lease": (NoLease, False),
}
