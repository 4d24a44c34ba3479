"""Small JSON files that must survive a crash: atomic replacement, and writing them off the loop.

Theory of operation
-------------------
:func:`atomic_write` writes a temporary file beside the target, fsyncs it, renames it over the
target and fsyncs the directory: a reader, or a process restarting after a crash, finds the old
file or the new one, never a torn one, and a rename that was reported done survives power loss.

Those fsyncs take milliseconds, far too long for the event loop that serves every connection.
:class:`WriteBehind` takes them off it.  Callers hand it a snapshot (``submit(path, data)``, on
the loop, so the snapshot is consistent with the tables it was taken from) and get a generation
number; one task (:meth:`WriteBehind.run`) writes snapshots in a worker thread.  Callers that must
not answer before their change is durable await :meth:`WriteBehind.wait_durable`.

Invariants:

* per path, files are written in generation order, and a newer snapshot replaces an older one
  still waiting (the older one is then durable when the newer one is, since it is contained in
  it: every snapshot is the whole table);
* ``durable[path] >= g`` only after a write of generation ``g`` or newer returned from fsync;
* a failed write leaves its snapshot waiting (unless a newer one came) and is retried after
  ``retry_interval``; waiters keep waiting and bound their own patience;
* with no ``run`` task (unit tests that build tables without a service) ``submit`` writes at
  once, synchronously, so nothing is ever left unwritten.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from common import serde

log = logging.getLogger(__name__)

__all__ = ["WriteBehind", "atomic_write", "read_json_file"]


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)  # the rename itself
    except OSError:
        pass
    finally:
        os.close(dfd)


def read_json_file(path: Path) -> Any | None:
    """The parsed JSON of ``path``, None if it does not exist; ValueError if it is corrupt."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if not data.strip():
        return None
    try:
        return serde.loads(data)
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc


@attrs.define(eq=False)
class WriteBehind:
    """Writes whole-file snapshots in a worker thread; see the module docstring."""

    retry_interval: float = 1.0
    # how a snapshot reaches the disk (tests slow it down or make it fail)
    write: Callable[[Path, bytes], None] = atomic_write
    # write in a worker thread; False writes on the loop (tests under autojump_clock, where a
    # thread's wall time would let the clock jump past every timeout)
    in_thread: bool = True
    # path -> (generation, bytes) submitted and not yet written; at most one per path
    _waiting: dict[Path, tuple[int, bytes]] = attrs.field(factory=dict)
    # path -> newest generation known to be on disk
    durable: dict[Path, int] = attrs.field(factory=dict)
    # last generation handed out (shared by all paths, so generations order all submits)
    _generation: int = 0
    # set when something is waiting; the run task clears it
    _wake: trio.Event = attrs.field(factory=trio.Event)
    # replaced after every round of writes, so waiters recheck ``durable``
    _progress: trio.Event = attrs.field(factory=trio.Event)
    running: bool = False
    failures: int = 0

    def submit(self, path: Path, data: bytes) -> int:
        """Queue ``data`` as the next content of ``path``; its generation number."""
        self._generation += 1
        gen = self._generation
        if not self.running:
            self.write(path, data)  # no writer task: write now (raises OSError)
            self.durable[path] = gen
            return gen
        self._waiting[path] = (gen, data)
        self._wake.set()
        return gen

    def busy(self) -> bool:
        """Something submitted is not on disk yet (O(1): the send path asks on every request)."""
        return bool(self._waiting)

    def pending(self, path: Path) -> int | None:
        """The generation ``path`` must reach to hold everything submitted, or None if it does."""
        entry = self._waiting.get(path)
        return None if entry is None else entry[0]

    async def wait_durable(self, path: Path, generation: int) -> None:
        """Return once ``path`` on disk holds ``generation`` (or a newer one)."""
        while self.durable.get(path, 0) < generation:
            await self._progress.wait()

    def write_now(self) -> None:
        """Write everything waiting, synchronously (shutdown, after the run task ended)."""
        for path, (gen, data) in list(self._waiting.items()):
            self.write(path, data)
            self.durable[path] = max(self.durable.get(path, 0), gen)
            del self._waiting[path]

    async def run(
        self, *, task_status: trio.TaskStatus[WriteBehind] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self.running = True
        task_status.started(self)
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                batch = dict(self._waiting)
                if self.in_thread:
                    failed = await trio.to_thread.run_sync(self._write_batch, batch)
                else:
                    failed = self._write_batch(batch)
                for path, (gen, _) in batch.items():
                    if path not in failed:
                        self.durable[path] = max(self.durable.get(path, 0), gen)
                        if self._waiting.get(path, (None,))[0] == gen:
                            del self._waiting[path]
                progress, self._progress = self._progress, trio.Event()
                progress.set()
                if failed:
                    self.failures += 1
                    await trio.sleep(self.retry_interval)
                    self._wake.set()
        finally:
            self.running = False

    def _write_batch(self, batch: dict[Path, tuple[int, bytes]]) -> set[Path]:
        failed = set()
        for path, (_, data) in batch.items():
            try:
                self.write(path, data)
            except OSError as exc:
                log.error("could not write %s (will retry): %s", path, exc)
                failed.add(path)
        return failed
