"""IndexFile / IndexService: the key -> CommitLog offset hash index behind QUERY_MESSAGE.

Theory of operation
-------------------
An index file (``store/index/IndexFile.java``) is a 40-byte header (beginTimestamp, endTimestamp,
beginPhyOffset, endPhyOffset, hashSlotCount, indexCount), ``max_hash_slot_num`` 4-byte slots and
``max_index_num`` 20-byte entries ``(int keyHash, long phyOffset, int timeDiffSeconds, int
prevIndex)``.  A key ``topic#key`` hashes (``abs(String.hashCode)``) to a slot holding the number of
the newest entry with that hash; each entry links to the previous one, so a lookup walks one chain
from newest to oldest.  Entry 0 is never used (0 = "no entry"), so ``indexCount`` starts at 1.  When
a file is full a new one is started; files are named by their creation time (``yyyyMMddHHmmssSSS``)
and queried newest first.

Only the hash is stored, so the store verifies every candidate against the record's topic and
keys before returning it (this also drops entries that point past a CommitLog truncated by
recovery).

Recovery (``IndexService.recover``, see recovery.py): the header is written when the file is
flushed, so after a kill the header's ``indexCount`` lags the entries in the map, and slots may
point at entries past it.  Entries are added in CommitLog order, and the checkpoint's
``dispatched`` offset is where the re-dispatch starts, so the newest file (and older ones only
if it keeps nothing) is cut back to the entries of records below ``dispatched``: its written
end is found by walking from the header's count to the first all-zero entry, every slot that
points at a dropped entry is moved down its own chain to the newest kept one, and the dropped
entries are zeroed (invariant: entries past the count are zero, except those written since the
last header flush).  The re-dispatch then appends them again and every chain stays whole.  This
reads the entries written since the checkpoint only; RocketMQ instead deletes index files
newer than its checkpoint's index timestamp.
Index pages are released from RSS after each flush like the CommitLog's (mapped_file.py),
except the slot table of the file being written: every put reads and writes one slot at random,
so a released table faulted back one page per put (issue 28).  It is at most
``max_hash_slot_num * 4`` bytes (20 MB by default); it goes with the next flush once the file is
full, and when the store goes quiet (flush.py).
"""

from __future__ import annotations

import logging
import os
import struct
import time
from collections.abc import Iterable, Sequence

from broker.store.mapped_file import MappedFile
from common.string_hash import java_string_hash, java_string_hash_concat

log = logging.getLogger(__name__)

HEADER = struct.Struct(">qqqqii")
HEADER_SIZE = 40
SLOT = struct.Struct(">i")
ENTRY = struct.Struct(">iqii")
ENTRY_SIZE = 20


def slot_hash(java_hash: int) -> int:
    """``IndexFile.indexKeyHashMethod`` from a key's Java hash: abs, with MIN_VALUE -> 0."""
    h = abs(java_hash)
    return 0 if h > 0x7FFFFFFF else h


def key_hash(key: str) -> int:
    return slot_hash(java_string_hash(key))


def topic_key_hash(topic: str, key: str) -> int:
    """``key_hash(topic + "#" + key)`` without building the string (prefix hash cached)."""
    return slot_hash(java_string_hash_concat(topic + "#", key))


class IndexFile:
    def __init__(self, path: str, slot_num: int, index_num: int, *, create: bool):
        self.slot_num = slot_num
        self.index_num = index_num
        size = HEADER_SIZE + slot_num * SLOT.size + index_num * ENTRY_SIZE
        self.mf = MappedFile(path, 0, size, create=create)
        try:
            # the header and slot table are written anywhere at once, so they get their blocks
            # up front; the entries get theirs as they grow (mapped_file.py, disk space)
            self.mf.reserve_blocks(HEADER_SIZE + slot_num * SLOT.size)
        except OSError:
            self.mf.destroy() if create else self.mf.close()
            raise
        self.mf.wrote = size
        b = HEADER.unpack_from(self.mf.view, 0)
        self.begin_ts, self.end_ts, self.begin_phy, self.end_phy, self.slot_count, self.count = b
        if self.count <= 0:
            self.count = 1
        self.dirty = False
        # every put reads and writes a slot at random: the table of the file being written
        # stays mapped across flushes (one page fault per put otherwise); a full file's goes
        self._pin_slots()

    def _pin_slots(self) -> None:
        full = self.count >= self.index_num
        self.mf.pinned = 0 if full else HEADER_SIZE + self.slot_num * SLOT.size

    @property
    def path(self) -> str:
        return self.mf.path

    @property
    def is_full(self) -> bool:
        return self.count >= self.index_num

    def _write_header(self) -> None:
        HEADER.pack_into(
            self.mf.view,
            0,
            self.begin_ts,
            self.end_ts,
            self.begin_phy,
            self.end_phy,
            self.slot_count,
            self.count,
        )

    def put_key(self, key: str, phy: int, store_ts: int) -> bool:
        return self.put_hash(key_hash(key), phy, store_ts)

    def put_hash(self, h: int, phy: int, store_ts: int) -> bool:
        """Add an entry for a key whose ``key_hash`` is ``h``; False when the file is full."""
        if self.count >= self.index_num:
            return False
        slot_pos = HEADER_SIZE + (h % self.slot_num) * SLOT.size
        view = self.mf.view
        (prev,) = SLOT.unpack_from(view, slot_pos)
        if prev <= 0 or prev > self.count:
            prev = 0
        if self.begin_ts <= 0:
            diff = 0
        else:
            diff = min(max((store_ts - self.begin_ts) // 1000, 0), 0x7FFFFFFF)
        pos = HEADER_SIZE + self.slot_num * SLOT.size + self.count * ENTRY_SIZE
        if pos + ENTRY_SIZE > self.mf.allocated:
            self.mf.reserve_blocks(pos + ENTRY_SIZE)
        ENTRY.pack_into(view, pos, h, phy, diff, prev)
        SLOT.pack_into(view, slot_pos, self.count)
        if self.count <= 1:
            self.begin_phy = phy
            self.begin_ts = store_ts
        if prev == 0:
            self.slot_count += 1
        self.count += 1
        if self.count >= self.index_num:
            self._pin_slots()
        self.end_phy = phy
        self.end_ts = store_ts
        # the header is written when flushed (flush_jobs) and closed; a crash loses at most
        # the entries after the last flush, which the re-dispatch from the checkpoint re-adds
        self.dirty = True
        return True

    def put_entries(self, entries: Sequence[tuple[int, int]], start: int, store_ts: int) -> int:
        """``put_hash`` for ``entries[start:]`` ((hash, phy) pairs, one store time) until the
        file is full; returns the index of the first entry not added."""
        view = self.mf.view
        slot_num = self.slot_num
        base = HEADER_SIZE + slot_num * SLOT.size
        count = self.count
        limit = self.index_num
        if self.begin_ts <= 0:
            diff = 0
        else:
            diff = min(max((store_ts - self.begin_ts) // 1000, 0), 0x7FFFFFFF)
        slot_unpack, slot_pack, entry_pack = SLOT.unpack_from, SLOT.pack_into, ENTRY.pack_into
        new_slots = 0
        i, n = start, len(entries)
        end = base + min(count + n - start, limit) * ENTRY_SIZE
        if end > self.mf.allocated:
            self.mf.reserve_blocks(end)
        while i < n and count < limit:
            h, phy = entries[i]
            slot_pos = HEADER_SIZE + (h % slot_num) * 4
            (prev,) = slot_unpack(view, slot_pos)
            if prev <= 0 or prev > count:
                prev = 0
                new_slots += 1
            entry_pack(view, base + count * ENTRY_SIZE, h, phy, diff, prev)
            slot_pack(view, slot_pos, count)
            if count <= 1:
                self.begin_phy = phy
                self.begin_ts = store_ts
            count += 1
            self.end_phy = phy
            i += 1
        if i > start:
            self.count = count
            self.slot_count += new_slots
            self.end_ts = store_ts
            self.dirty = True
            if count >= limit:
                self._pin_slots()
        return i

    def entry(self, i: int) -> tuple[int, int, int, int]:
        return ENTRY.unpack_from(self.mf.view, self._entries_base + i * ENTRY_SIZE)

    @property
    def _entries_base(self) -> int:
        return HEADER_SIZE + self.slot_num * SLOT.size

    def cut(self, dispatched: int) -> int:
        """Crash recovery: keep only entries of records below ``dispatched``; returns how many
        written entries were dropped.  Reads only the entries written after the header's last
        flush and those it drops, never the whole file (see the module docstring)."""
        view = self.mf.view
        zero = bytes(ENTRY_SIZE)
        base = self._entries_base
        # the written end: entries past the flushed header's count that a kill left in the map
        end = max(self.count, 1)
        while (
            end < self.index_num
            and view[base + end * ENTRY_SIZE : base + (end + 1) * ENTRY_SIZE] != zero
        ):
            end += 1
        keep = end
        while keep > 1 and self.entry(keep - 1)[1] >= dispatched:
            keep -= 1
        if keep == end:
            if end != self.count:
                self.count = end
                self._set_end(end)
            return 0
        # slots pointing at a dropped entry fall back to the newest kept entry of their chain
        for i in range(keep, end):
            h = self.entry(i)[0]
            slot_pos = HEADER_SIZE + (h % self.slot_num) * SLOT.size
            (cur,) = SLOT.unpack_from(view, slot_pos)
            if cur < keep:
                continue
            while cur >= keep:
                prev = self.entry(cur)[3]
                cur = prev if 0 < prev < cur else 0
            SLOT.pack_into(view, slot_pos, cur)
            if cur == 0:
                self.slot_count = max(self.slot_count - 1, 0)
        view[base + keep * ENTRY_SIZE : base + end * ENTRY_SIZE] = bytes((end - keep) * ENTRY_SIZE)
        self.count = keep
        self._set_end(keep)
        return end - keep

    def _set_end(self, count: int) -> None:
        if count <= 1:
            self.begin_ts = self.end_ts = self.begin_phy = self.end_phy = 0
        else:
            _, phy, diff, _ = self.entry(count - 1)
            self.end_phy = phy
            self.end_ts = max(
                self.end_ts if self.end_phy == phy else 0, self.begin_ts + diff * 1000
            )
        self._write_header()
        self.dirty = True

    def time_matched(self, begin: int, end: int) -> bool:
        return (
            (begin < self.begin_ts and end > self.end_ts)
            or self.begin_ts <= begin <= self.end_ts
            or self.begin_ts <= end <= self.end_ts
        )

    def select(self, key: str, max_num: int, begin: int, end: int, out: list[int]) -> None:
        h = key_hash(key)
        view = self.mf.view
        (cur,) = SLOT.unpack_from(view, HEADER_SIZE + (h % self.slot_num) * SLOT.size)
        if cur <= 0 or cur >= self.count:
            return
        base = HEADER_SIZE + self.slot_num * SLOT.size
        while len(out) < max_num:
            kh, phy, diff, prev = ENTRY.unpack_from(view, base + cur * ENTRY_SIZE)
            if diff < 0:
                break
            t = self.begin_ts + diff * 1000
            if kh == h and begin <= t <= end:
                out.append(phy)
            if prev <= 0 or prev >= self.count or prev == cur or t < begin:
                break
            cur = prev


class IndexService:
    def __init__(self, index_dir: str, slot_num: int, index_num: int):
        self.dir = index_dir
        self.slot_num = slot_num
        self.index_num = index_num
        self.files: list[IndexFile] = []
        # puts whose entries the filesystem could not take (``_lost``)
        self.entries_lost = 0

    def load(self) -> None:
        if not os.path.isdir(self.dir):
            return
        for name in sorted(os.listdir(self.dir)):
            if not name.isdigit():
                continue
            try:
                self.files.append(
                    IndexFile(
                        os.path.join(self.dir, name), self.slot_num, self.index_num, create=False
                    )
                )
            except OSError as exc:  # a different slot/index size: leave it alone
                log.warning("ignoring index file %s: %s", name, exc)

    def recover(self, dispatched: int) -> int:
        """Drop entries of records at or past ``dispatched`` (the re-dispatch from there adds
        them again, in order); newest file first, stopping at the first that keeps one."""
        dropped = 0
        for f in reversed(self.files):
            dropped += f.cut(dispatched)
            if f.count > 1:
                break
        return dropped

    def _writable(self) -> IndexFile:
        if self.files and not self.files[-1].is_full:
            return self.files[-1]
        os.makedirs(self.dir, exist_ok=True)
        now = time.time()
        name = time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"
        path = os.path.join(self.dir, name)
        while os.path.exists(path) or (self.files and path <= self.files[-1].path):
            name = str(int(name) + 1)
            path = os.path.join(self.dir, name)
        f = IndexFile(path, self.slot_num, self.index_num, create=True)
        self.files.append(f)
        return f

    def put(self, keys: Iterable[str], phy: int, store_ts: int) -> None:
        """Entries for ``topic#key`` strings (the reput path).  Hashed as topic prefix + key:
        a topic name has no ``#``, and the prefix's hash (and the head shared by the UNIQ_KEYs
        of one producer) is cached, so this is a third of hashing the whole string."""
        hashes = []
        for k in keys:
            topic, sep, key = k.partition("#")
            hashes.append(topic_key_hash(topic, key) if sep else key_hash(k))
        self.put_hashes(hashes, phy, store_ts)

    def put_hashes(self, hashes: Iterable[int], phy: int, store_ts: int) -> None:
        """Entries for keys given by their ``key_hash`` (the put path hashes without strings)."""
        files = self.files
        try:
            for h in hashes:
                f = files[-1] if files else None
                if f is None or f.count >= f.index_num:
                    f = self._writable()
                if not f.put_hash(h, phy, store_ts):  # pragma: no cover - fullness checked
                    log.error("index put failed at %d", phy)
        except OSError as exc:
            self._lost(exc, phy)

    def put_entries(self, entries: Sequence[tuple[int, int]], store_ts: int) -> None:
        """Entries ``(key_hash, phy)`` of records stored at ``store_ts``, in CommitLog order."""
        i, n = 0, len(entries)
        files = self.files
        try:
            while i < n:
                f = files[-1] if files else None
                if f is None or f.count >= f.index_num:
                    f = self._writable()
                i = f.put_entries(entries, i, store_ts)
        except OSError as exc:
            self._lost(exc, entries[i][1])

    def _lost(self, exc: OSError, phy: int) -> None:
        """The filesystem could not back index entries (a full disk).  The index only speeds up
        queries by key, so the entries are skipped, as RocketMQ does after its retries, rather
        than holding back the consume queues: a query by key misses those records."""
        self.entries_lost += 1
        if self.entries_lost == 1 or self.entries_lost % 10_000 == 0:
            log.error(
                "index entries lost (%d times so far), from %d: %s", self.entries_lost, phy, exc
            )

    def take_expired(self, commit_log_min: int) -> list[IndexFile]:
        """Take the index files (never the last) whose every entry points below the CommitLog's
        new start; their entries could only name deleted records."""
        count = 0
        for f in self.files[:-1]:
            if f.end_phy >= commit_log_min or f.dirty:  # (a flush job may hold it)
                break
            count += 1
        taken, self.files = self.files[:count], self.files[count:]
        return taken

    @property
    def last_update(self) -> tuple[int, int]:
        if not self.files:
            return 0, 0
        f = self.files[-1]
        return f.end_ts, f.end_phy

    def query(self, key: str, max_num: int, begin: int, end: int) -> list[int]:
        out: list[int] = []
        for f in reversed(self.files):
            if len(out) >= max_num:
                break
            if f.count > 1 and f.time_matched(begin, end):
                f.select(key, max_num, begin, end, out)
        return out

    def flush_jobs(self) -> list[MappedFile]:
        jobs = []
        for f in self.files:
            if f.dirty:
                f._write_header()
                f.dirty = False
                f.mf.flushed = 0
                jobs.append(f.mf)
        return jobs

    def close(self) -> None:
        for f in self.files:
            if f.dirty:
                f._write_header()
            f.mf.close()
