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
* :class:`ResetAtNewestFile`: a leader that resets a stranded follower at the first entry of
  its newest committed data file instead of its first one (less to send, and the follower
  "is rebuilt anyway").  The follower accepts (the entry is committed and starts a file) and
  is left without committed entries the group still holds.  Only the seeds with forced cleans
  strand anyone; the checker's **horizon** rule (no log begins above the highest begin that
  retention produced, sim_checker.py) catches it, and **leader completeness** would once that
  member leads.
"""

from __future__ import annotations

import random

from broker.dledger.raft.core import CoreConfig, RaftCore
from broker.dledger.raft.election import LeaderElector
from broker.dledger.raft.entry_pusher import EntryPusher, _Dispatcher
from broker.dledger.raft.log import RaftLog
from broker.dledger.raft.member_state import HardState
from tests.broker.dledger.simulator import CoreFactory

__all__ = ["PLANTED", "NoCurrentTermRule", "NoLease", "ResetAtNewestFile", "factory_of"]


class _AnyTermPusher(EntryPusher):
    def _advance_commit(self) -> None:
        st = self.state
        marks = [st.log.end_index] + [d.watermark for d in self.dispatchers.values()]
        marks.sort(reverse=True)
        quorum_index = marks[len(marks) // 2]
        if quorum_index > st.committed_index:  # the bug: no check of the entry's term
            st.commit(quorum_index)
        self._finish_committed()


class _PlantedPusher(RaftCore):
    """A core whose entry pusher is ``pusher_class`` (a bug planted in the pusher)."""

    pusher_class: type[EntryPusher]

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
        self._pusher = self.pusher_class(self._state)
        self._state.listeners.append(self._pusher.on_role_change)


class NoCurrentTermRule(_PlantedPusher):
    """Commits an entry of an older term as soon as a quorum holds it."""

    pusher_class = _AnyTermPusher


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


class _NewestFilePusher(EntryPusher):
    def _send_truncate(self, d: _Dispatcher, index: int, now: float) -> None:
        log = self.state.log
        file_size = getattr(log, "file_size", 0)
        if index == log.begin_index > 0 and file_size:
            # the bug: the TRUNCATE at the first entry goes out at the newest committed file start
            for i in range(index, self.state.committed_index + 1):
                entry = log.get(i)
                if entry is not None and entry.pos % file_size == 0:
                    index = i
        super()._send_truncate(d, index, now)


class ResetAtNewestFile(_PlantedPusher):
    """Resets a stranded follower at its newest committed data file, not its first entry."""

    pusher_class = _NewestFilePusher


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
    "reset-at-newest-file": (ResetAtNewestFile, False),
}
