"""The chaos harness's disk faults: a slow disk, a full disk, and torn segment tails.

Theory of operation
-------------------
**Slow and full disks** need no hook in the broker.  :func:`build_shim` compiles
``disk_shim.c`` (shipped beside this module) with ``gcc -shared -fPIC`` into a cache
directory under the run's root, named by the source's hash so a run compiles it once.  Every
broker process starts with ``LD_PRELOAD`` naming it and ``RMQ_CHAOS_DISK_CONTROL`` naming the
node's control file (:meth:`DiskControl.env`); the shim interposes the libc calls the broker's
disk I/O goes through and reads the control file, which the harness replaces atomically to
switch a fault on and off during the run (the C file's comment says exactly what each mode
does):

* ``slow D``: fsync, fdatasync, msync(MS_SYNC) and sync_file_range sleep ``D`` seconds first:
  the flush task, the checkpoint and DLedger's flush run late; in the ASYNC_FLUSH modes the
  harness runs, acknowledgements do not wait for them, so what it checks is that nothing
  stalls or breaks when the disk does;
* ``full``: posix_fallocate fails with ENOSPC and statvfs reports 95% used.  The broker
  reserves blocks with posix_fallocate before every mapped write and measures its disk with
  statvfs, so it refuses puts (SERVICE_NOT_AVAILABLE, counted as failed sends, not lost
  ones) and takes them again once statvfs reads <= 0.85 at its next disk check.  The harness
  passes a short ``cleanResourceInterval`` (cluster.py) so that check comes within
  half a second; DLedger's own disk check runs every 100 ms.  A forced clean (95% is over
  ``diskSpaceCleanForciblyRatio``) is turned off for the chaos brokers (cluster.py).

This CPython (3.11) calls ``posix_fallocate64`` and ``statvfs64``, not the unsuffixed names,
which is why the shim interposes both forms of each; ``tests/chaos/test_disk_faults.py``
checks through ``os`` and ``mmap`` that every call the broker makes is caught.

**Torn tails** (:func:`tear_tail`) model a power cut in the middle of a write: after a
SIGKILL and before the restart, the last ``n`` bytes of the written part of the node's newest
non-empty segment are zeroed or overwritten with garbage, in the classic CommitLog and, in
DLedger mode, in the DLedger data file too.  "Written part" is read off the file: segments are
preallocated with zeros, so it ends at the last non-zero byte (a record ending in zero bytes
moves the tear a few bytes earlier, which is still a tear).  Recovery must cut the log back
to the last whole record, and replication must refill it from the master or the leader.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
import random
import shutil
import subprocess
from pathlib import Path

import attrs

ENV_CONTROL = "RMQ_CHAOS_DISK_CONTROL"
SHIM_SOURCE = "disk_shim.c"


class ShimBuildError(RuntimeError):
    """gcc is missing or failed: the disk faults cannot run."""


def shim_source() -> bytes:
    return importlib.resources.files("cli.chaos").joinpath(SHIM_SOURCE).read_bytes()


def build_shim(cache_dir: Path) -> Path:
    """The compiled shim in ``cache_dir``, built now unless this source's build is there."""
    source = shim_source()
    out = cache_dir / f"chaos-disk-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if out.exists():
        return out
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ShimBuildError("the disk faults need gcc (apt-get install gcc libc6-dev)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    src = cache_dir / SHIM_SOURCE
    src.write_bytes(source)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    done = subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(tmp), str(src), "-ldl", "-lpthread"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise ShimBuildError(f"gcc failed to build the disk shim:\n{done.stderr}")
    os.replace(tmp, out)  # a half-written .so is never what a broker loads
    return out


@attrs.define(eq=False)
class DiskControl:
    """One node's control file, read by the shim in that node's process."""

    path: Path

    def env(self, shim: Path) -> dict[str, str]:
        """The environment additions that put a process under the shim."""
        preload = os.environ.get("LD_PRELOAD", "")
        return {
            "LD_PRELOAD": f"{shim}:{preload}" if preload else str(shim),
            ENV_CONTROL: str(self.path),
        }

    def set(self, mode: str) -> None:
        """``ok``, ``slow <seconds>`` or ``full``; replaced atomically (a new inode), so the
        shim never reads half of it and notices the change at its next call."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(mode + "\n")
        os.replace(tmp, self.path)

    def slow(self, seconds: float) -> None:
        self.set(f"slow {seconds:.3f}")

    def full(self) -> None:
        self.set("full")

    def ok(self) -> None:
        self.set("ok")


@attrs.frozen
class Tear:
    """What :func:`tear_tail` did to one file."""

    path: Path
    end: int  # where the written part ended
    size: int  # bytes damaged before it
    fill: str  # zero or garbage

    def __str__(self) -> str:
        return f"{self.path.name}: {self.size} bytes before {self.end} ({self.fill})"


def segment_dirs(store_root: Path, node: str, dledger: bool) -> list[Path]:
    """The segment directories a power cut tears on a broker whose store is ``store_root``."""
    dirs = [store_root / "commitlog"]
    if dledger:
        dirs.append(store_root / f"dledger-{node}" / "data")  # RocketMQ's layout
    return dirs


def tear_tail(directory: Path, size: int, fill: str, seed: int) -> Tear | None:
    """Damage the last ``size`` written bytes of the newest segment in ``directory`` that holds
    any (module docstring); None when no segment holds a byte.  Blocking file I/O, for a
    stopped node only: run it in a worker thread."""
    names = sorted(p for p in directory.glob("[0-9]" * 20)) if directory.is_dir() else []
    for path in reversed(names):
        data = path.read_bytes()
        end = len(data.rstrip(b"\0"))
        if end == 0:
            continue  # a segment just rolled to, nothing written yet
        size = min(size, end)
        junk = (
            bytes(size)
            if fill == "zero"
            else random.Random(seed).getrandbits(8 * size).to_bytes(size)
        )
        with open(path, "r+b") as f:
            f.seek(end - size)
            f.write(junk)
        return Tear(path, end, size, fill)
    return None
