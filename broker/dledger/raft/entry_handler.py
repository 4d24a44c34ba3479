"""Log replication, follower side: DLedger's EntryHandler (pushes from the leader).

Theory of operation
-------------------
A push first passes the elector's term/leader gate (election.py: EXPIRED_TERM, TERM_NOT_READY,
INCONSISTENT_LEADER, ...); then this handler applies it to the log synchronously, in arrival
order, and answers with its own log bounds (``begin_index``/``end_index``):

* APPEND: each pushed entry at or below the follower's end must equal the local one (a
  duplicate: REPEATED_PUSH when the whole push was duplicates); the entry at end+1 is appended
  (``append_entry`` checks its position); anything else is INCONSISTENT_STATE and the leader
  goes back to COMPARE.  No buffering: the leader's transport delivers one follower's pushes in
  send order, and an out-of-order one just costs a COMPARE.
* COMPARE: SUCCESS when the local entry at that index equals the leader's, else
  INCONSISTENT_STATE.
* TRUNCATE: drop every entry after the index and make the entry there the leader's; when the
  entries before it cannot be kept (below, "Reset"), begin the log again at it.
* COMMIT: only carries the leader's commit index.

``match_end`` is the last index known to agree with the current leader's log (reset when term
or leader changes, and on restart).  An entry equal to the leader's at index i proves the whole
prefix up to i equal (log matching), so matching entries raise it.  It makes the handler safe
even against stale or repeated pushes, which TCP does not produce but a lossy model may:

* an entry is appended at end+1 only when ``match_end == end`` (the whole local log agrees);
  otherwise INCONSISTENT_STATE, and the leader's COMPARE re-establishes it (one round trip after
  a follower restart);
* TRUNCATE never drops entries up to ``match_end`` or up to the committed index: a stale
  TRUNCATE cannot remove entries the follower already acknowledged in this term;
* the committed index becomes ``min(leader's commitIndex, match_end)``, never more, and a COMMIT
  push that would need more is answered INCONSISTENT_STATE so the leader compares again.

Reset (a follower the leader's retention left behind)
----------------------------------------------------
A leader whose retention dropped its head files (a forced clean on a full disk,
broker/dledger/broker/log_retention.py) begins at ``B``, the first entry of its first data
file, at ``P``, that file's start.  A follower that does not hold the leader's entry at ``B``
and cannot show that its entry ``B - 1`` agrees (it ends before ``B - 1``, its log is empty, or
it holds other entries there and knows nothing of them agreeing) can never be repaired by
truncation: the leader has nothing below ``B`` to compare or send, and its dispatcher ends at
TRUNCATE ``B`` (entry_pusher.py).  DLedger 0.3.1.2 answers that TRUNCATE by rebuilding its
store at the entry's position (``DLedgerMmapFileStore.truncate``: ``rebuildWithPos``, then the
entry appended); so does this handler (unless ``CoreConfig.log_reset`` is off: then it refuses
as before), under three conditions, with ``RaftLog.reset``:

1. the leader's ``commitIndex`` in the push is at least ``B``: entry ``B`` is committed, so
   everything below it is too (log matching) -- a reset never starts at an entry that could
   still be overwritten, and a TRUNCATE at any uncommitted index (a compare point) is refused;
2. ``B`` is above what this member trusts (``match_end`` and its committed index): nothing it
   acknowledged to this leader in this term, and nothing it holds committed, is dropped by the
   reset *at or above* ``B``;
3. ``P`` starts a data file (``reset`` raises ValueError otherwise: a log can only begin there).

What it discards and why that is safe:

* entries ``< B``: each is either committed, and then it is the group's entry there (state
  machine safety) and the leader no longer holds it: retention only drops committed entries, and
  on the write-once layout (consume queues pointing into the data files) the group no longer
  serves those messages either, so this member loses nothing the group still has; or it is not
  committed and Raft lets a follower drop it (no quorum counted it for anything that
  committed);
* entries ``>= B`` it may hold: its entry at ``B`` differs from the leader's, which is committed,
  so its entry there is not committed, and no later entry of its is committed either (a
  committed entry at ``j > B`` would be in the leader's log, and by log matching so would this
  member's entry at ``B``).

After it: ``match_end = B`` (its whole log is the leader's entry ``B``); the committed index
becomes ``min(commitIndex, match_end) = B`` (it was below ``B``: it never exceeds the old end):
everything before ``B`` is committed on the leader, and ``B`` itself.  Term, vote and role are
untouched: the reset is a log operation within the leader's term.  The core emits
``LogReset(B, P)`` before the push's ``Committed``, so the broker drops what it built from the
old entries before it applies ``B``.  A stale TRUNCATE (sent before this member restarted and
lost a tail, delivered after) could only pass 1-3 at an index the leader had committed and at a
file start; the reset then drops committed entries the leader still serves, from this member
only: the one case left open, since DLedger's wire has no field saying "this is my first entry"
(our answers already say so: ``beginIndex``).

Invariants
* entries up to the committed index are never removed or changed, except by a reset, which
  removes only committed entries below the leader's first one;
* the committed index never decreases and never exceeds ``match_end`` when it rises;
* every answer that acknowledges entries (SUCCESS/REPEATED_PUSH to an APPEND) is sent only once
  they are in the log, equal to the leader's.
"""

from __future__ import annotations

import logging

import attrs

from broker.dledger.raft.member_state import LogReset, MemberState
from broker.dledger.raft.messages import (
    DLedgerResponseCode,
    Entry,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
)

__all__ = ["EntryHandler"]

Code = DLedgerResponseCode
_log = logging.getLogger(__name__)


def log_disk_error(exc: OSError, index: int) -> None:
    """A follower that cannot store a pushed entry answers DISK_FULL; the leader pushes again."""
    _log.error("cannot store entry %d: %s", index, exc)


@attrs.define(eq=False)
class EntryHandler:
    state: MemberState
    # (term, leader) that match_end refers to
    _match_of: tuple[int, str | None] = (-1, None)
    # last index known to equal the current leader's log; -1 when nothing is known
    _match_end: int = -1
    # the commit index the last admitted push carried (-1 before any)
    leader_commit: int = -1

    @property
    def match_end(self) -> int:
        st = self.state
        if self._match_of != (st.term, st.leader_id):
            self._match_of, self._match_end = (st.term, st.leader_id), -1
        return self._match_end

    def _matched(self, index: int) -> None:
        if index > self.match_end:
            self._match_end = index

    def reply(self, request: PushEntryRequest, code: DLedgerResponseCode) -> PushEntryResponse:
        st = self.state
        first = request.entries[0].index if request.entries else None
        return PushEntryResponse(
            group=request.group,
            remote_id=request.remote_id,
            local_id=request.local_id,
            term=st.term,
            leader_id=st.leader_id,
            code=code,
            index=first,
            begin_index=st.log.begin_index,
            end_index=st.log.end_index,
            count=len(request.entries),
        )

    def handle_push(self, request: PushEntryRequest) -> PushEntryResponse:
        """Apply an admitted push (term and leader already checked)."""
        self.leader_commit = request.commit_index
        if request.type is PushType.APPEND:
            code = self._append(request)
        elif request.type is PushType.COMPARE:
            code = self._compare(request)
        elif request.type is PushType.TRUNCATE:
            code = self._truncate(request)
        else:
            code = self._commit_only(request)
        if code in (Code.SUCCESS, Code.REPEATED_PUSH):
            self._follow_commit(request.commit_index)
        return self.reply(request, code)

    def _follow_commit(self, leader_commit: int) -> None:
        self.state.commit(min(leader_commit, self.match_end))

    def _append(self, request: PushEntryRequest) -> DLedgerResponseCode:
        if not request.entries:
            return Code.UNEXPECTED_ARGUMENT
        log = self.state.log
        appended = False
        for entry in request.entries:
            end = log.end_index
            if entry.index <= end:
                if entry.index >= log.begin_index and log.get(entry.index) != entry:
                    return Code.INCONSISTENT_STATE
                self._matched(entry.index)
            elif entry.index == end + 1 and self.match_end == end:
                try:
                    if not log.append_entry(entry):
                        return Code.INCONSISTENT_STATE
                except OSError as exc:  # a full disk: nothing of this entry was stored
                    log_disk_error(exc, entry.index)
                    return Code.DISK_FULL
                self._matched(entry.index)
                appended = True
            else:
                return Code.INCONSISTENT_STATE
        return Code.SUCCESS if appended else Code.REPEATED_PUSH

    def _compare(self, request: PushEntryRequest) -> DLedgerResponseCode:
        if len(request.entries) != 1:
            return Code.UNEXPECTED_ARGUMENT
        entry = request.entries[0]
        if self.state.log.get(entry.index) != entry:
            return Code.INCONSISTENT_STATE
        self._matched(entry.index)
        return Code.SUCCESS

    def _truncate(self, request: PushEntryRequest) -> DLedgerResponseCode:
        if len(request.entries) != 1:
            return Code.UNEXPECTED_ARGUMENT
        st = self.state
        log = st.log
        entry = request.entries[0]
        index = entry.index
        trusted = max(self.match_end, min(st.committed_index, log.end_index))
        if log.get(index) == entry:
            # keep what is known to agree: a stale TRUNCATE must not drop acknowledged entries
            keep = max(index, trusted)
            log.truncate(keep + 1)
            self._matched(keep)
            return Code.SUCCESS
        if index <= trusted:
            return Code.INCONSISTENT_STATE  # never rewrite an agreed or committed entry
        if (
            index > log.end_index + 1  # a gap: it ends before the leader's first entry
            or (0 < log.begin_index and index <= log.begin_index)  # it cannot cut its own head
            or (index > log.begin_index and index - 1 > trusted)  # what precedes is unknown
        ):
            return self._reset(request.commit_index, entry)
        log.truncate(index)
        try:
            if not log.append_entry(entry):
                return Code.INCONSISTENT_STATE
        except OSError as exc:
            log_disk_error(exc, index)
            return Code.DISK_FULL
        self._matched(index)
        return Code.SUCCESS

    def _reset(self, leader_commit: int, entry: Entry) -> DLedgerResponseCode:
        """Begin the log again at the leader's entry (module doc, "Reset")."""
        log = self.state.log
        if not self.state.config.log_reset:
            return Code.INCONSISTENT_STATE  # this member cannot drop what it built (CoreConfig)
        if leader_commit < entry.index:
            return Code.INCONSISTENT_STATE  # not known committed: maybe not the leader's first
        try:
            log.reset(entry)
        except ValueError as exc:
            _log.debug("TRUNCATE at %d refused: %s", entry.index, exc)
            return Code.INCONSISTENT_STATE
        except OSError as exc:
            log_disk_error(exc, entry.index)
            return Code.DISK_FULL
        _log.warning(
            "%s: log reset by leader %s: it begins at entry %d (pos %d); the entries held "
            "before were all below the leader's first one",
            self.state.self_id,
            self.state.leader_id,
            entry.index,
            entry.pos,
        )
        self._matched(entry.index)
        self.state.out.append(LogReset(entry.index, entry.pos))
        return Code.SUCCESS

    def _commit_only(self, request: PushEntryRequest) -> DLedgerResponseCode:
        wanted = min(request.commit_index, self.state.log.end_index)
        if wanted > self.state.committed_index and wanted > self.match_end:
            return Code.INCONSISTENT_STATE
        return Code.SUCCESS
