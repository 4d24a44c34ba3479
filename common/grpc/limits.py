"""What a gRPC client can make the server hold, bounded as the remoting server bounds it.

* connections: past ``max_connections`` a new connection is closed at once;
* streams: ``max_concurrent_streams`` is announced in SETTINGS and h2 refuses a stream past it
  (the connection ends with a GOAWAY, as for any protocol error);
* message size: a message declared longer than ``max_message_size`` ends its call with
  RESOURCE_EXHAUSTED before its bytes are buffered (RocketMQ 5's proxy allows 130 MiB,
  ``grpcMaxInboundMessageSize``; we take the remoting frame limit, 16 MiB, as the bodies are
  the same); a compressed message is held to it once inflated (framing.py);
* headers: ``max_header_list_size`` is announced and enforced by h2's HPACK decoder;
* inbound bytes: received DATA is acknowledged (its flow-control window reopened) only while
  the connection buffers less than ``max_buffered_inbound`` bytes of messages its handlers have
  not taken, so a client sending faster than we handle is stopped by HTTP/2 flow control;
  the same budget bounds what the connection's calls hold decompressed (each its latest
  request): a compressed request that would pass it is refused with RESOURCE_EXHAUSTED;
* outbound bytes: a handler waits for the peer's flow-control window and for the connection's
  unwritten bytes to fall below ``outbound_high_water``; a peer that reads nothing for
  ``send_timeout`` has its connection closed (a client that never reads);
* idle: a connection with no open stream that received nothing for ``idle_timeout`` is closed
  (RocketMQ 5's proxy: ``grpcClientIdleTimeMills``, 120 s), and one that has not sent the
  HTTP/2 preface and its SETTINGS within ``handshake_timeout``.
"""

from __future__ import annotations

import attrs

from common.remoting.codec import MAX_FRAME_LENGTH


@attrs.frozen
class GrpcServerLimits:
    max_connections: int = 10_000
    max_concurrent_streams: int = 100
    max_message_size: int = MAX_FRAME_LENGTH
    max_header_list_size: int = 16 * 1024
    initial_window_size: int = 1024 * 1024
    max_buffered_inbound: int = 2 * MAX_FRAME_LENGTH
    outbound_high_water: int = 1024 * 1024
    send_timeout: float = 30.0
    idle_timeout: float = 120.0
    # a connection whose client preface and SETTINGS are not in by then is closed (a peer that
    # opens connections and sends a few bytes, or nothing)
    handshake_timeout: float = 10.0
