"""Run one server (nameserver or broker) in the foreground until Ctrl-C, SIGTERM or stdin EOF.

Theory of operation: the service is a `run_x(config, *, task_status)` function. We start it in a
nursery, print where it listens, and wait for the first stop reason: SIGINT/SIGTERM, or (with
`watch_stdin`, used by `rmq up`) end-of-file on stdin, which means the supervisor is gone.
Stopping is cancelling the nursery; the service does its own bounded, shielded cleanup (a broker
unregisters from its nameservers) before `run_x` returns.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import trio


async def _wait_stdin_eof() -> None:
    stream = trio.lowlevel.FdStream(0)
    try:
        while await stream.receive_some(4096):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # a broken stdin means the same as EOF: nobody supervises us any more


async def serve_until_stopped(
    run: Callable[..., Any],
    config: Any,
    *,
    on_started: Callable[[Any], None],
    watch_stdin: bool = False,
) -> str:
    """Serve until a stop reason arrives; returns that reason ("SIGINT", "SIGTERM", "stdin")."""
    reason = "cancelled"
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(run, config)
            on_started(handle)

            async def stop_on_signal() -> None:
                nonlocal reason
                async for signum in signals:
                    reason = signal.Signals(signum).name
                    nursery.cancel_scope.cancel()
                    return

            async def stop_on_eof() -> None:
                nonlocal reason
                await _wait_stdin_eof()
                reason = "stdin"
                nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_signal)
            if watch_stdin:
                nursery.start_soon(stop_on_eof)
    return reason
