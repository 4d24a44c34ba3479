"""The chaos harness's disk faults, each checked where it must act.

The shim (cli/chaos/disk_shim.c) is built with gcc (a missing gcc fails the test: CI installs
it) and preloaded into a child Python, which makes the very calls the broker makes (os.fsync,
os.fdatasync, mmap.flush, os.posix_fallocate, os.statvfs, shutil.disk_usage) and libc's
fallocate and sync_file_range through ctypes, while the parent switches the control file
between ok, slow and full: every call must feel the mode in force, and none once it is ok
again.  A torn tail is checked on segment files made here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from cli.chaos.disk import DiskControl, build_shim, segment_dirs, tear_tail

pytestmark = pytest.mark.timeout(60)

CHILD = textwrap.dedent(
    """
    import ctypes, errno, json, mmap, os, shutil, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    os.write(fd, b"x" * 4096)
    mm = mmap.mmap(fd, 4096)

    def took(call):
        t = time.monotonic()
        call()
        return time.monotonic() - t

    def ratio(st):
        return (st.f_blocks - st.f_bfree) / st.f_blocks

    def falloc():
        try:
            os.posix_fallocate(fd, 0, 1 << 16)
            return 0
        except OSError as e:
            return e.errno

    def libc_falloc():
        rc = libc.fallocate(fd, 0, ctypes.c_long(0), ctypes.c_long(1 << 16))
        return ctypes.get_errno() if rc else 0

    for line in sys.stdin:  # one probe per line the parent sends, after it set the mode
        mm[0:1] = b"y"
        print(json.dumps({
            "fsync": took(lambda: os.fsync(fd)),
            "fdatasync": took(lambda: os.fdatasync(fd)),
            "msync": took(mm.flush),
            "sync_file_range": took(lambda: libc.sync_file_range(fd, 0, 0, 2)),
            "posix_fallocate": falloc(),
            "fallocate": libc_falloc(),
            "statvfs": ratio(os.statvfs(".")),
            "fstatvfs": ratio(os.fstatvfs(fd)),
            "disk_usage": shutil.disk_usage(".").used / shutil.disk_usage(".").total,
        }), flush=True)
    """
)

SYNC_CALLS = ("fsync", "fdatasync", "msync", "sync_file_range")


def test_the_shim_slows_and_fills_the_calls_the_broker_makes_and_switches_off(tmp_path):
    shim = build_shim(tmp_path / "cache")
    assert build_shim(tmp_path / "cache") == shim  # built once per source
    disk = DiskControl(tmp_path / "node.disk")
    disk.ok()
    # the probed file on tmpfs when there is one: a real disk's fsync on a busy host can
    # itself take longer than the bounds below (the shim does not look at paths)
    shm = Path("/dev/shm")
    probed = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else tmp_path
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(probed / "file")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, **disk.env(shim)},
        cwd=tmp_path,
        text=True,
    )
    stdin, stdout = child.stdin, child.stdout
    assert stdin is not None and stdout is not None

    def probe() -> dict[str, float]:
        stdin.write("probe\n")
        stdin.flush()
        return json.loads(stdout.readline())

    try:
        well = probe()
        assert well["posix_fallocate"] == 0 and well["fallocate"] == 0
        assert all(well[c] < 0.2 for c in SYNC_CALLS), well
        disk.slow(0.3)
        slow = probe()
        assert all(slow[c] >= 0.3 for c in SYNC_CALLS), slow
        disk.full()
        full = probe()
        assert full["posix_fallocate"] == full["fallocate"] == 28  # ENOSPC
        for c in ("statvfs", "fstatvfs", "disk_usage"):
            assert full[c] == pytest.approx(0.95, abs=0.001), full
        assert all(full[c] < 0.2 for c in SYNC_CALLS), full
        disk.ok()
        again = probe()
        assert again["posix_fallocate"] == 0 and again["fallocate"] == 0
        assert all(again[c] < 0.2 for c in SYNC_CALLS), again
        assert again["statvfs"] == pytest.approx(well["statvfs"], abs=0.01)
    finally:
        stdin.close()
        child.wait(timeout=10)
        stdout.close()
        if probed != tmp_path:
            shutil.rmtree(probed)


def test_a_torn_tail_damages_the_newest_written_segment_only(tmp_path):
    (log := segment_dirs(tmp_path, "n1", dledger=True)[1]).mkdir(parents=True)
    older, newest, empty = (log / f"{n:020d}" for n in (0, 4096, 8192))
    older.write_bytes(b"\x01" * 4096)
    newest.write_bytes(b"\x02" * 1000 + bytes(3096))
    empty.write_bytes(bytes(4096))  # rolled to, nothing written: not the one torn
    tear = tear_tail(log, 100, "zero", seed=1)
    assert tear is not None and tear.path == newest and (tear.end, tear.size) == (1000, 100)
    assert newest.read_bytes() == b"\x02" * 900 + bytes(3196)
    tear = tear_tail(log, 5000, "garbage", seed=1)  # at most the written part
    assert tear is not None and tear.size == 900
    assert newest.read_bytes()[:900] != b"\x02" * 900
    assert older.read_bytes() == b"\x01" * 4096 and empty.read_bytes() == bytes(4096)
    assert tear_tail(tmp_path / "none", 10, "zero", seed=1) is None
