"""gRPC status codes (the ``grpc-status`` trailer) and the error a handler raises to send one.

The numbers are gRPC's (``doc/statuscodes.md`` in grpc/grpc); they are not RocketMQ's
``apache.rocketmq.v2.Code``, which travels inside response messages. RocketMQ 5's proxy answers
almost everything with grpc-status OK and puts its outcome in the message's ``Status``; transport
trouble (a deadline, a message too large, an unknown method) is what uses these.
"""

from __future__ import annotations

import enum
import urllib.parse


class StatusCode(enum.IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class GrpcError(Exception):
    """Raised in a handler (or by the transport) to end the call with ``code`` and ``message``."""

    def __init__(self, code: StatusCode, message: str = "") -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def encode_grpc_message(message: str) -> str:
    """``grpc-message`` is percent-encoded UTF-8 (gRPC's HTTP/2 protocol spec): printable ASCII
    other than ``%`` goes as is."""
    return urllib.parse.quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")
