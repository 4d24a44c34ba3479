"""The venv of the official RocketMQ 5 Python client (`rocketmq-python-client`), made on demand.

That client and the C++ client of the test extra (`rocketmq==0.4.4`) both install a top-level
`rocketmq` package, so the 5.x client cannot live in the project's venv. The interop tests ask
for `ensure_py5_python()`: the first call on a machine creates a venv with `python -m venv` and
installs `py5-requirements.txt` (every package pinned) into it; later calls find it ready.

The venv is cached under `$XDG_CACHE_HOME/trio-rmq/` (default `~/.cache/trio-rmq/`) in a
directory named after a hash of the requirements and the interpreter version, so a change of
either builds a new one beside the old, and a half-built venv is never used: it is built in a
temporary directory and renamed into place only after `import rocketmq.v5` works there. A file
lock keeps parallel test processes (xdist workers) from building it twice.

If it cannot be built (no network, no wheel for this interpreter), `Py5VenvError` carries pip's
output and the test that asked FAILS: an interop test that skips proves nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REQUIREMENTS = Path(__file__).with_name("py5-requirements.txt")
# the version the notes (docs/grpc-clients.md) and the tests were written against
CLIENT_VERSION = "5.1.2"
INSTALL_TIMEOUT = 600.0


class Py5VenvError(RuntimeError):
    """The client's venv could not be created or does not import the client."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trio-rmq"


def venv_key() -> str:
    h = hashlib.sha256(REQUIREMENTS.read_bytes())
    h.update(f"{sys.version_info.major}.{sys.version_info.minor}".encode())
    return f"py5-venv-{CLIENT_VERSION}-{h.hexdigest()[:12]}"


def _python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def _check(python: Path) -> None:
    proc = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m, rocketmq.v5, rocketmq;"
            "print(m.version('rocketmq-python-client'))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        # the client writes its log under ~/logs at import time: keep that out of HOME
        env={**os.environ, "HOME": tempfile.gettempdir()},
    )
    if proc.returncode != 0 or proc.stdout.strip() != CLIENT_VERSION:
        raise Py5VenvError(
            f"{python} does not import rocketmq-python-client {CLIENT_VERSION}:\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    if proc.returncode != 0:
        raise Py5VenvError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
            f"{proc.stderr[-5000:]}"
        )


def ensure_py5_python() -> Path:
    """The interpreter of the client's venv, built first if this machine has none yet."""
    root = cache_root()
    venv = root / venv_key()
    python = _python_of(venv)
    with _locked(root / f"{venv.name}.lock"):
        if python.exists():
            _check(python)
            return python
        building = Path(tempfile.mkdtemp(prefix=f"{venv.name}.building-", dir=root))
        try:
            # a venv's scripts carry its absolute path: build it where it will live,
            # under a temporary name, then move the finished one into place
            target = building / "venv"
            _run([sys.executable, "-m", "venv", str(target)])
            _run([str(_python_of(target)), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)])
            _check(_python_of(target))
            # console scripts hold the build path in their shebang; the driver only runs
            # `python <file>`, which does not care
            target.rename(venv)
        finally:
            shutil.rmtree(building, ignore_errors=True)
        _check(python)
        return python
