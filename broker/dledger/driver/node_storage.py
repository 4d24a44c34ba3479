"""Where a member keeps what must survive it besides the log: ``currterm``, ``checkpoint``, and
how its log is flushed, closed and its disk measured.  Files for real, memory for tests.

Theory of operation
-------------------
The driver (node.py) sees a :class:`NodeStorage`; every method is async because the file one
does its I/O in a worker thread (fsync must not stall the Trio loop).  :class:`FileStorage`
keeps DLedger's files in ``<store_base_dir>/dledger-<selfId>`` through state_files.py (fsync,
then an atomic replace) and flushes and closes the file log of mmap_file_store.py; a log of another
kind (the in-memory one) has nothing to flush.  :class:`MemoryStorage` keeps the same state in
fields, takes ``save_delay`` seconds of Trio's clock per save (so tests under ``autojump_clock``
can see what waits for a save), records every save in order, and reports whatever disk use a
test sets.

Invariant (both): ``load`` returns the last hard state whose ``save_hard_state`` returned.
"""

from __future__ import annotations

import os
import shutil
from typing import Protocol

import attrs
import trio

from broker.dledger.driver.entry_json import forget_renderings
from broker.dledger.driver.mmap_file_store import FileLog, open_file_log
from broker.dledger.driver.node_config import DLedgerConfig
from broker.dledger.driver.state_files import (
    Checkpoint,
    load_checkpoint,
    load_hard_state,
    save_checkpoint,
    save_hard_state,
)
from broker.dledger.raft.log import RaftLog
from broker.dledger.raft.member_state import HardState

__all__ = ["FileStorage", "MemoryStorage", "NodeStorage", "open_log"]


class NodeStorage(Protocol):
    async def load(self) -> tuple[HardState, int]:
        """The hard state and the checkpointed committed index (-1 when none)."""
        ...

    async def save_hard_state(self, state: HardState) -> None:
        """Durable when it returns."""
        ...

    async def save_checkpoint(self, end_index: int, committed_index: int) -> None: ...

    async def flush_log(self, log: RaftLog) -> None: ...

    async def close_log(self, log: RaftLog) -> None: ...

    async def disk_used_ratio(self) -> float:
        """Used / total of the store's file system, 0..1."""
        ...


async def open_log(config: DLedgerConfig) -> FileLog:
    """The file log of ``config``'s member, recovered (in a worker thread)."""
    return await trio.to_thread.run_sync(
        lambda: open_file_log(
            config.store_dir,
            data_file_size=config.data_file_size,
            index_file_size=config.index_file_size,
            patch_physical_offset=config.patch_physical_offset,
            data_dir=config.data_store_path,
        )
    )


@attrs.frozen
class FileStorage:
    directory: str

    async def load(self) -> tuple[HardState, int]:
        def read() -> tuple[HardState, int]:
            checkpoint = load_checkpoint(self.directory)
            committed = -1 if checkpoint is None else checkpoint.committed_index
            return load_hard_state(self.directory), committed

        return await trio.to_thread.run_sync(read)

    async def save_hard_state(self, state: HardState) -> None:
        await trio.to_thread.run_sync(save_hard_state, self.directory, state)

    async def save_checkpoint(self, end_index: int, committed_index: int) -> None:
        checkpoint = Checkpoint(end_index=end_index, committed_index=committed_index)
        await trio.to_thread.run_sync(save_checkpoint, self.directory, checkpoint)

    async def flush_log(self, log: RaftLog) -> None:
        if isinstance(log, FileLog):
            if log.has_unflushed():  # every 10 ms on every member: no thread hop when idle
                await trio.to_thread.run_sync(log.flush)
            if log.quiet_release_due():
                # the caches of fresh entries go with the pages: the log's, and the pushes'
                # renderings of the same entries (entry_json.py)
                log.drop_recent()
                forget_renderings()
                await trio.to_thread.run_sync(log.release_quiet)

    async def close_log(self, log: RaftLog) -> None:
        if isinstance(log, FileLog):
            await trio.to_thread.run_sync(log.close)

    async def disk_used_ratio(self) -> float:
        def measure() -> float:
            os.makedirs(self.directory, exist_ok=True)
            usage = shutil.disk_usage(self.directory)
            return usage.used / usage.total if usage.total else 0.0

        return await trio.to_thread.run_sync(measure)


def _no_saves() -> list[HardState]:
    return []


@attrs.define(eq=False)
class MemoryStorage:
    hard_state: HardState = attrs.field(factory=HardState)
    end_index: int = -1
    committed_index: int = -1
    # seconds of Trio's clock each save takes
    save_delay: float = 0.0
    # what disk_used_ratio reports
    disk_ratio: float = 0.0
    # every hard state saved, in order (the last one is hard_state), and when each save ended
    saves: list[HardState] = attrs.field(factory=_no_saves)
    saved_at: list[float] = attrs.field(factory=list)
    checkpoints: int = 0
    flushes: int = 0

    async def load(self) -> tuple[HardState, int]:
        await trio.lowlevel.checkpoint()
        return self.hard_state, self.committed_index

    async def save_hard_state(self, state: HardState) -> None:
        await trio.sleep(self.save_delay)
        self.hard_state = state
        self.saves.append(state)
        self.saved_at.append(trio.current_time())

    async def save_checkpoint(self, end_index: int, committed_index: int) -> None:
        await trio.lowlevel.checkpoint()
        self.end_index, self.committed_index = end_index, committed_index
        self.checkpoints += 1

    async def flush_log(self, log: RaftLog) -> None:
        await trio.lowlevel.checkpoint()
        self.flushes += 1

    async def close_log(self, log: RaftLog) -> None:
        await trio.lowlevel.checkpoint()

    async def disk_used_ratio(self) -> float:
        await trio.lowlevel.checkpoint()
        return self.disk_ratio
