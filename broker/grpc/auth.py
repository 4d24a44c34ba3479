"""The plain ACL on the gRPC endpoint: RocketMQ 5's ACL 1.0 for 5.x clients.

Theory of operation
-------------------
With ``aclEnable`` the broker judges 4.x remoting requests by plain_acl.yml (broker/acl); this
module judges the gRPC calls of 5.x clients by the same file and the same validator, so one hot
reload applies to both ports. It follows RocketMQ 5's proxy with ACL 1.0
(``proxy/grpc/interceptor/AuthenticationInterceptor``, ``acl/common/AuthorizationHeader``,
``acl/plain/PlainAccessResource.parse(GeneratedMessageV3, AuthenticationHeader)`` in
apache/rocketmq 5.1-5.3):

* the client signs each call in its headers (``rocketmq/v5/util/signature.py`` of the Python
  client, the same in the other 5.x clients)::

      x-mq-date-time: 20260129T101530Z
      authorization: MQv2-HMAC-SHA1 Credential=<accessKey>, SignedHeaders=x-mq-date-time,
                     Signature=<hex HMAC-SHA1 of the x-mq-date-time value, keyed by the secret>

  :func:`parse_authorization` reads that header as ``AuthorizationHeader`` does (the method,
  then comma-separated ``key=value`` items; the access key is the part of ``Credential``
  before any ``/``). Only the date-time string is signed, and RocketMQ does not check how old
  it is, so neither do we: a signature proves the client holds the secret, nothing more.
* the account is found and checked in plain_acl.py's order (:func:`broker.acl.plain_acl.
  identify`): a globally white-listed peer, or one matching the account's
  ``whiteRemoteAddress``, skips the signature and the permissions;
* each request message maps to the resources it touches (:func:`resources_of`); a group is
  judged as its retry topic ``%RETRY%<group>`` (``groupPerms``), a topic by ``topicPerms``,
  both with RocketMQ 5's namespace wrapping ``ns%name``.

How a refusal is answered: RocketMQ 5's ACL 1.0 interceptor ends the call with the gRPC status
PERMISSION_DENIED, and its ACL 2.0 (5.3) answers ``Status{UNAUTHORIZED}`` inside the response
for both kinds of failure. We answer as the v2 ``Code`` enum defines its codes
(``definition.proto``), inside the response with gRPC status OK, which is how the 5.x clients
read every other outcome: UNAUTHORIZED (40100, "lacks valid authentication credentials") when
the account, the header or the signature is wrong, FORBIDDEN (40300, "does not have the
permission to operate") when a signed account lacks the permission. The clients raise
``UnauthorizedException`` / ``ForbiddenException`` with that code.

The guard wraps the service table once (:func:`guard_services`, called by
``run_grpc_service``); an activity never sees a call the ACL refused. A call is authenticated
from its headers once; a Telemetry stream has each command authorized (a settings command
names the topics and group the client will use) and a refused command is answered with the
refusal and dropped, the stream staying open, as RocketMQ judges every message of a stream.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import AsyncIterator, Mapping

import attrs
from google.protobuf.message import Message

from broker.acl.plain_acl import Account, AclConfig, AclDenied, Perm, check_resources, identify
from broker.acl.remote_address import peer_ip
from broker.acl.validator import PlainAccessValidator, Resources
from broker.grpc.converter import wrap_namespace
from broker.grpc.status import status
from common.grpc.service import CallContext, Method, MethodKind, Send, ServiceTable
from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import service_pb2 as spb
from common.topics import RETRY_GROUP_TOPIC_PREFIX as RETRY

log = logging.getLogger(__name__)

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"


class AuthHeaderError(ValueError):
    """The authorization header does not parse; the message says why."""


@attrs.frozen
class AuthorizationHeader:
    """``authorization: <method> Credential=<ak>[/...], SignedHeaders=<h;...>, Signature=<hex>``"""

    method: str
    access_key: str | None
    signed_headers: tuple[str, ...]
    # the HMAC bytes (the header carries them in hex); None when the header names none
    signature: bytes | None


def parse_authorization(header: str) -> AuthorizationHeader:
    """Read the header as RocketMQ's ``AuthorizationHeader`` does; AuthHeaderError if it cannot."""
    method, sep, rest = header.partition(" ")
    if not sep:
        raise AuthHeaderError("authorization header is incorrect")
    access_key: str | None = None
    signed: tuple[str, ...] = ()
    signature: bytes | None = None
    for item in rest.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq:
            raise AuthHeaderError(f"authorization item {item.strip()!r} is not key=value")
        if key == "Credential":
            access_key = value.split("/")[0]
        elif key == "SignedHeaders":
            signed = tuple(value.split(";"))
        elif key == "Signature":
            try:
                signature = bytes.fromhex(value)
            except ValueError:
                raise AuthHeaderError("authorization Signature is not hex") from None
    return AuthorizationHeader(method, access_key, signed, signature)


def sign(secret_key: str, date_time: str) -> str:
    """The hex signature a 5.x client sends for ``date_time`` (``Signature.sign``)."""
    mac = hmac.new(secret_key.encode("utf-8"), date_time.encode("utf-8"), hashlib.sha1)
    return mac.hexdigest()


class Refused(Exception):
    """A call the ACL refuses: ``code`` is UNAUTHORIZED or FORBIDDEN, the message RocketMQ's."""

    def __init__(self, code: pb.Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> pb.Status:
        return status(self.code, self.message)


def authenticate(config: AclConfig, metadata: Mapping[str, str], peer: str) -> Account | None:
    """Check a call's headers: the account its messages are then judged for, or None when the
    peer is white-listed (nothing more is checked). Raises Refused(UNAUTHORIZED)."""
    header = metadata.get(AUTHORIZATION)
    access_key: str | None = None
    parsed: AuthorizationHeader | None = None
    if header is not None:
        try:
            parsed = parse_authorization(header)
        except AuthHeaderError as exc:
            raise Refused(pb.UNAUTHORIZED, str(exc)) from None
        access_key = parsed.access_key
    try:
        account = identify(config, access_key, peer_ip(peer))
    except AclDenied as exc:
        raise Refused(pb.UNAUTHORIZED, str(exc)) from None
    if account is None:
        return None
    date_time = metadata.get(DATE_TIME)
    failed = f"Check signature failed for accessKey={access_key}"
    if parsed is None or parsed.signature is None or date_time is None:
        raise Refused(pb.UNAUTHORIZED, failed)
    expected = bytes.fromhex(sign(account.secret_key, date_time))
    if not hmac.compare_digest(parsed.signature, expected):
        raise Refused(pb.UNAUTHORIZED, failed)
    return account


def _group(resource: pb.Resource) -> Resources:
    return [(RETRY + wrap_namespace(resource), Perm.SUB)]


def _topic(resource: pb.Resource, perm: Perm) -> Resources:
    return [(wrap_namespace(resource), perm)]


_CONSUMERS = (pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER)


def resources_of(request: Message) -> Resources:
    """(resource, permission needed) for each resource a request message touches, as
    ``PlainAccessResource.parse(GeneratedMessageV3, ...)`` of RocketMQ 5.1-5.3 maps them.
    Raises AclDenied for a request that cannot be judged (RocketMQ's AclException there).

    PullMessage, GetOffset, UpdateOffset (group SUB, topic SUB) and QueryOffset (topic ANY)
    are ours: RocketMQ's ACL 1.0 maps none of them, so any signed account could read any
    queue; we judge them as their 4.x counterparts PULL_MESSAGE / UPDATE_CONSUMER_OFFSET are
    (broker/acl/validator.py) and QueryOffset as QueryRoute."""
    if isinstance(request, spb.SendMessageRequest):
        if not request.messages:
            raise AclDenied("SendMessageRequest, messageCount is zero")
        topic = request.messages[0].topic
        if any(m.topic != topic for m in request.messages):
            raise AclDenied("SendMessageRequest, messages' topic is not consistent")
        return _topic(topic, Perm.PUB)
    if isinstance(
        request,
        spb.ReceiveMessageRequest
        | spb.PullMessageRequest
        | spb.GetOffsetRequest
        | spb.UpdateOffsetRequest,
    ):
        return _group(request.group) + _topic(request.message_queue.topic, Perm.SUB)
    if isinstance(
        request,
        spb.AckMessageRequest
        | spb.ForwardMessageToDeadLetterQueueRequest
        | spb.ChangeInvisibleDurationRequest
        | spb.QueryAssignmentRequest,
    ):
        return _group(request.group) + _topic(request.topic, Perm.SUB)
    if isinstance(request, spb.QueryRouteRequest):
        return _topic(request.topic, Perm.ANY)
    if isinstance(request, spb.QueryOffsetRequest):
        return _topic(request.message_queue.topic, Perm.ANY)
    if isinstance(request, spb.EndTransactionRequest):
        return _topic(request.topic, Perm.PUB)
    if isinstance(request, spb.HeartbeatRequest):
        if request.client_type in _CONSUMERS:
            if not request.HasField("group"):
                raise AclDenied("Consumer heartbeat doesn't have group")
            return _group(request.group)
        return []
    if isinstance(request, spb.NotifyClientTerminationRequest):
        return _group(request.group) if request.group.name.strip() else []
    if isinstance(request, spb.TelemetryCommand) and request.HasField("settings"):
        settings = request.settings
        out: Resources = []
        if settings.HasField("publishing"):
            for topic in settings.publishing.topics:
                out += _topic(topic, Perm.PUB)
        if settings.HasField("subscription"):
            out += _group(settings.subscription.group)
            for entry in settings.subscription.subscriptions:
                out += _topic(entry.topic, Perm.SUB)
        if not settings.HasField("publishing") and not settings.HasField("subscription"):
            raise AclDenied("settings command doesn't have publishing or subscription")
        return out
    return []


def authorize(account: Account | None, request: Message) -> None:
    """Raise Refused(FORBIDDEN) unless ``account`` may make this request (None: anything)."""
    if account is None:
        return
    try:
        check_resources(account, resources_of(request))
    except AclDenied as exc:
        raise Refused(pb.FORBIDDEN, str(exc)) from None


# --- the guard around the service table --------------------------------------------------


def _response_types() -> dict[str, type[Message]]:
    """Each method's response message type, from the service's descriptor: a refusal is an
    empty response of that type with only its ``status`` set (every v2 response has one)."""
    service = spb.DESCRIPTOR.services_by_name["MessagingService"]
    return {
        f"/{service.full_name}/{m.name}": getattr(spb, m.output_type.name) for m in service.methods
    }


_RESPONSES = _response_types()


@attrs.define(eq=False)
class GrpcAclGuard:
    validator: PlainAccessValidator

    def _refused(self, ctx: CallContext, refusal: Refused) -> None:
        v = self.validator
        v.denied += 1
        if v.denied % 1000 == 1:
            log.warning("ACL refused %s from %s: %s", ctx.path, ctx.peer, refusal.message)

    def wrap(self, path: str, method: Method) -> Method:
        response_type = _RESPONSES.get(path)
        if response_type is None or "status" not in response_type.DESCRIPTOR.fields_by_name:
            return method  # nothing to answer a refusal with (no such method in v2)
        handler = method.handler
        kind = method.kind

        def refusal(ctx: CallContext, exc: Refused) -> Message:
            self._refused(ctx, exc)
            answer = response_type()
            answer.status.CopyFrom(exc.status)  # type: ignore[attr-defined]
            return answer

        if kind is MethodKind.UNARY:

            async def unary(request: Message, ctx: CallContext) -> Message:
                try:
                    authorize(authenticate(self.validator.config, ctx.metadata, ctx.peer), request)
                except Refused as exc:
                    return refusal(ctx, exc)
                result: Message = await handler(request, ctx)
                return result

            return attrs.evolve(method, handler=unary)

        if kind is MethodKind.SERVER_STREAMING:

            async def streaming(request: Message, ctx: CallContext, send: Send[Message]) -> None:
                try:
                    authorize(authenticate(self.validator.config, ctx.metadata, ctx.peer), request)
                except Refused as exc:
                    await send(refusal(ctx, exc))
                    return
                await handler(request, ctx, send)

            return attrs.evolve(method, handler=streaming)

        async def bidi(
            requests: AsyncIterator[Message], ctx: CallContext, send: Send[Message]
        ) -> None:
            try:
                account = authenticate(self.validator.config, ctx.metadata, ctx.peer)
            except Refused as exc:
                await send(refusal(ctx, exc))
                return

            async def allowed() -> AsyncIterator[Message]:
                async for request in requests:
                    try:
                        authorize(account, request)
                    except Refused as exc:
                        await send(refusal(ctx, exc))
                        continue
                    yield request

            await handler(allowed(), ctx, send)

        return attrs.evolve(method, handler=bidi)


def guard_services(table: ServiceTable, validator: PlainAccessValidator) -> ServiceTable:
    """``table`` with every call judged by the plain ACL ``validator`` holds in force."""
    guard = GrpcAclGuard(validator)
    return {path: guard.wrap(path, method) for path, method in table.items()}
