"""Run a program that does not watch its stdin so that it still stops with `rmq up`.

    python -m cli.local.tether PROGRAM [ARGS...]

Every node of `rmq up` watches its stdin, a pipe only the supervisor holds, and stops when it
closes, so no node outlives a supervisor that died, even by SIGKILL (`cli/local/up.py`). A
third-party server (Prometheus, for `rmq up --metrics`) does not. This process stands in for
it: the supervisor spawns it in the program's place and
tether starts the program as its own child and

* stops it (SIGTERM) when its stdin closes: the supervisor is gone;
* passes SIGTERM and SIGINT on to it: `rmq down`, `rmq restart`;
* has the kernel send it SIGTERM should tether itself die, even by SIGKILL (`rmq kill`):
  Linux's parent-death signal, set in the child between fork and exec. The parent that counts
  is the thread that forked, so tether forks from its main thread (the supervisor cannot do
  this itself: trio spawns processes from worker threads, which come and go);
* exits with the program's exit code (128 + N for a signal N, as a shell reports it).

Standard library only, and nothing imported from the project: it starts in a few ms.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


_FORWARDED = (signal.SIGTERM, signal.SIGINT)


def _die_with_parent(parent: int) -> None:
    """In the child between fork and exec, with `_FORWARDED` blocked: their default actions
    back (tether's handlers are copied by the fork and would swallow them), SIGTERM when
    tether's thread ends, at once if tether ended before this (the kernel only signals a death
    that comes after the call); then the signals that came meanwhile."""
    for signum in _FORWARDED:
        signal.signal(signum, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)


def run(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m cli.local.tether PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    child: subprocess.Popen[bytes] | None = None
    stopping: list[int] = []  # a signal that came before the program was started

    def stop(signum: int = signal.SIGTERM, _frame: object = None) -> None:
        if child is None:
            stopping.append(signum)
            return
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for signum in _FORWARDED:
        signal.signal(signum, stop)
    me = os.getpid()
    # blocked while the child is forked: it must not run a copy of `stop` (see _die_with_parent)
    signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
    try:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, preexec_fn=lambda: _die_with_parent(me)
        )
    except OSError as exc:
        print(f"error: cannot start {argv[0]}: {exc}", file=sys.stderr, flush=True)
        return 127
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
    if stopping:  # came before `child` was set
        stop(stopping[0])

    def watch_stdin() -> None:
        # read() returns b"" at EOF: the supervisor's end of the pipe closed
        while os.read(0, 4096):
            pass
        stop()

    threading.Thread(target=watch_stdin, daemon=True).start()
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
