"""Errors the client raises itself (the server's codes map to `common.errors` classes).

By cause, like `common/errors.py`: a caller tells "no broker serves this topic" from "the
broker refused" from "the network failed" by class, never by message text.
"""

from __future__ import annotations

from typing import ClassVar

from common.errors import RmqError


class ClientError(RmqError):
    """The client cannot do what was asked with what it knows (Java MQClientException)."""


class NoRouteInfoError(ClientError):
    """No queue to send to: the nameserver has no route for the topic and none for the
    auto-create topic TBW102, or the route it has holds no writable master queue."""

    def __init__(self, topic: str, detail: str = "") -> None:
        super().__init__(
            f"No route info of this topic: {topic}" + (f" ({detail})" if detail else "")
        )
        self.topic = topic


class NoWritableMasterError(NoRouteInfoError):
    """The nameserver knows the topic's brokers but none has a master now: a DLedger group
    between two leaders, or a master/slave broker whose master is down.  The producer waits
    for one within its send timeout."""

    def __init__(self, topic: str) -> None:
        super().__init__(topic, "no writable master queue")


class NotANameserverError(ClientError):
    """The address given as the nameserver answered a nameserver-only request (routes, the
    cluster table, the topic list) with REQUEST_CODE_NOT_SUPPORTED: a broker does that, so
    the address is a broker's (a common slip: 10911 given where 9876 was meant)."""

    def __init__(self, addr: str, remark: str | None = None) -> None:
        said = f" (it answered '{remark.strip()}')" if remark else ""
        super().__init__(
            f"{addr} is a broker, not a nameserver{said}: give -n/--namesrv the nameserver's "
            "address (port 9876 by default)"
        )
        self.addr = addr


class BrokerNotFoundError(ClientError):
    """A route names a broker whose (master) address is unknown or gone."""

    retriable: ClassVar[bool] = True

    def __init__(self, broker_name: str) -> None:
        super().__init__(f"The broker[{broker_name}] not exist")
        self.broker_name = broker_name


class InvalidMessageError(ClientError, ValueError):
    """A message no broker would accept (what MESSAGE_ILLEGAL would say), caught before sending."""


class RequestTimeoutError(ClientError):
    """A request-reply call's request was stored but no reply came within its timeout
    (Java RequestTimeoutException, REQUEST_TIMEOUT_EXCEPTION)."""


class CreateReplyMessageError(ClientError):
    """The message to reply to is not a request: it lacks the CLUSTER property the broker
    adds (Java CREATE_REPLY_MESSAGE_EXCEPTION)."""
