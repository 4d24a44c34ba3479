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
* TRUNCATE: drop every entry after the index and make the entry there the leader's.
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

Invariants
* entries up to the committed index are never removed or changed;
* the committed index never decreases and never exceeds ``match_end`` when it rises;
* every answer that acknowledges entries (SUCCESS/REPEATED_PUSH to an APPEND) is sent only once
  they are in the log, equal to the leader's.
"""

from __future__ import annotations

import logging

import attrs

from broker.dledger.raft.member_state import MemberState
from broker.dledger.raft.messages import (
    DLedgerResponseCode,
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
        if index <= trusted or index > log.end_index + 1:
            return Code.INCONSISTENT_STATE  # never rewrite an agreed entry, never leave a gap
        if 0 < log.begin_index and index <= log.begin_index:
            # the entries before it are gone here (retention): nothing proves they agree, and
            # the log cannot be cut at its own head; the leader logs the member as stranded
            _log.debug("TRUNCATE at %d refused: this log begins at %d", index, log.begin_index)
            return Code.INCONSISTENT_STATE
        if index > log.begin_index and index - 1 > trusted:
            return Code.INCONSISTENT_STATE  # the entries before it are not known to agree
        log.truncate(index)
        try:
            if not log.append_entry(entry):
                return Code.INCONSISTENT_STATE
        except OSError as exc:
            log_disk_error(exc, index)
            return Code.DISK_FULL
        self._matched(index)
        return Code.SUCCESS

    def _commit_only(self, request: PushEntryRequest) -> DLedgerResponseCode:
        wanted = min(request.commit_index, self.state.log.end_index)
        if wanted > self.state.committed_index and wanted > self.match_end:
            return Code.INCONSISTENT_STATE
        return Code.SUCCESS
