"""Error classes of trio-rmq, arranged by cause.

Theory of operation: a caller decides what to do from the *cause* of a failure, never from its text.

* :class:`RemotingError` - the transport failed (could not connect, could not write, no answer in
  time). These are ``retriable``: the same request may succeed on a new connection or another broker.
* :class:`ProtocolError` - the peer sent bytes we cannot decode. The connection is unusable; servers
  close it and keep serving everyone else.
* :class:`RequestError` - raised *inside a request handler* to answer the request with a RocketMQ
  response code and remark (the server turns it into the response; nothing is logged as a crash).
* :class:`BrokerResponseError` - a *client* received a non-success response code. One subclass per
  code that callers treat specially, each with ``retriable`` as in the Java producer's retry list
  (``DefaultMQProducer.retryResponseCodes`` in ``client/producer/DefaultMQProducer.java``:
  17, 14, 1, 16, 204, 205).

Trio nurseries raise exception groups; :func:`unwrap_group` is the one place that unwraps them at
API boundaries.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import ClassVar

from common.remoting.codes import ResponseCode


class RmqError(Exception):
    """Base of every error raised on purpose by trio-rmq."""

    retriable: ClassVar[bool] = False


# --- transport ---------------------------------------------------------------------------------


class RemotingError(RmqError):
    """The transport failed; says nothing about whether the peer processed the request."""


class RemotingConnectError(RemotingError):
    retriable: ClassVar[bool] = True


class RemotingConnectFailedError(RemotingConnectError):
    """No connection could be made: nothing of the request left this process, so a retry
    can never store it twice."""


class RemotingTimeoutError(RemotingError):
    retriable: ClassVar[bool] = True


class RemotingSendError(RemotingError):
    retriable: ClassVar[bool] = True


# --- undecodable input -------------------------------------------------------------------------


class ProtocolError(RmqError):
    """Bytes from the peer that do not form a valid frame."""


class FrameTooLarge(ProtocolError):
    """A frame whose declared length exceeds the maximum (16 MiB, like Netty's decoder)."""


class FrameDecodeError(ProtocolError):
    """A frame that is malformed: bad lengths, bad header type, undecodable header."""


# --- answering a request with an error code ----------------------------------------------------


class RequestError(RmqError):
    """Raise in a handler to answer with ``code`` and ``remark`` instead of a normal response."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = int(code)
        self.remark = remark


class BadRequestHeader(RequestError):
    """A required extFields entry is missing or does not parse (Java: RemotingCommandException)."""

    def __init__(self, field: str, value: str | None = None, expected: str | None = None) -> None:
        if value is None:
            remark = f"the custom field {field} is null"
        else:
            remark = f"the custom field {field} is not a valid {expected or 'value'}: {value!r}"
        super().__init__(ResponseCode.SYSTEM_ERROR, remark)
        self.field = field
        self.value = value


# --- a client got a non-success response -------------------------------------------------------


class BrokerResponseError(RmqError):
    """The server answered with a code the caller did not expect."""

    code_value: ClassVar[int | None] = None

    def __init__(self, code: int, remark: str | None) -> None:
        super().__init__(f"CODE: {code} DESC: {remark}")
        self.code = int(code)
        self.remark = remark


class BrokerSystemError(BrokerResponseError):
    code_value = ResponseCode.SYSTEM_ERROR
    retriable: ClassVar[bool] = True


class SystemBusyError(BrokerResponseError):
    code_value = ResponseCode.SYSTEM_BUSY


class RequestCodeNotSupportedError(BrokerResponseError):
    code_value = ResponseCode.REQUEST_CODE_NOT_SUPPORTED


class MessageIllegalError(BrokerResponseError):
    code_value = ResponseCode.MESSAGE_ILLEGAL


class ServiceNotAvailableError(BrokerResponseError):
    code_value = ResponseCode.SERVICE_NOT_AVAILABLE
    retriable: ClassVar[bool] = True


class NoPermissionError(BrokerResponseError):
    code_value = ResponseCode.NO_PERMISSION
    retriable: ClassVar[bool] = True


class TopicNotExistError(BrokerResponseError):
    code_value = ResponseCode.TOPIC_NOT_EXIST
    retriable: ClassVar[bool] = True


class QueryNotFoundError(BrokerResponseError):
    code_value = ResponseCode.QUERY_NOT_FOUND


class SubscriptionError(BrokerResponseError):
    """Codes 23-26: the broker does not know (or cannot parse) the group's subscription."""


class SubscriptionGroupNotExistError(SubscriptionError):
    code_value = ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


class NoBuyerIdError(BrokerResponseError):
    code_value = ResponseCode.NO_BUYER_ID
    retriable: ClassVar[bool] = True


class NotInCurrentUnitError(BrokerResponseError):
    code_value = ResponseCode.NOT_IN_CURRENT_UNIT
    retriable: ClassVar[bool] = True


_BY_CODE: dict[int, type[BrokerResponseError]] = {
    int(cls.code_value): cls
    for cls in (
        BrokerSystemError,
        SystemBusyError,
        RequestCodeNotSupportedError,
        MessageIllegalError,
        ServiceNotAvailableError,
        NoPermissionError,
        TopicNotExistError,
        QueryNotFoundError,
        SubscriptionGroupNotExistError,
        NoBuyerIdError,
        NotInCurrentUnitError,
    )
    if cls.code_value is not None
}
for _code in (
    ResponseCode.SUBSCRIPTION_PARSE_FAILED,
    ResponseCode.SUBSCRIPTION_NOT_EXIST,
    ResponseCode.SUBSCRIPTION_NOT_LATEST,
):
    _BY_CODE[int(_code)] = SubscriptionError


def error_for_response(code: int, remark: str | None) -> BrokerResponseError:
    """The error a client raises for an unexpected response (class chosen by its code)."""
    cls = _BY_CODE.get(code, BrokerResponseError)
    return cls(code, remark)


# --- exception groups --------------------------------------------------------------------------


def unwrap_group(exc: BaseException) -> BaseException:
    """Strip exception groups that hold exactly one exception; return anything else unchanged.

    A group holding several real failures is returned as is: picking one would hide the others.
    """
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@contextlib.contextmanager
def unwrapping_groups() -> Iterator[None]:
    """Re-raise a single-exception group escaping the block as its one exception."""
    try:
        yield
    except BaseExceptionGroup as group:
        inner = unwrap_group(group)
        if inner is group:
            raise
        raise inner from None
