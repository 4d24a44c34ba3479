"""StoreCheckpoint: the small file that tells recovery where to start after a crash.

Theory of operation
-------------------
RocketMQ's ``checkpoint`` holds three longs: physicMsgTimestamp (0), logicsMsgTimestamp (8) and
indexMsgTimestamp (16).  We keep those and add, in the same 4 KiB block, what our recovery
actually keys on, so no timestamp guesswork is needed:

* 24: ``commit_log_flushed``: every CommitLog byte below it was fdatasync'ed.
* 32: ``dispatched``: a record boundary (or segment start) with ``dispatched <=
  commit_log_flushed``; every record below it has its ConsumeQueue units and index entries
  flushed.  Recovery validates the CommitLog from exactly here and the dispatcher restarts here
  (re-dispatching is idempotent), see recovery.py; after a clean stop it is the log's end.
* 40: CRC32 of bytes 0..40, so a torn or foreign file reads as "no checkpoint" (recover from
  the first segment) instead of as wrong numbers.

The file is rewritten whole with ``pwrite`` + ``fsync`` from the flush task's worker thread.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib

import attrs

_FIELDS = struct.Struct(">qqqqq")
_CRC = struct.Struct(">I")
FILE_SIZE = 4096

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class StoreCheckpoint:
    path: str
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    commit_log_flushed: int = 0
    dispatched: int = 0
    # True when the file existed and its CRC matched
    valid: bool = False

    @classmethod
    def load(cls, path: str) -> StoreCheckpoint:
        cp = cls(path)
        try:
            with open(path, "rb") as f:
                data = f.read(FILE_SIZE)
        except FileNotFoundError:
            data = b""
        # the file's block is taken now, while there is room: a checkpoint written later on a
        # full disk then rewrites that block instead of needing a new one (a zero-filled new
        # file fails the CRC below, so it reads as missing, as before)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, FILE_SIZE)
        except OSError as exc:
            log.warning("cannot reserve the checkpoint file %s: %s", path, exc)
        finally:
            os.close(fd)
        if not data:
            return cp
        if len(data) >= _FIELDS.size + _CRC.size:
            (crc,) = _CRC.unpack_from(data, _FIELDS.size)
            if crc == zlib.crc32(data[: _FIELDS.size]):
                (
                    cp.physic_msg_timestamp,
                    cp.logics_msg_timestamp,
                    cp.index_msg_timestamp,
                    cp.commit_log_flushed,
                    cp.dispatched,
                ) = _FIELDS.unpack_from(data, 0)
                cp.valid = True
        return cp

    def encode(self) -> bytes:
        head = _FIELDS.pack(
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.commit_log_flushed,
            self.dispatched,
        )
        return (head + _CRC.pack(zlib.crc32(head))).ljust(FILE_SIZE, b"\0")

    def write(self, data: bytes) -> None:
        """Blocking write + fsync of ``encode()``'s bytes; run it in a worker thread."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
