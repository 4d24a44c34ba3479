"""Profiles of benchmark scenarios: py-spy on a pid, summarised per function.

Theory of operation: `sample(pid, path)` runs `py-spy record --format raw` against a process
(the broker, or this benchmark process for the client side) while the caller's block runs, then
stops it with SIGINT, which makes py-spy write its collapsed stacks ("frame;frame;frame count"
per line, root first). `summarise` turns those into two rankings over all (non-idle) samples:
self time (the leaf frame) and inclusive time (each function counted once per stack), with
frames named `file:function`. py-spy is a tool for the benchmark only; it is installed into
the venv by hand (`.venv/bin/pip install py-spy`), never a project dependency.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


_ROOTS = ("<frozen runpy>", "typer/", "click/", "cli/main.py:", "run_broker_bench.py:")


def py_spy_path() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    if local.exists():
        return str(local)
    return shutil.which("py-spy")


@contextlib.contextmanager
def sample(pid: int, out_path: Path, *, rate: int = 500, gil: bool = True) -> Iterator[Path]:
    """py-spy records `pid` while the block runs; raw collapsed stacks end up in `out_path`.

    With `gil` only the thread holding the GIL is sampled: Python CPU work. Without it every
    non-idle thread is, which on a busy host also counts time spent runnable but waiting for a
    CPU (a sender preempted inside send(), say) and so misleads about cost.
    """
    exe = py_spy_path()
    if exe is None:
        raise RuntimeError("py-spy is not installed: .venv/bin/pip install py-spy")
    proc = subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--format",
            "raw",
            "--nonblocking",
            *(["--gil"] if gil else []),
            "-o",
            str(out_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield out_path
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if not out_path.exists():
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"py-spy wrote no profile for pid {pid}: {err.strip()}")


def _short(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m["file"]
    for marker in ("/site-packages/", "/work/main/", "/lib/python3."):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/lib/python3.":
                path = "stdlib/" + path.split("/", 1)[-1]
            break
    return f"{path}:{m['func']}"


def summarise(path: Path, top: int = 15) -> dict:
    """{'samples': n, 'self': [(frame, pct)], 'inclusive': [(frame, pct)]} from raw stacks."""
    self_c: Counter[str] = Counter()
    incl_c: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_short(f) for f in stack.split(";")]
        # py-spy puts "process ..." / "thread ..." pseudo-frames first; keep Python frames only
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        self_c[frames[-1]] += n
        for f in set(frames):
            incl_c[f] += n
    if total == 0:
        return {"samples": 0, "self": [], "inclusive": []}

    def rank(c: Counter[str]) -> list[tuple[str, float]]:
        return [(f, 100.0 * n / total) for f, n in c.most_common(top)]

    # The chain of frames (nearly) every stack shares (runpy, typer, trio.run, the event loop,
    # the benchmark driver) says nothing about where the time goes: inclusive ranks leave out
    # frames found in >= 95% of the stacks of the most common frame.
    top_count = max(incl_c.values())
    incl = Counter(
        {f: n for f, n in incl_c.items() if n < 0.95 * top_count and not f.startswith(_ROOTS)}
    )
    return {"samples": total, "self": rank(self_c), "inclusive": rank(incl)}


def format_summary(title: str, summary: dict) -> str:
    lines = [f"### {title} ({summary['samples']} samples)", "", "self time:"]
    lines += [f"  {pct:5.1f}%  {f}" for f, pct in summary["self"]]
    lines += ["inclusive time (below the common root frames):"]
    lines += [f"  {pct:5.1f}%  {f}" for f, pct in summary["inclusive"]]
    return "\n".join(lines)
