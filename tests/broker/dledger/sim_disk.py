"""The simulated disk under a DLedger member's log: page cache versus what a flush made durable.

The real file log (broker/dledger/driver/mmap_file_store.py) writes entries into memory maps:
a write survives a process crash (the page cache keeps it) but not a power cut until the
node's flush task has fdatasynced it (every ``flushFileInterval``).  :class:`DiskLog` keeps
the same two levels over the checked in-memory log:

* ``append``/``append_entry`` put entries in the page cache (``flushed`` does not move);
* ``flush`` makes everything written so far durable;
* ``reset`` is durable at once (the file log syncs it before it returns);
* ``drop_head`` (retention) keeps a flushed first entry;
* ``truncate`` is taken as durable at once (a simplification: the real store zeroes the cut
  bytes in the map, and a power cut before the next flush could show the old tail again --
  entries the member held before, which Raft tolerates as long as acks name only flushed
  entries, the rule this model exists to check);
* ``power_cut`` drops every unflushed entry except a prefix of them the kernel may already
  have written back (``torn``): recovery keeps whole entries up to the first torn one, so what
  survives is always a prefix of the log.

Hard state (``currterm``) is written with fsync + rename before anything after it runs
(driver/state_files.py), so a power cut never loses a PersistState the simulator executed.
"""

from __future__ import annotations

import random

import attrs

from broker.dledger.raft.log import MemoryLog
from broker.dledger.raft.messages import Entry
from tests.broker.dledger.sim_checker import CheckedLog

__all__ = ["DiskLog"]


@attrs.define(eq=False)
class DiskLog(CheckedLog):
    # last durable index: entries up to here survive a power cut
    flushed: int = -1
    # entries a power cut took, over the whole run
    lost: int = 0

    @property
    def unflushed(self) -> int:
        return self.end_index - max(self.flushed, self.begin_index - 1)

    def flush(self) -> None:
        self.flushed = self.end_index

    def truncate(self, index: int) -> None:
        super().truncate(index)
        self.flushed = min(self.flushed, self.end_index)

    def reset(self, first: Entry) -> None:
        super().reset(first)
        self.flushed = self.end_index  # FileLog.reset syncs before it returns

    def drop_head(self, upto: int) -> int:
        # the new first entry must be on disk (FileLog.drop_head)
        return super().drop_head(min(upto, self.flushed))

    def power_cut(self, rng: random.Random) -> int:
        """Lose the unflushed tail but a random written-back prefix of it; returns how many
        entries went."""
        tail = self.unflushed
        if tail <= 0:
            return 0
        kept = rng.randint(0, tail) if rng.random() < 0.5 else 0
        gone = tail - kept
        if gone:
            # below the checker: losing data is not a truncation the core asked for
            MemoryLog.truncate(self, self.end_index - gone + 1)
            self.lost += gone
        self.flushed = self.end_index
        return gone

    def durable(self, entry: Entry) -> bool:
        return entry.index <= self.flushed
