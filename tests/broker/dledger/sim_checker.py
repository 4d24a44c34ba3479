"""The safety checks of the DLedger simulation (simulator.py), kept apart from the event loop.

Each check is incremental so it can run after every simulated step:

* election safety: at most one leader per term over the whole history (``leaders``);
* one vote per member and term: every ACCEPT a member sends goes to the candidate its last
  persisted state names for that term, and persisted states never go back (term) or change vote;
* log matching: every entry written to any log (leader append, follower append) is checked
  against the first entry ever written with the same (index, term): same entry, same term
  before it.  By induction, two logs holding the same (index, term) agree up to there;
* state machine safety: the entries up to any member's committed index are the same for all
  members (``canon``), and a member never truncates below what it reported committed;
* leader completeness: a member that becomes leader in term t holds every canon entry first
  committed in a term <= t;
* acknowledged appends: an AppendDone SUCCESS names exactly entries that are in ``canon``;
* retention and resets: a log loses its head only to committed entries (``drop_head`` up to
  what its member reported committed), and the highest begin index retention produced is the
  group's *horizon*: the entries below it are gone on purpose (on the write-once layout the
  leader no longer serves them).  A reset (raft/entry_handler.py) may only begin a log at a
  committed entry at or below the horizon, and never drops an entry its member reported
  committed at or above the new begin; leader completeness and state machine safety hold for
  every entry at or above a log's begin, and a log never begins above the horizon, so nothing
  at or above the horizon is ever missing from a leader.
"""

from __future__ import annotations

import attrs

from broker.dledger.raft.core import AppendDone
from broker.dledger.raft.log import MemoryLog
from broker.dledger.raft.member_state import HardState
from broker.dledger.raft.messages import DLedgerResponseCode, Entry


class SimulationFailure(AssertionError):
    """An invariant broke; the message says which and where."""


@attrs.define(eq=False)
class CheckedLog(MemoryLog):
    """A MemoryLog that reports every write and truncation to the checker."""

    owner: str = ""
    checker: Checker | None = None

    def append(self, term: int, body: bytes) -> Entry:
        entry = super().append(term, body)
        if self.checker is not None:
            self.checker.on_write(self, entry)
        return entry

    def append_entry(self, entry: Entry) -> bool:
        ok = super().append_entry(entry)
        if ok and self.checker is not None:
            self.checker.on_write(self, entry)
        return ok

    def truncate(self, index: int) -> None:
        if self.checker is not None:
            self.checker.on_truncate(self, index)
        super().truncate(index)

    def reset(self, first: Entry) -> None:
        if self.checker is not None and first.pos % self.file_size == 0:
            self.checker.on_reset(self, first)
        super().reset(first)

    def drop_head(self, upto: int) -> int:
        dropped = super().drop_head(upto)
        if dropped and self.checker is not None:
            self.checker.on_drop_head(self, self.begin_index)
        return dropped


@attrs.define(eq=False)
class Checker:
    # the first member seen leading each term
    leaders: dict[int, str] = attrs.field(factory=dict)
    # (member, term) -> the candidate it answered ACCEPT
    votes: dict[tuple[str, int], str] = attrs.field(factory=dict)
    # member -> last persisted hard state
    persisted: dict[str, HardState] = attrs.field(factory=dict)
    # (index, term) -> (entry, term of the entry before it)
    chain: dict[tuple[int, int], tuple[Entry, int]] = attrs.field(factory=dict)
    # committed entries by index, and the term in which each was first reported committed
    canon: list[Entry] = attrs.field(factory=list)
    canon_term: list[int] = attrs.field(factory=list)
    # member -> highest index it ever reported committed (all incarnations)
    reported: dict[str, int] = attrs.field(factory=dict)
    # (member, incarnation, term) whose leader completeness was checked
    leader_checked: set[tuple[str, int, int]] = attrs.field(factory=set)
    # (member, incarnation, first index) -> the entries of one successful propose
    proposals: dict[tuple[str, int, int], list[Entry]] = attrs.field(factory=dict)
    now: float = 0.0
    acked: int = 0
    # the highest begin index retention gave any log: entries below it are gone on purpose
    horizon: int = 0
    resets: int = 0

    def fail(self, what: str) -> None:
        raise SimulationFailure(f"t={self.now:.4f}: {what}")

    def on_write(self, log: CheckedLog, entry: Entry) -> None:
        prev_term = log.term_at(entry.index - 1) if entry.index > 0 else -1
        if entry.term < prev_term:
            self.fail(
                f"{log.owner}: term goes down at index {entry.index}: {prev_term} -> {entry.term}"
            )
        key = (entry.index, entry.term)
        seen = self.chain.get(key)
        if seen is None:
            self.chain[key] = (entry, prev_term)
        elif seen[0] != entry or seen[1] != prev_term:
            self.fail(
                f"log matching: {log.owner} wrote {entry} after term {prev_term}, "
                f"but the first entry ({entry.index}, {entry.term}) was {seen[0]} after term {seen[1]}"
            )

    def on_truncate(self, log: CheckedLog, index: int) -> None:
        reported = self.reported.get(log.owner, -1)
        if index <= min(reported, log.end_index):
            self.fail(f"{log.owner} truncates at {index} but reported {reported} committed")

    def on_drop_head(self, log: CheckedLog, begin: int) -> None:
        reported = self.reported.get(log.owner, -1)
        if begin > reported:
            self.fail(f"{log.owner}: retention dropped entries below {begin}, committed {reported}")
        self.horizon = max(self.horizon, begin)

    def on_reset(self, log: CheckedLog, first: Entry) -> None:
        self.resets += 1
        index = first.index
        if index >= len(self.canon) or self.canon[index] != first:
            self.fail(f"{log.owner} resets its log to {first}, not a committed entry")
        if index > self.horizon:
            self.fail(
                f"{log.owner} resets its log to begin at {index}, above the horizon "
                f"{self.horizon}: it drops committed entries the group still holds"
            )
        reported = self.reported.get(log.owner, -1)
        if reported >= index:
            self.fail(f"{log.owner} resets at {index} but reported {reported} committed")

    def on_persist(self, member: str, state: HardState) -> None:
        last = self.persisted.get(member)
        if last is not None:
            if state.term < last.term:
                self.fail(f"{member} persisted term {state.term} after {last.term}")
            if (
                state.term == last.term
                and last.voted_for is not None
                and state.voted_for != last.voted_for
            ):
                self.fail(f"{member} changed its vote in term {state.term}: {last} -> {state}")
        self.persisted[member] = state

    def on_vote_granted(self, member: str, term: int, candidate: str) -> None:
        state = self.persisted.get(member)
        if state is None or state.term != term or state.voted_for != candidate:
            self.fail(f"{member} answered ACCEPT to {candidate} in {term}, persisted {state}")
        first = self.votes.setdefault((member, term), candidate)
        if first != candidate:
            self.fail(f"{member} voted twice in term {term}: {first} and {candidate}")

    def on_committed(self, member: str, log: CheckedLog, index: int, term: int) -> None:
        start = self.reported.get(member, -1) + 1
        for i in range(start, index + 1):
            entry = log.get(i)
            if entry is None and i < log.begin_index and i < len(self.canon):
                continue  # below its begin (retention or a reset): committed, gone on purpose
            if entry is None:
                self.fail(f"{member} committed {index} but holds no entry {i}")
                return
            if i < len(self.canon):
                if self.canon[i] != entry:
                    self.fail(
                        f"state machine safety: {member} committed {entry} where {self.canon[i]} was committed"
                    )
            else:
                self.canon.append(entry)
                self.canon_term.append(term)
        if index >= start:
            self.reported[member] = index

    def on_leader(self, member: str, incarnation: int, term: int, log: CheckedLog) -> None:
        owner = self.leaders.setdefault(term, member)
        if owner != member:
            self.fail(f"two leaders in term {term}: {owner} and {member}")
        key = (member, incarnation, term)
        if key in self.leader_checked:
            return
        self.leader_checked.add(key)
        begin = max(0, log.begin_index)
        if begin > self.horizon:
            self.fail(
                f"leader completeness: {member} leads term {term} from {begin}, above the horizon"
            )
        for i, entry in enumerate(self.canon):
            if i < begin:
                continue
            if self.canon_term[i] <= term and log.get(i) != entry:
                self.fail(
                    f"leader completeness: {member} leads term {term} without committed {entry}: {log.get(i)}"
                )

    def on_proposed(self, member: str, incarnation: int, entries: list[Entry]) -> None:
        self.proposals[(member, incarnation, entries[0].index)] = entries

    def on_append_done(self, member: str, incarnation: int, done: AppendDone) -> None:
        entries = self.proposals.pop((member, incarnation, done.first), None)
        if entries is None or entries[-1].index != done.last:
            self.fail(f"{member}: AppendDone {done} matches no pending propose")
            return
        if done.code is not DLedgerResponseCode.SUCCESS:
            return
        self.acked += len(entries)
        for entry in entries:
            if entry.index >= len(self.canon) or self.canon[entry.index] != entry:
                self.fail(
                    f"acknowledged appends: {member}: acknowledged {entry} is not the committed entry"
                )
