"""Log replication, leader side: DLedger's DLedgerEntryPusher (dispatchers + quorum ack checker).

Theory of operation
-------------------
When this node becomes leader of a term it appends one no-op entry (Raft §8's no-op, body
``CoreConfig.noop_body``: the term's first entry, so entries of older terms can commit through
it) and starts one
:class:`_Dispatcher` per follower, in state COMPARE.  A dispatcher is a small state machine
(``DLedgerEntryPusher.EntryDispatcher`` in openmessaging/dledger 0.3.1.2):

* COMPARE: send the leader's entry at ``compare_index`` (first the leader's end).  SUCCESS with
  the follower ending right there -> APPEND; SUCCESS with a longer follower -> TRUNCATE there.
  INCONSISTENT_STATE -> step back (to the follower's end when that is smaller, else one less);
  no overlap at all -> TRUNCATE at the leader's begin index.  One COMPARE at a time.
* TRUNCATE: send the entry at the truncate index; SUCCESS -> APPEND after it.  At this log's
  first entry, to a follower that holds nothing it can keep, the TRUNCATE resets the follower's
  log to begin there (entry_handler.py, "Reset"): DLedger's way of rebuilding a member that
  retention left behind.
* APPEND: push entries in order (``max_batch_push_entries`` per push with batch push, else one;
  a batch also stops before ``max_batch_push_bytes``), at most ``max_in_flight_pushes``
  unanswered per follower; the push at watermark+1 is sent again
  when unanswered for ``maxPushTimeOutMs``.  INCONSISTENT_STATE (to an APPEND or COMMIT) -> COMPARE.
* COMMIT: when nothing is left to push, a COMMIT push carries the commit index every half
  heartbeat interval (DLedger's fixed 1 s at the default interval), and sooner when the commit
  index moved past the one the follower was last told: ``commit_push_delay_ms`` (20 ms) after
  the last push.  So a follower's committed index is never more than one push behind the
  leader's: a busy follower hears the new commit index with the next entries, an idle one in a
  COMMIT push at most ``commit_push_delay_ms`` after the last push (or as soon as the commit
  moves, when the acks took longer).  DLedger's idle follower can be 1 s behind, and reads
  served by a follower (docs/guarantees.md, "Reads in DLedger mode") with it.  The delay keeps
  the COMMIT push off a steady stream of single sends, whose next push carries the index.

A failed or refused COMPARE/TRUNCATE goes back to COMPARE after half ``maxPushTimeOutMs``.
Every ack raises the follower's watermark (never lowers it); after each change the quorum index
is the ``n//2``-th largest of the watermarks, the leader's own end index counted as its
watermark.  It becomes the commit index only when the entry there is of the current term
(Raft §5.4.2): an older-term entry is committed by committing a later current-term one.

Pending appends (``propose``) are kept in index order with their deadline
(``maxWaitAckTimeMs``): they finish SUCCESS when the commit index passes them,
WAIT_QUORUM_ACK_TIMEOUT at the deadline, TERM_CHANGED when leadership ends.

Invariants
* the leader never truncates or rewrites its own log while leading;
* a watermark is an index the follower acknowledged holding, with the leader's entries up to
  it, during this term (followers never drop such entries, see entry_handler.py);
* the commit index only moves to an index held by a quorum whose entry is of the current term;
* pending appends are exactly the client entries of this term not yet finished, in index order.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Sequence

import attrs

from broker.dledger.raft.member_state import AppendDone, MemberState, Send
from broker.dledger.raft.messages import (
    ENTRY_HEADER_SIZE,
    DLedgerResponseCode,
    Entry,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    Role,
)

__all__ = ["EntryPusher"]

Code = DLedgerResponseCode
_log = logging.getLogger(__name__)


@attrs.define(eq=False)
class _Dispatcher:
    peer: str
    type: PushType = PushType.COMPARE
    # COMPARE: the index to compare next, -1 = start at the leader's end
    compare_index: int = -1
    # COMPARE: lowest index where the follower was seen holding a different entry in this
    # compare phase (a lasting fact: only our TRUNCATE removes it); inf when none
    conflict_at: float = math.inf
    # APPEND: the next index to push
    write_index: int = 0
    # APPEND: first index of each unanswered push -> (sent at, entries in it); inserted in
    # index order (a re-push only rewrites its key's value), so the first key is the oldest
    pending: dict[int, tuple[float, int]] = attrs.field(factory=dict)
    # COMPARE/TRUNCATE: the one push awaiting its answer
    outstanding: PushEntryRequest | None = None
    # COMPARE: not before this time (after a failed COMPARE/TRUNCATE)
    retry_at: float = -math.inf
    # when anything was last pushed (for the idle COMMIT push)
    last_push: float = -math.inf
    # the commit index the last push carried
    told_commit: int = -1
    # highest index the follower acknowledged in this term; never decreases
    watermark: int = -1
    # the leader's begin index when it last logged that this follower ends before it
    stranded_at: int = -1


@attrs.define(eq=False)
class _Pending:
    first: int
    last: int
    deadline: float


@attrs.define(eq=False)
class EntryPusher:
    state: MemberState
    # the term this node leads with its dispatchers set up; None when not leading
    leading_term: int | None = None
    # follower id -> its dispatcher; empty when not leading
    dispatchers: dict[str, _Dispatcher] = attrs.field(factory=dict)
    # unfinished client appends of leading_term, by index
    pending: collections.deque[_Pending] = attrs.field(factory=collections.deque)
    # number of entries in ``pending``
    pending_count: int = 0
    disk_full: bool = False

    # --- leadership ------------------------------------------------------------------------

    def on_role_change(self) -> None:
        st = self.state
        if self.leading_term is not None and (
            st.role is not Role.LEADER or st.term != self.leading_term
        ):
            self._stop_leading()
        if st.role is Role.LEADER and self.leading_term is None:
            self._start_leading()

    def _start_leading(self) -> None:
        st = self.state
        self.leading_term = st.term
        self.dispatchers = {p: _Dispatcher(p) for p in st.config.others}
        # the no-op: lets older entries commit in this term
        st.log.append(st.term, st.config.noop_body)
        self._advance_commit()

    def _stop_leading(self) -> None:
        for p in self.pending:
            self.state.out.append(AppendDone(p.first, p.last, Code.TERM_CHANGED))
        self.pending.clear()
        self.pending_count = 0
        self.dispatchers = {}
        self.leading_term = None

    # --- client appends --------------------------------------------------------------------

    def propose(
        self, bodies: Sequence[bytes], now: float
    ) -> tuple[DLedgerResponseCode, list[Entry]]:
        st = self.state
        if st.role is not Role.LEADER or self.leading_term != st.term:
            return Code.NOT_LEADER, []
        # DLedger's order: NOT_LEADER, (LEADER_TRANSFERRING, in core.py), pending full, disk full
        if self.pending_count + len(bodies) > st.config.max_pending_requests_num:
            return Code.LEADER_PENDING_FULL, []
        if self.disk_full:
            return Code.DISK_FULL, []
        if not bodies:
            return Code.REQUEST_WITH_EMPTY_BODYS, []
        entries: list[Entry] = []
        try:
            for body in bodies:
                entries.append(st.log.append(st.term, bytes(body)))
        except OSError as exc:
            # the filesystem could not back the entry (log.py: nothing of it was stored).  The
            # entries of this batch appended before it go too: nobody saw them (pushes and the
            # commit come after this call), so the log is as if the batch never came, and the
            # refusal means what it says: nothing of it is stored.  Left in the log they would
            # commit, and the broker, told DISK_FULL, would hand their queue offsets out again
            if entries:
                st.log.truncate(entries[0].index)
            _log.error("leader cannot append: %s; refusing appends until the disk check", exc)
            self.disk_full = True
            return Code.DISK_FULL, []
        deadline = now + st.config.max_wait_ack_time_ms / 1000.0
        self.pending.append(_Pending(entries[0].index, entries[-1].index, deadline))
        self.pending_count += len(entries)
        self._advance_commit()
        return Code.SUCCESS, entries

    def _finish_committed(self) -> None:
        committed = self.state.committed_index
        while self.pending and self.pending[0].last <= committed:
            p = self.pending.popleft()
            self.pending_count -= p.last - p.first + 1
            self.state.out.append(AppendDone(p.first, p.last, Code.SUCCESS))

    def _expire(self, now: float) -> None:
        while self.pending and self.pending[0].deadline <= now:
            p = self.pending.popleft()
            self.pending_count -= p.last - p.first + 1
            self.state.out.append(AppendDone(p.first, p.last, Code.WAIT_QUORUM_ACK_TIMEOUT))

    def _advance_commit(self) -> None:
        st = self.state
        marks = [st.log.end_index] + [d.watermark for d in self.dispatchers.values()]
        marks.sort(reverse=True)
        quorum_index = marks[len(marks) // 2]
        if quorum_index > st.committed_index and st.log.term_at(quorum_index) == st.term:
            st.commit(quorum_index)
        self._finish_committed()

    def watermarks(self) -> dict[str, int]:
        st = self.state
        marks = {peer: d.watermark for peer, d in self.dispatchers.items()}
        marks[st.self_id] = st.log.end_index
        return marks

    # --- timers ----------------------------------------------------------------------------

    def _commit_interval(self) -> float:
        return self.state.config.heart_beat_time_interval_ms / 2000.0

    def _commit_push_at(self, d: _Dispatcher) -> float:
        """When an idle follower gets its next COMMIT push (the early one only once it
        answered every push: a COMMIT overtaking an APPEND would cost a COMPARE)."""
        if d.told_commit < self.state.committed_index and not d.pending:
            return d.last_push + self.state.config.commit_push_delay_ms / 1000.0
        return d.last_push + self._commit_interval()

    def _push_timeout(self) -> float:
        return self.state.config.max_push_time_out_ms / 1000.0

    def next_deadline(self) -> float:
        if self.leading_term is None:
            return math.inf
        at = self.pending[0].deadline if self.pending else math.inf
        end = self.state.log.end_index
        for d in self.dispatchers.values():
            if d.type is not PushType.APPEND:
                if d.outstanding is None:
                    at = min(at, d.retry_at)
                continue
            if d.write_index > end:
                at = min(at, self._commit_push_at(d))
            first = d.pending.get(d.watermark + 1)
            if first is not None:
                at = min(at, first[0] + self._push_timeout())
        return at

    def pump(self, now: float) -> None:
        """Run every due step: expire pending appends, push what can be pushed."""
        if self.leading_term is None:
            return
        self._expire(now)
        for d in self.dispatchers.values():
            if d.type is PushType.APPEND:
                self._pump_append(d, now)
            elif d.outstanding is None and now >= d.retry_at:
                self._send_compare(d, now)

    # --- dispatcher ------------------------------------------------------------------------

    def _request(
        self, d: _Dispatcher, kind: PushType, entries: tuple[Entry, ...]
    ) -> PushEntryRequest:
        st = self.state
        return PushEntryRequest(
            group=st.config.group,
            remote_id=d.peer,
            local_id=st.self_id,
            leader_id=st.self_id,
            term=st.term,
            type=kind,
            commit_index=st.committed_index,
            entries=entries,
        )

    def _send(self, d: _Dispatcher, request: PushEntryRequest, now: float) -> None:
        d.last_push = now
        d.told_commit = request.commit_index
        self.state.out.append(Send(d.peer, request))

    def _entries(self, first: int, count: int, max_bytes: float = math.inf) -> tuple[Entry, ...]:
        """Up to ``count`` entries from ``first``, stopping before their headers and bodies
        pass ``max_bytes`` (the first always comes)."""
        log = self.state.log
        found: list[Entry] = []
        size = 0
        for index in range(first, first + count):
            entry = log.get(index)
            if entry is None:
                break
            size += ENTRY_HEADER_SIZE + len(entry.body)
            if found and size > max_bytes:
                break
            found.append(entry)
        return tuple(found)

    def _send_compare(self, d: _Dispatcher, now: float) -> None:
        log = self.state.log
        if d.compare_index == -1 or not log.begin_index <= d.compare_index <= log.end_index:
            d.compare_index = log.end_index
        d.type = PushType.COMPARE
        d.outstanding = self._request(d, PushType.COMPARE, self._entries(d.compare_index, 1))
        self._send(d, d.outstanding, now)

    def _send_truncate(self, d: _Dispatcher, index: int, now: float) -> None:
        d.type = PushType.TRUNCATE
        d.outstanding = self._request(d, PushType.TRUNCATE, self._entries(index, 1))
        self._send(d, d.outstanding, now)

    def _to_compare(self, d: _Dispatcher, now: float) -> None:
        d.type = PushType.COMPARE
        d.compare_index = -1
        d.conflict_at = math.inf
        d.pending.clear()
        d.outstanding = None
        d.retry_at = now

    def _to_append(self, d: _Dispatcher, index: int) -> None:
        """The follower holds the leader's entries up to ``index``: push from index+1."""
        d.type = PushType.APPEND
        d.outstanding = None
        d.compare_index = -1
        d.conflict_at = math.inf
        d.pending.clear()
        d.write_index = index + 1
        d.watermark = max(d.watermark, index)
        self._advance_commit()

    def _pump_append(self, d: _Dispatcher, now: float) -> None:
        cfg = self.state.config
        end = self.state.log.end_index
        batch = cfg.max_batch_push_entries if cfg.enable_batch_push else 1
        begin = self.state.log.begin_index
        if d.write_index < begin or d.watermark + 1 < begin:
            # retention dropped what this follower still needed (a forced clean): COMPARE
            # finds out where it stands (the push at watermark+1 could not be sent again:
            # its entries are gone)
            self._to_compare(d, now)
            return
        while d.write_index <= end and len(d.pending) < cfg.max_in_flight_pushes:
            entries = self._entries(
                d.write_index, min(batch, end - d.write_index + 1), cfg.max_batch_push_bytes
            )
            d.pending[d.write_index] = (now, len(entries))
            self._send(d, self._request(d, PushType.APPEND, entries), now)
            d.write_index += len(entries)
        first = d.pending.get(d.watermark + 1)
        if first is not None and now >= first[0] + self._push_timeout():
            entries = self._entries(d.watermark + 1, first[1])
            d.pending[d.watermark + 1] = (now, len(entries))
            self._send(d, self._request(d, PushType.APPEND, entries), now)
        if d.write_index > end and now >= self._commit_push_at(d):
            self._send(d, self._request(d, PushType.COMMIT, ()), now)

    # --- answers ---------------------------------------------------------------------------

    def on_response(
        self, request: PushEntryRequest, response: PushEntryResponse, now: float
    ) -> None:
        d = self.dispatchers.get(request.remote_id)
        if d is None or request.term != self.leading_term:
            return
        code = response.code
        if request.type is PushType.APPEND:
            if code in (Code.SUCCESS, Code.REPEATED_PUSH) and request.entries:
                first = request.entries[0].index
                if d.pending.get(first, (0.0, 0))[1] == len(request.entries):
                    del d.pending[first]
                if request.entries[-1].index > d.watermark:
                    d.watermark = request.entries[-1].index
                    while d.pending:  # keys are in index order: drop the acknowledged ones
                        oldest = next(iter(d.pending))
                        if oldest > d.watermark:
                            break
                        del d.pending[oldest]
                    if d.type is PushType.APPEND:
                        d.write_index = max(d.write_index, d.watermark + 1)
                    self._advance_commit()
            elif code is Code.INCONSISTENT_STATE and d.type is PushType.APPEND:
                self._to_compare(d, now)
        elif request.type is PushType.COMMIT:
            if code is Code.INCONSISTENT_STATE and d.type is PushType.APPEND:
                self._to_compare(d, now)
        elif request is d.outstanding or request == d.outstanding:
            d.outstanding = None
            if request.type is PushType.TRUNCATE:
                if code is Code.SUCCESS:
                    if response.begin_index == request.entries[0].index > 0:
                        _log.info(
                            "member %s reset its log to begin at this log's entry %d",
                            d.peer,
                            response.begin_index,
                        )
                    self._to_append(d, request.entries[0].index)
                else:
                    self._stranded(d, response)
                    self._compare_later(d, now)
            else:
                self._on_compare(d, response, now)

    def on_failure(self, request: PushEntryRequest, now: float) -> None:
        d = self.dispatchers.get(request.remote_id)
        if d is None or request.term != self.leading_term:
            return
        if request.type in (PushType.COMPARE, PushType.TRUNCATE) and (
            request is d.outstanding or request == d.outstanding
        ):
            d.outstanding = None
            self._compare_later(d, now)

    def _stranded(self, d: _Dispatcher, response: PushEntryResponse) -> None:
        """Log (once per begin index) a follower that refused the TRUNCATE at this log's first
        entry while it ends before that entry.  A follower resets its log there when it can
        (entry_handler.py, "Reset"); it refuses while this leader's commit index is below that
        entry, when its data files cannot begin at the entry's position (another data file
        size), or when it does not take resets (``CoreConfig.log_reset``: a broker keeping a
        copy of the log it cannot drop).  The retries go on; the last two need an operator."""
        begin = self.state.log.begin_index
        if response.code is Code.INCONSISTENT_STATE and response.end_index < begin:
            if d.stranded_at != begin:
                d.stranded_at = begin
                _log.error(
                    "member %s ends at entry %d, before this log's first entry %d (the older "
                    "files were deleted) and refused to reset its log there (this leader's "
                    "commit index %d); retrying.  A member that takes no resets needs a "
                    "peer's store copied to it",
                    d.peer,
                    response.end_index,
                    begin,
                    self.state.committed_index,
                )

    def _compare_later(self, d: _Dispatcher, now: float) -> None:
        d.type = PushType.COMPARE
        d.retry_at = now + self._push_timeout() / 2

    def _on_compare(self, d: _Dispatcher, response: PushEntryResponse, now: float) -> None:
        log = self.state.log
        if response.code is Code.SUCCESS:
            if d.compare_index == response.end_index:
                self._to_append(d, d.compare_index)
            elif d.compare_index >= log.end_index or d.compare_index + 1 >= d.conflict_at:
                # what the follower holds after compare_index is not ours: drop it
                self._send_truncate(d, d.compare_index, now)
            else:
                # the follower grew since an earlier answer (or we stepped back past entries
                # we never saw differ): look higher before truncating anything it may have
                # acknowledged
                d.compare_index = min(response.end_index, log.end_index)
                self._send_compare(d, now)
            return
        if response.code is not Code.INCONSISTENT_STATE:
            self._compare_later(d, now)
            return
        truncate_index = -1
        if response.end_index < log.begin_index or response.begin_index > log.end_index:
            truncate_index = log.begin_index
        elif d.compare_index < response.begin_index:
            truncate_index = log.begin_index
        elif d.compare_index > response.end_index:
            d.compare_index = response.end_index
        else:
            d.conflict_at = min(d.conflict_at, d.compare_index)
            d.compare_index -= 1
        if d.compare_index < log.begin_index:
            truncate_index = log.begin_index
        if truncate_index != -1:
            self._send_truncate(d, truncate_index, now)
        else:
            self._send_compare(d, now)
