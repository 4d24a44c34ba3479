"""The remoting server's bounds on what clients can make it hold (connections, requests, answers).

Theory of operation
-------------------
Every cost a client can impose grows with something it controls: connections, requests it
pipelines (each one the server holds is a task, a parked long poll, a deferred answer), and
answers it does not read.  :class:`ServerLimits` bounds each, per connection and per process,
and :class:`ServerLoad` is the process's live count (one per ``serve_remoting``, shared by its
channels):

* **connections**: past ``max_connections`` a new connection is closed at once (logged); on a
  TLS port, connections still in their handshake (bounded in time by the handshake timeout)
  count too;
* **requests held**: a request the server must hold (its handler runs in a task, or its answer
  is deferred) counts until its answer is queued.  A connection at ``max_requests_held``, or
  holding more than ``fair_share`` while the process is at ``max_requests_held_total``, gets
  SYSTEM_BUSY with RocketMQ's "[OVERLOAD]" remark for every new request, before any handler
  runs (so nothing is half done: no SEND appended, no PULL parked), until some are answered.
  The fair share keeps a few greedy connections from starving the others once the total is
  reached: a client holding little (a producer, a consumer's pulls) is still served;
* **answers not read**: a connection stops being read while its unwritten answers pass
  ``OUTBOX_HIGH_WATER``, checked after every request rather than every received chunk, and
  while any answer of its is unwritten and all connections together hold more than
  ``max_outbox_bytes_total``; a peer that reads keeps an empty outbox and is never paused;
* **idle**: a connection that neither sent nor received anything for ``channel_max_idle``
  (RocketMQ's ``serverChannelMaxIdleTimeSeconds``, 120 s) is closed by a sweep every
  ``idle_sweep_interval``.

So a server's memory is bounded by its limits whatever its clients do; docs/guarantees.md
states the numbers the flood tests measure.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Protocol

import attrs

# RocketMQ's remark when its request executor refuses work (``RejectedExecutionException``)
OVERLOAD_REMARK = "[OVERLOAD]system busy, start flow control for a while"


class ServedConnection(Protocol):
    """What the idle sweep needs of a connection (a ``Channel``)."""

    last_active: float

    @property
    def closed(self) -> bool: ...

    @property
    def idle(self) -> bool:
        """Nothing in progress: no request held, no answer unwritten."""
        ...

    def close(self) -> None: ...


@attrs.frozen
class ServerLimits:
    max_connections: int = 10_000
    max_requests_held: int = 4096
    max_requests_held_total: int = 10_000
    fair_share: int = 256
    max_outbox_bytes_total: int = 64 * 1024 * 1024
    channel_max_idle: float = 120.0
    idle_sweep_interval: float = 10.0


@attrs.define(eq=False)
class ServerLoad:
    """What a server's clients make it hold now (module docstring)."""

    limits: ServerLimits = attrs.Factory(ServerLimits)
    requests_held: int = 0
    outbox_bytes: int = 0
    # refusals so far, by cause (for logs and tests)
    refused_connections: int = 0
    refused_requests: int = 0
    # connections accepted on a TLS port that have not finished deciding / their handshake
    # (common/tls.py); they count against max_connections with the channels
    handshaking: int = 0
    channels: weakref.WeakSet[ServedConnection] = attrs.Factory(weakref.WeakSet)
    # called with (request code, response code, seconds since the request was read) for
    # every answer queued, when the node serves metrics (common/metrics/remoting_metrics.py)
    rpc_observer: Callable[[int, int, float], None] | None = None

    @property
    def connections(self) -> int:
        return len(self.channels)


# the load of channels no server counts (a client's own connections): never over a limit
UNCOUNTED = ServerLoad(
    ServerLimits(
        max_requests_held=1 << 62, max_requests_held_total=1 << 62, max_outbox_bytes_total=1 << 62
    )
)
