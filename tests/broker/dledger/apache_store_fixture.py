"""A store as Apache RocketMQ 4.9 in DLedger mode writes it, built byte by byte (no Java here).

Every byte follows the Java code that writes it, not our codec (broker/dledger/driver/
entry_coder.py), so decoding these files with our codec and reader checks both:

* the entry (``DLedgerEntryCoder.encode``, openmessaging/dledger 0.3.1.2): ``int magic=1, int
  size, long index, long term, long pos, int channel=0, int chainCrc=0, int bodyCrc=0, int
  bodyLength``, then the body; the index and term set in place by ``setIndexTerm``, the pos by
  ``setPos`` (``DLedgerMmapFileStore.appendAsLeader``);
* the body: the CommitLog record of ``DLedgerCommitLog``'s serializer with PHYSICALOFFSET
  written by its append hook at entry byte 48 + 28 as ``pos + 48``
  (``store/dledger/DLedgerCommitLog.java``, apache/rocketmq 4.9);
* placement (``MmapFileList.preAppend``): an entry that would leave fewer than 8 bytes in the
  file goes to the next one, the rest of the file becoming ``int -1, int remaining``, zeros;
* the index unit (``encodeIndex``): ``int magic, long pos, int size, long index, long term`` at
  ``index * 32`` of 160 MiB index files (``mappedFileSizeForEntryIndex``);
* ``checkpoint`` and ``currterm`` (``IOUtils.properties2String``: ``key=value`` lines);
* the ConsumeQueue unit (``ConsumeQueue.putMessagePositionInfo``): ``long offset, int size, long
  tagsCode`` at ``queueOffset * 20``, written by the reput for committed entries only;
* the store checkpoint (``StoreCheckpoint``): three longs in a 4 KiB file;
* for a classic store switched to DLedger: classic records at their own offsets, then, at the
  switch, ``DLedgerCommitLog.recover`` closes the last CommitLog file with ``int remaining, int
  BLANK_MAGIC_CODE`` at its write position and DLedger's first data file starts at that file's
  end (``dividedCommitlogOffset``).
"""

from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path

import attrs

from common.message import MessageExtBrokerInner
from common.message_encoder import encode_record

INDEX_FILE_SIZE = 32 * 5 * 1024 * 1024  # DLedgerConfig.mappedFileSizeForEntryIndex
CHECKPOINT_SIZE = 4096  # StoreCheckpoint: OS_PAGE_SIZE
COMMITLOG_BLANK_MAGIC = 0xCBD43194 - (1 << 32)  # CommitLog.BLANK_MAGIC_CODE
PHY_POS_POSITION = 4 + 4 + 4 + 4 + 4 + 8  # MessageDecoder.PHY_POS_POSITION


def java_hash(text: str) -> int:
    """``String.hashCode`` (the tagsCode of a message with one tag)."""
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def offset_msg_id(host: tuple[str, int], offset: int) -> str:
    """``MessageDecoder.createMessageId`` for an IPv4 store host."""
    return (socket.inet_aton(host[0]) + struct.pack(">iq", host[1], offset)).hex().upper()


@attrs.frozen
class Sent:
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    offset: int  # the CommitLog offset: PHYSICALOFFSET, the CQ unit's, the msgId's
    size: int
    msg_id: str
    entry_index: int  # -1 for a classic record
    committed: bool


def _file(directory: Path, start: int, size: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{start:020d}"
    if not path.exists():
        with open(path, "wb") as f:
            f.truncate(size)  # a mapped file is its full size from the start, zeros
    return path


def _write(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


@attrs.define
class ApacheDLedgerStore:
    """Writes ``<root>`` as a 4.9 DLedger member ``self_id`` would leave it after a clean stop."""

    root: Path
    file_size: int = 64 * 1024  # mappedFileSizeCommitLog: classic and DLedger data files
    cq_file_size: int = 20 * 1000  # mappedFileSizeConsumeQueue
    self_id: str = "n0"
    store_host: tuple[str, int] = ("10.0.0.7", 10911)
    born_host: tuple[str, int] = ("10.0.0.9", 50000)
    term: int = 1
    # where DLedger's data files go: storePathDLedgerCommitLog, or None for dledger-<id>/data
    data_dir: Path | None = None
    sent: list[Sent] = attrs.field(factory=list)
    _queue_offsets: dict[tuple[str, int], int] = attrs.field(factory=dict)
    _classic_end: int = 0  # the classic CommitLog's write position (absolute)
    _data_start: int | None = None  # dividedCommitlogOffset once DLedger started
    _write_pos: int = 0  # DLedger's data end (absolute)
    _next_index: int = 0
    _committed_index: int = -1
    _clock: int = 1_700_000_000_000
    _topics: set[str] = attrs.field(factory=set)

    @property
    def member_dir(self) -> Path:
        return self.root / f"dledger-{self.self_id}"

    @property
    def dledger_data_dir(self) -> Path:
        return self.data_dir or self.member_dir / "data"

    @property
    def divided_commitlog_offset(self) -> int:
        assert self._data_start is not None
        return self._data_start

    def _record(self, topic: str, queue_id: int, body: bytes, tags: str) -> tuple[bytes, int]:
        key = (topic, queue_id)
        qoff = self._queue_offsets.get(key, 0)
        self._queue_offsets[key] = qoff + 1
        self._topics.add(topic)
        self._clock += 7
        msg = MessageExtBrokerInner(
            topic=topic,
            queue_id=queue_id,
            body=body,
            properties={"TAGS": tags, "UNIQ_KEY": f"U{len(self.sent):08d}", "KEYS": f"k{qoff}"},
            born_timestamp=self._clock - 3,
            born_host=self.born_host,
            store_host=self.store_host,
        )
        return encode_record(msg, qoff, 0, self._clock), qoff

    def _cq_unit(
        self, topic: str, queue_id: int, qoff: int, offset: int, size: int, tags: str
    ) -> None:
        at = qoff * 20
        start = at - at % self.cq_file_size
        path = _file(self.root / "consumequeue" / topic / str(queue_id), start, self.cq_file_size)
        _write(path, at - start, struct.pack(">qiq", offset, size, java_hash(tags)))

    # --- the classic CommitLog (a store before its switch to DLedger) -------------------------
    def send_classic(self, topic: str, queue_id: int, body: bytes, tags: str = "a") -> Sent:
        assert self._data_start is None, "already switched to DLedger"
        record, qoff = self._record(topic, queue_id, body, tags)
        used = self._classic_end % self.file_size
        if len(record) + 8 > self.file_size - used:  # CommitLog.doAppend: END_FILE_MIN_BLANK
            path = _file(self.root / "commitlog", self._classic_end - used, self.file_size)
            remaining = self.file_size - used
            _write(path, used, struct.pack(">ii", remaining, COMMITLOG_BLANK_MAGIC))
            self._classic_end += remaining
            used = 0
        offset = self._classic_end
        path = _file(self.root / "commitlog", offset - used, self.file_size)
        patched = bytearray(record)
        struct.pack_into(">q", patched, PHY_POS_POSITION, offset)
        _write(path, used, bytes(patched))
        self._classic_end += len(record)
        self._cq_unit(topic, queue_id, qoff, offset, len(record), tags)
        sent = Sent(
            topic,
            queue_id,
            qoff,
            body,
            offset,
            len(record),
            offset_msg_id(self.store_host, offset),
            -1,
            True,
        )
        self.sent.append(sent)
        return sent

    def _start_dledger(self) -> None:
        if self._data_start is not None:
            return
        if self._classic_end:
            # DLedgerCommitLog.recover: the last classic file is closed with a BLANK record at
            # its write position; DLedger starts at the next file boundary
            used = self._classic_end % self.file_size
            start = self._classic_end - used
            if used:
                path = self.root / "commitlog" / f"{start:020d}"
                remaining = self.file_size - used
                _write(path, used, struct.pack(">ii", remaining, COMMITLOG_BLANK_MAGIC))
                self._data_start = start + self.file_size
            else:
                self._data_start = self._classic_end
        else:
            self._data_start = 0
        self._write_pos = self._data_start
        _file(self.dledger_data_dir, self._data_start, self.file_size)

    # --- DLedger ------------------------------------------------------------------------------
    def send(
        self, topic: str, queue_id: int, body: bytes, tags: str = "a", *, commit: bool = True
    ) -> Sent:
        """One message as the leader appends it (``appendAsLeader`` with the append hook), its
        index unit, and, when committed, its ConsumeQueue unit (the reput's)."""
        self._start_dledger()
        record, qoff = self._record(topic, queue_id, body, tags)
        size = 48 + len(record)
        used = self._write_pos % self.file_size
        if size + 8 > self.file_size - used:  # MmapFileList.preAppend
            path = self.dledger_data_dir / f"{self._write_pos - used:020d}"
            remaining = self.file_size - used
            blank = struct.pack(">ii", -1, remaining) + bytes(remaining - 8)
            _write(path, used, blank)
            self._write_pos += remaining
            used = 0
        pos = self._write_pos
        index = self._next_index
        entry = bytearray(
            struct.pack(
                ">iiqqqiiii",
                1,  # magic: MAGIC_1
                size,
                index,
                self.term,
                pos,
                0,  # channel
                0,  # chainCrc
                0,  # bodyCrc
                len(record),  # body length
            )
        )
        entry += record
        struct.pack_into(">q", entry, 48 + PHY_POS_POSITION, pos + 48)  # the append hook
        path = _file(self.dledger_data_dir, pos - used, self.file_size)
        _write(path, used, bytes(entry))
        index_at = index * 32
        index_start = index_at - index_at % INDEX_FILE_SIZE
        ipath = _file(self.member_dir / "index", index_start, INDEX_FILE_SIZE)
        _write(ipath, index_at - index_start, struct.pack(">iqiqq", 1, pos, size, index, self.term))
        self._write_pos += size
        self._next_index += 1
        if commit:
            self._committed_index = index
            self._cq_unit(topic, queue_id, qoff, pos + 48, len(record), tags)
        sent = Sent(
            topic,
            queue_id,
            qoff,
            body,
            pos + 48,
            len(record),
            offset_msg_id(self.store_host, pos + 48),
            index,
            commit,
        )
        self.sent.append(sent)
        return sent

    def new_term(self) -> None:
        self.term += 1

    def close(self) -> None:
        """What a clean stop leaves: the member's ``checkpoint`` and ``currterm``, the store
        checkpoint and the topic config (no ``abort`` file)."""
        self.member_dir.mkdir(parents=True, exist_ok=True)
        # Properties is a Hashtable: its order is not the insertion order
        (self.member_dir / "checkpoint").write_text(
            f"committedIndex={self._committed_index}\nendIndex={self._next_index - 1}\n"
        )
        (self.member_dir / "currterm").write_text(
            f"currTerm={self.term}\nvoteLeader={self.self_id}\n"
        )
        checkpoint = struct.pack(">qqq", self._clock, self._clock, self._clock)
        (self.root / "checkpoint").write_bytes(checkpoint + bytes(CHECKPOINT_SIZE - 24))
        config = self.root / "config"
        config.mkdir(exist_ok=True)
        table = {
            t: {
                "order": False,
                "perm": 6,
                "readQueueNums": 4,
                "topicFilterType": "SINGLE_TAG",
                "topicName": t,
                "topicSysFlag": 0,
                "writeQueueNums": 4,
            }
            for t in sorted(self._topics)
        }
        body = {"dataVersion": {"counter": 1, "timestamp": self._clock}, "topicConfigTable": table}
        (config / "topics.json").write_text(json.dumps(body, indent=4))

    def committed(self) -> list[Sent]:
        return [s for s in self.sent if s.committed]


def data_files(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


# the queues the tests spread messages over, and a spread of body sizes
TOPICS = [("TopicA", 0), ("TopicA", 1), ("TopicB", 0), ("TopicC", 3)]


def fill(store: ApacheDLedgerStore, n: int, *, classic: bool = False, start: int = 0) -> None:
    """``n`` messages round the TOPICS queues, in DLedger entries or (``classic``) in the
    classic CommitLog of a store about to be switched."""
    for i in range(start, start + n):
        topic, qid = TOPICS[i % len(TOPICS)]
        body = bytes([i % 251]) * (40 + (i * 97) % 900)
        if classic:
            store.send_classic(topic, qid, body, tags=f"t{i % 3}")
        else:
            store.send(topic, qid, body, tags=f"t{i % 3}")
