"""DLedger's entry, blank and index-unit formats, byte for byte: a sans-I/O codec.

The formats are those of openmessaging/dledger 0.3.1.2 (the version Apache RocketMQ 4.9.x runs:
``entry/DLedgerEntry.java``, ``entry/DLedgerEntryCoder.java``, ``store/file/MmapFileList.java``,
``store/file/DLedgerMmapFileStore.java``), and the one thing RocketMQ's ``DLedgerCommitLog``
(``store/dledger/DLedgerCommitLog.java`` in apache/rocketmq 4.9) adds: the CommitLog record in an
entry's body carries the entry's position + 48 as its PHYSICALOFFSET.  Everything here works on
bytes (``bytes``, ``bytearray``, ``memoryview``, an mmap): no files, no clock, so the file log
(mmap_file_store.py), the reader of Apache stores and the tests' fixture builders share one
decoder.

Data files (``<storePathRootDir>/dledger-<selfId>/data``, or ``storePathDLedgerCommitLog``),
named by the 20-digit absolute position they start at, hold entries back to back.  An entry is
a 48-byte header, big-endian, in ``DLedgerEntryCoder.encode``'s order, then the body::

    offset  size  field
         0     4  magic       1 (DLedgerMmapFileStore.MAGIC_1, the only one 0.3.1.2 knows)
         4     4  size        48 + body length, the whole entry
         8     8  index       the Raft index, from 0
        16     8  term
        24     8  pos         the entry's absolute position in the data files (POS_OFFSET 24)
        32     4  channel     reserved, 0
        36     4  chainCrc    not computed by 0.3.1.2: 0
        40     4  bodyCrc     not computed by 0.3.1.2: 0
        44     4  bodyLength  (DLedgerEntry.HEADER_SIZE is 44: the header without this field)
        48     n  body        (BODY_OFFSET 48)

An entry never straddles two files.  When an entry of ``size`` bytes would leave fewer than
``MIN_BLANK_LEN`` (8) bytes at a file's end, ``MmapFileList.preAppend`` fills the rest of the
file with a blank, ``int -1, int remaining`` then zeros, and the entry starts the next file
(raft/log.py's ``place_entry`` is that rule).  Beyond the last entry a file is zeros: a size of 0
is where DLedger's recovery stops.

Index files (``.../dledger-<selfId>/index``) hold one 32-byte unit per entry, entry ``i`` at byte
``i * 32`` (even after the head of the data files was deleted), in ``encodeIndex``'s order::

    int magic, long pos, int size, long index, long term

Records: in RocketMQ's DLedger mode every entry body is one CommitLog record
(``MessageDecoder``'s layout, common/message.py) whose PHYSICALOFFSET field (record byte 28,
``MessageDecoder.PHY_POS_POSITION``) is ``pos + 48``: DLedgerCommitLog's append hook writes it into
the encoded entry on the leader, before the bytes reach the file, so followers receive it as part
of the body.  ConsumeQueue units, the offset msgId and the message index all use that value.  A
store switched from classic to DLedger keeps its old CommitLog files below
``dividedCommitlogOffset`` (the first data file's start); :func:`classify` tells the three kinds of
thing a reader meets at a position apart, in the order ``DLedgerCommitLog.checkMessageAndReturnSize``
tests them.

No-op entries (:data:`NOOP_RECORD`): a new leader's entry of its term (Raft section 5.4.2 needs
one before older entries can commit).  0.3.1.2 has none (its leader appends nothing when it takes office) and its
recovery accepts magic 1 only: an entry of any other magic ends the log there, and everything
after it is truncated.  DLedger 0.4's ``DLedgerEntryType.NOOP`` (magic 2, empty body) is
therefore never written (:data:`NOOP_MAGIC_0_4` is here to recognise it in a store written by a
newer DLedger).  An empty body is a valid DLedger entry but not a valid RocketMQ one: the reput
of a 4.9 member reads a record at ``pos + 48``, finds the next entry's header there, and skips
the rest of what it read.  So the broker's no-op body is a CommitLog record that every reader
takes and no dispatcher indexes: topic ``rmq_sys_dledger_noop``, queue 0, no body, SYSFLAG
transaction type ROLLBACK, which RocketMQ's ConsumeQueue and index dispatchers skip
(``CommitLogDispatcherBuildConsumeQueue``, ``IndexService.buildIndex``) and ours too
(broker/store/dispatch.py); :func:`is_noop_body` recognises it (and the empty body of the
simulator's and the driver tests' logs), whatever its PHYSICALOFFSET (broker/dledger/README.md,
"No-op entry").
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

from broker.dledger.raft.log import BLANK_MAGIC_CODE, MIN_BLANK_LEN
from broker.dledger.raft.messages import ENTRY_HEADER_SIZE, ENTRY_MAGIC
from common.message import BLANK_MAGIC_CODE as COMMITLOG_BLANK_MAGIC_CODE
from common.message import (
    MESSAGE_MAGIC_CODE,
    PHYSICAL_OFFSET_POSITION,
    MessageExtBrokerInner,
    MessageSysFlag,
    RecordBuffer,
)
from common.message_encoder import encode_record

__all__ = [
    "BLANK",
    "BLANK_MAGIC_CODE",
    "BODY_OFFSET",
    "ENTRY_HEADER",
    "HEADER_SIZE",
    "INDEX_UNIT",
    "INDEX_UNIT_SIZE",
    "MAGIC_1",
    "MIN_BLANK_LEN",
    "NOOP_MAGIC_0_4",
    "NOOP_RECORD",
    "NOOP_TOPIC",
    "POS_OFFSET",
    "EntryFormatError",
    "EntryHeader",
    "IndexUnit",
    "Kind",
    "classify",
    "decode_entry",
    "decode_entry_header",
    "decode_index_unit",
    "encode_blank",
    "encode_entry",
    "encode_index_unit",
    "entry_problem",
    "is_noop_body",
    "patch_physical_offset",
    "physical_offset",
    "record_physical_offset",
]

# DLedgerEntry's constants
POS_OFFSET = 4 + 4 + 8 + 8
HEADER_SIZE = POS_OFFSET + 8 + 4 + 4 + 4
BODY_OFFSET = HEADER_SIZE + 4
# DLedgerMmapFileStore.MAGIC_1 (== CURRENT_MAGIC in 0.3.1.2)
MAGIC_1 = 1
# DLedgerEntryType.NOOP of openmessaging/dledger 0.4: recognised, never written
NOOP_MAGIC_0_4 = 2
# DLedgerMmapFileStore.INDEX_UNIT_SIZE
INDEX_UNIT_SIZE = 32

assert BODY_OFFSET == ENTRY_HEADER_SIZE and MAGIC_1 == ENTRY_MAGIC

# magic size index term pos channel chainCrc bodyCrc bodyLength
ENTRY_HEADER = struct.Struct(">iiqqqiiii")
# magic pos size index term
INDEX_UNIT = struct.Struct(">iqiqq")
# MmapFileList's blank: BLANK_MAGIC_CODE, the bytes left in the file (this blank included)
BLANK = struct.Struct(">ii")
_Q = struct.Struct(">q")
_II = struct.Struct(">ii")

assert ENTRY_HEADER.size == BODY_OFFSET and INDEX_UNIT.size == INDEX_UNIT_SIZE


class EntryFormatError(ValueError):
    """Bytes that are not a whole, self-consistent DLedger entry (or index unit) where one was
    expected."""


class EntryHeader(NamedTuple):
    """The header's fields in file order (``entry_index``: ``index`` is a tuple method)."""

    magic: int
    size: int
    entry_index: int
    term: int
    pos: int
    channel: int
    chain_crc: int
    body_crc: int
    body_length: int


class IndexUnit(NamedTuple):
    """An index unit's fields in file order."""

    magic: int
    pos: int
    size: int
    entry_index: int
    term: int


def encode_entry(
    index: int,
    term: int,
    pos: int,
    body: bytes,
    *,
    magic: int = MAGIC_1,
    channel: int = 0,
    chain_crc: int = 0,
    body_crc: int = 0,
) -> bytes:
    """``DLedgerEntryCoder.encode``: the header then the body, ``size`` = 48 + len(body)."""
    return (
        ENTRY_HEADER.pack(
            magic,
            BODY_OFFSET + len(body),
            index,
            term,
            pos,
            channel,
            chain_crc,
            body_crc,
            len(body),
        )
        + body
    )


def decode_entry_header(buf: RecordBuffer, offset: int = 0) -> EntryHeader:
    """The 48-byte header at ``offset`` as it is (no check: see :func:`entry_problem`)."""
    if offset < 0 or offset + BODY_OFFSET > len(buf):
        raise EntryFormatError(f"no room for an entry header at {offset} (buffer {len(buf)})")
    return EntryHeader._make(ENTRY_HEADER.unpack_from(buf, offset))


def entry_problem(header: EntryHeader, *, at: int | None = None) -> str | None:
    """What DLedger's recovery would refuse in this header, or None: magic 1, ``size`` =
    48 + bodyLength, ``size`` > 44 and, when ``at`` (the absolute position it was read at) is
    given, ``pos == at``."""
    if header.magic != MAGIC_1:
        return f"magic {header.magic} is not {MAGIC_1}"
    if header.size <= HEADER_SIZE or header.body_length + BODY_OFFSET != header.size:
        return f"size {header.size} != {BODY_OFFSET} + body length {header.body_length}"
    if at is not None and header.pos != at:
        return f"pos {header.pos} != {at}, where it was read"
    return None


def decode_entry(
    buf: RecordBuffer, offset: int = 0, *, at: int | None = None
) -> tuple[EntryHeader, bytes]:
    """The entry at ``offset``: its header and a copy of its body.  Raises EntryFormatError for
    anything :func:`entry_problem` refuses or a body past the buffer's end; ``at`` as there."""
    header = decode_entry_header(buf, offset)
    problem = entry_problem(header, at=at)
    if problem is not None:
        raise EntryFormatError(f"entry at {offset}: {problem}")
    end = offset + header.size
    if end > len(buf):
        raise EntryFormatError(f"entry at {offset} ends at {end}, past the buffer ({len(buf)})")
    return header, bytes(buf[offset + BODY_OFFSET : end])


def encode_index_unit(magic: int, pos: int, size: int, index: int, term: int) -> bytes:
    """``DLedgerEntryCoder.encodeIndex``: ``int magic, long pos, int size, long index, long term``."""
    return INDEX_UNIT.pack(magic, pos, size, index, term)


def decode_index_unit(buf: RecordBuffer, offset: int = 0) -> IndexUnit:
    if offset < 0 or offset + INDEX_UNIT_SIZE > len(buf):
        raise EntryFormatError(f"no room for an index unit at {offset} (buffer {len(buf)})")
    return IndexUnit._make(INDEX_UNIT.unpack_from(buf, offset))


def encode_blank(remaining: int) -> bytes:
    """The filler ``MmapFileList.preAppend`` writes over the ``remaining`` bytes left in a file:
    ``int -1, int remaining``, then zeros (it allocates the whole rest of the file)."""
    if remaining < MIN_BLANK_LEN:
        raise ValueError(f"a blank needs {MIN_BLANK_LEN} bytes, {remaining} left")
    return BLANK.pack(BLANK_MAGIC_CODE, remaining) + bytes(remaining - BLANK.size)


def physical_offset(pos: int) -> int:
    """The CommitLog offset of the record in the entry at ``pos`` (``pos + BODY_OFFSET``): its
    PHYSICALOFFSET field, its ConsumeQueue units, its offset msgId."""
    return pos + BODY_OFFSET


def patch_physical_offset(entry: bytearray | memoryview, offset: int = 0) -> int:
    """DLedgerCommitLog's append hook: write ``pos + 48`` (``pos`` read from the entry's own
    header) into the PHYSICALOFFSET field of the record in the body of the encoded entry at
    ``offset``; returns that value.  The body must be a record (at least 36 bytes)."""
    (pos,) = _Q.unpack_from(entry, offset + POS_OFFSET)
    phys = pos + BODY_OFFSET
    at = offset + BODY_OFFSET + PHYSICAL_OFFSET_POSITION
    if at + 8 > len(entry):
        raise EntryFormatError(f"entry at {offset}: the body is too short to be a record")
    _Q.pack_into(entry, at, phys)
    return phys


def record_physical_offset(buf: RecordBuffer, offset: int = 0) -> int:
    """The PHYSICALOFFSET field of the record in the body of the entry at ``offset``."""
    (phys,) = _Q.unpack_from(buf, offset + BODY_OFFSET + PHYSICAL_OFFSET_POSITION)
    return int(phys)


class Kind(enum.Enum):
    """What a reader of a DLedger CommitLog finds at a position."""

    # a DLedger entry: the record is at position + 48
    ENTRY = "entry"
    # MmapFileList's blank: the rest of the data file is empty, go on at the next file
    DLEDGER_BLANK = "dledger blank"
    # a record of the classic CommitLog (below dividedCommitlogOffset)
    RECORD = "record"
    # the classic CommitLog's end-of-file blank (TOTALSIZE, BLANK_MAGIC_CODE)
    RECORD_BLANK = "record blank"
    # zeros (or too few bytes): nothing was written here
    END = "end"


def classify(buf: RecordBuffer, offset: int = 0) -> Kind:
    """What starts at ``offset``, tested as ``DLedgerCommitLog.checkMessageAndReturnSize`` tests
    it: the second int is a classic record's magic code (an entry's ``size`` is small and
    positive, so the two cannot be confused); else a first int of -1 is DLedger's blank; else an
    entry.  Zeros (or fewer than 8 bytes) are the end of what was written."""
    if offset + 8 > len(buf):
        return Kind.END
    first, second = _II.unpack_from(buf, offset)
    if second == MESSAGE_MAGIC_CODE:
        return Kind.RECORD
    if second == COMMITLOG_BLANK_MAGIC_CODE:
        return Kind.RECORD_BLANK
    if first == BLANK_MAGIC_CODE:
        return Kind.DLEDGER_BLANK
    if first == 0 and second == 0:
        return Kind.END
    return Kind.ENTRY


# the no-op's record (see the module doc): "rmq_sys_" marks RocketMQ's system topics
NOOP_TOPIC = "rmq_sys_dledger_noop"
NOOP_RECORD = encode_record(
    MessageExtBrokerInner(
        topic=NOOP_TOPIC,
        queue_id=0,
        sys_flag=MessageSysFlag.TRANSACTION_ROLLBACK,
        born_host=("0.0.0.0", 0),
        store_host=("0.0.0.0", 0),
    ),
    0,
    0,
    0,
)
_PHYS_END = PHYSICAL_OFFSET_POSITION + 8


def is_noop_body(body: bytes | memoryview) -> bool:
    """A leader's no-op: the empty body, or :data:`NOOP_RECORD` with any PHYSICALOFFSET (the
    append hook wrote its position into it)."""
    n = len(body)
    if n == 0:
        return True
    return (
        n == len(NOOP_RECORD)
        and body[:PHYSICAL_OFFSET_POSITION] == NOOP_RECORD[:PHYSICAL_OFFSET_POSITION]
        and body[_PHYS_END:] == NOOP_RECORD[_PHYS_END:]
    )
