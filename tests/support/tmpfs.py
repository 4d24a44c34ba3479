"""A small tmpfs for the tests of a full disk.

Mounted as root, or through `sudo -n` as CI's package installs do; a mount that fails fails the
test, it never skips it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import trio


@contextlib.contextmanager
def small_tmpfs(path: Path, mib: int) -> Iterator[Path]:
    """A tmpfs of ``mib`` MiB mounted at ``path`` (made here) until the block ends."""
    path.mkdir()
    # root mounts itself; anyone else through sudo (as CI installs packages), owning the mount
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    options = f"size={mib}m,uid={os.geteuid()},gid={os.getegid()},mode=0755"
    subprocess.run([*sudo, "mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run([*sudo, "umount", "-l", str(path)], check=False)


async def grow_tmpfs(path: Path, mib: int) -> None:
    """Give a tmpfs from ``small_tmpfs`` ``mib`` MiB, in place (``mount -o remount,size=``):
    space comes back to what runs on it without anything being deleted."""
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    await trio.run_process([*sudo, "mount", "-o", f"remount,size={mib}m", str(path)])
