"""RocketMQ 5's outcome codes (``apache.rocketmq.v2.Code``) and how remoting answers map to them.

RocketMQ 5's proxy answers nearly every call with gRPC status OK and its own ``Status{code,
message}`` inside the response; ``ResponseBuilder`` (``proxy/.../grpc/v2/common``) turns a
broker's remoting response code into one: SUCCESS -> OK, SYSTEM_BUSY -> TOO_MANY_REQUESTS,
REQUEST_CODE_NOT_SUPPORTED -> NOT_IMPLEMENTED, SUBSCRIPTION_GROUP_NOT_EXIST ->
CONSUMER_GROUP_NOT_FOUND, a topic that does not exist -> TOPIC_NOT_FOUND (``TopicRouteHelper``),
anything else INTERNAL_SERVER_ERROR. We add NO_PERMISSION -> FORBIDDEN, which is what the proxy's
own permission checks answer.
"""

from __future__ import annotations

from common.grpc.v2 import definition_pb2 as pb
from common.remoting.codes import ResponseCode

Code = pb.Code

_FROM_REMOTING: dict[int, pb.Code] = {
    ResponseCode.SUCCESS: pb.OK,
    ResponseCode.SYSTEM_BUSY: pb.TOO_MANY_REQUESTS,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: pb.NOT_IMPLEMENTED,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: pb.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.TOPIC_NOT_EXIST: pb.TOPIC_NOT_FOUND,
    ResponseCode.NO_PERMISSION: pb.FORBIDDEN,
    # the send path's persistence outcomes (SendMessageActivity maps the SendStatus)
    ResponseCode.FLUSH_DISK_TIMEOUT: pb.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: pb.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: pb.HA_NOT_AVAILABLE,
}


def code_of_remoting(response_code: int) -> pb.Code:
    return _FROM_REMOTING.get(response_code, pb.INTERNAL_SERVER_ERROR)


def status(code: pb.Code, message: str | None = None) -> pb.Status:
    """A Status; its message defaults to the code's name, as the proxy writes it."""
    return pb.Status(code=code, message=message if message is not None else pb.Code.Name(code))


def remoting_status(response_code: int, remark: str | None) -> pb.Status:
    return status(code_of_remoting(response_code), remark or str(response_code))


OK = status(pb.OK)


class ActivityError(Exception):
    """Raised inside an activity: the call answers ``Status{code, message}`` (gRPC status OK)."""

    def __init__(self, code: pb.Code, message: str) -> None:
        super().__init__(f"{pb.Code.Name(code)}: {message}")
        self.code = code
        self.message = message

    @property
    def status(self) -> pb.Status:
        return status(self.code, self.message)
