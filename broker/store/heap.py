"""Freed heap back to the OS when a store goes quiet (glibc ``malloc_trim``).

Why: the bodies of a burst of sends (and a DLedger leader's pushes of them) are served from
glibc arenas, and freeing those objects afterwards leaves the arenas' pages mapped: the
process's RSS stays at the burst's peak long after the load ended (40 MiB of a DLedger leader's
after a batch run).  ``malloc_trim(0)`` hands every whole free page of every arena back.  It
walks the arenas under their locks, so it runs once when the store goes quiet (the flush
services call it), never per request.  Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
_resolved = False


def _resolve() -> Callable[[int], int] | None:
    global _trim, _resolved
    if not _resolved:
        _resolved = True
        try:
            # the process's own symbols (libc among them); no find_library, which spawns ldconfig
            _trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):  # not glibc
            _trim = None
    return _trim


def trim_heap() -> bool:
    """Return freed heap pages to the OS; True if glibc gave some back.  Blocking (ms): run it
    in a worker thread."""
    trim = _resolve()
    return bool(trim(0)) if trim is not None else False
