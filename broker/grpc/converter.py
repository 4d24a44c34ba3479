"""Between RocketMQ 5's protobuf ``Message`` and the 4.x message the store keeps.

Facts from RocketMQ 5's proxy (``SendMessageActivity.buildMessageProperty`` and
``GrpcConverter.buildMessage``):

* sending, the system properties become 4.x properties: ``tag`` -> TAGS, ``keys`` -> KEYS
  (space separated), ``message_id`` -> UNIQ_KEY (the client makes it; empty is
  ILLEGAL_MESSAGE_ID), ``message_group`` -> ``__SHARDINGKEY``, ``delivery_timestamp`` ->
  ``TIMER_DELIVER_MS`` (ms), a TRANSACTION message -> TRAN_MSG=true and
  CHECK_IMMUNITY_TIME_IN_SECONDS from ``orphaned_transaction_recovery_duration``, PGROUP = the
  topic (a 5.x producer has no group: the proxy names the producer group after the topic, so
  the transaction check asks a producer that publishes to it), ``trace_context`` ->
  TRACE_CONTEXT. A user property named like a system one is ILLEGAL_MESSAGE_PROPERTY_KEY.
  ``body_encoding`` GZIP sets the COMPRESSED sys flag;
* receiving, the reverse, plus ``body_digest`` (CRC32 as 8 upper-case hex digits), the born and
  store host and time, queue id and offset, ``delivery_attempt`` (reconsume times + 1), and the
  message type read back from the properties (TRAN_MSG -> TRANSACTION, a delivery time or
  delay level -> DELAY, a sharding key -> FIFO, else NORMAL: ``TopicMessageType
  .parseFromMessageProperty``).
"""

from __future__ import annotations

import time
import zlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from common.grpc.v2 import definition_pb2 as pb
from common.message import MessageExt, MessageSysFlag
from common.message_properties import MessageConst
from common.topic_message_type import TopicMessageType

# RocketMQ 5 property names (MessageConst of 5.x) the 4.x table here does not carry
SHARDING_KEY = "__SHARDINGKEY"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
TRACE_CONTEXT = "TRACE_CONTEXT"

# MessageConst.STRING_HASH_SET: names a user property may not take
SYSTEM_PROPERTY_NAMES = frozenset(
    value
    for name, value in vars(MessageConst).items()
    if name.isupper() and isinstance(value, str) and name != "KEY_SEPARATOR"
) | {
    SHARDING_KEY,
    TIMER_DELIVER_MS,
    TIMER_DELAY_SEC,
    TIMER_DELAY_MS,
    TRACE_CONTEXT,
    "TIMER_OUT_MS",
    "TIMER_ENQUEUE_MS",
    "TIMER_DEQUEUE_MS",
    "TIMER_ROLL_TIMES",
    "TIMER_DEL_UNIQKEY",
    "POP_CK",
    "POP_CK_OFFSET",
    "1ST_POP_TIME",
    "DELAY_LEVEL",
    "INNER_BASE",
}

PB_MESSAGE_TYPE = {
    TopicMessageType.NORMAL: pb.NORMAL,
    TopicMessageType.FIFO: pb.FIFO,
    TopicMessageType.DELAY: pb.DELAY,
    TopicMessageType.TRANSACTION: pb.TRANSACTION,
}


def wrap_namespace(resource: pb.Resource) -> str:
    """RocketMQ 5's namespaced name (``NamespaceUtil.wrapNamespace``): ``ns%name``."""
    if resource.resource_namespace:
        return f"{resource.resource_namespace}%{resource.name}"
    return resource.name


def resource(name: str, namespace: str = "") -> pb.Resource:
    if namespace and name.startswith(namespace + "%"):
        name = name[len(namespace) + 1 :]
    return pb.Resource(name=name, resource_namespace=namespace)


def type_of_properties(props: dict[str, str]) -> TopicMessageType:
    if props.get(MessageConst.TRAN_MSG, "").lower() == "true":
        return TopicMessageType.TRANSACTION
    if (
        props.get(MessageConst.DELAY, "0") not in ("", "0")
        or TIMER_DELIVER_MS in props
        or TIMER_DELAY_SEC in props
        or TIMER_DELAY_MS in props
    ):
        return TopicMessageType.DELAY
    if props.get(SHARDING_KEY):
        return TopicMessageType.FIFO
    return TopicMessageType.NORMAL


def timestamp_ms(value: Timestamp) -> int:
    return value.seconds * 1000 + value.nanos // 1_000_000


def timestamp_of_ms(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration_ms(value: Duration) -> int:
    return value.seconds * 1000 + value.nanos // 1_000_000


def duration_of_ms(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


class MessageError(ValueError):
    """A message the proxy refuses; ``code`` is its apache.rocketmq.v2.Code."""

    def __init__(self, code: pb.Code, message: str) -> None:
        super().__init__(message)
        self.code = code


def properties_of(message: pb.Message, producer_group: str) -> dict[str, str]:
    """The 4.x properties of a message a 5.x producer sends (module docstring)."""
    props: dict[str, str] = {}
    for key, value in message.user_properties.items():
        if key in SYSTEM_PROPERTY_NAMES:
            raise MessageError(
                pb.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property is used by system: {key}"
            )
        props[key] = value
    system = message.system_properties
    if system.tag:
        props[MessageConst.TAGS] = system.tag
    if system.keys:
        props[MessageConst.KEYS] = MessageConst.KEY_SEPARATOR.join(system.keys)
    if not system.message_id:
        raise MessageError(pb.ILLEGAL_MESSAGE_ID, "message id is empty")
    props[MessageConst.UNIQ_KEY] = system.message_id
    if system.message_type == pb.TRANSACTION:
        props[MessageConst.TRAN_MSG] = "true"
        props[MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS] = str(
            system.orphaned_transaction_recovery_duration.seconds
        )
    if system.HasField("delivery_timestamp"):
        props[TIMER_DELIVER_MS] = str(timestamp_ms(system.delivery_timestamp))
    if system.delivery_attempt > 0:
        props[MessageConst.RECONSUME_TIME] = str(system.delivery_attempt)
    props[MessageConst.PGROUP] = producer_group
    if system.message_group:
        props[SHARDING_KEY] = system.message_group
    if system.trace_context:
        props[TRACE_CONTEXT] = system.trace_context
    return props


def sys_flag_of(message: pb.Message) -> int:
    flag = 0
    if message.system_properties.body_encoding == pb.GZIP:
        flag |= MessageSysFlag.COMPRESSED
    if message.system_properties.message_type == pb.TRANSACTION:
        flag |= MessageSysFlag.TRANSACTION_PREPARED
    return flag


def message_of(
    msg: MessageExt,
    *,
    namespace: str = "",
    receipt_handle: str | None = None,
    delivery_attempt: int | None = None,
    invisible_time_ms: int | None = None,
) -> pb.Message:
    """The protobuf form of a stored message, as a 5.x consumer (or a check-back) gets it."""
    props = msg.properties
    system = pb.SystemProperties(
        message_id=props.get(MessageConst.UNIQ_KEY) or msg.msg_id,
        body_digest=pb.Digest(type=pb.CRC32, checksum=f"{zlib.crc32(msg.body) & 0xFFFFFFFF:08X}"),
        body_encoding=pb.GZIP if msg.sys_flag & MessageSysFlag.COMPRESSED else pb.IDENTITY,
        message_type=PB_MESSAGE_TYPE[type_of_properties(props)],
        born_timestamp=timestamp_of_ms(msg.born_timestamp),
        born_host=msg.born_host[0],
        store_timestamp=timestamp_of_ms(msg.store_timestamp),
        store_host=f"{msg.store_host[0]}:{msg.store_host[1]}",
        queue_id=msg.queue_id,
        queue_offset=msg.queue_offset,
        delivery_attempt=delivery_attempt
        if delivery_attempt is not None
        else msg.reconsume_times + 1,
    )
    tag = props.get(MessageConst.TAGS)
    if tag:
        system.tag = tag
    keys = props.get(MessageConst.KEYS)
    if keys:
        system.keys.extend(k for k in keys.split(MessageConst.KEY_SEPARATOR) if k)
    deliver = props.get(TIMER_DELIVER_MS)
    if deliver and deliver.isdigit():
        system.delivery_timestamp.CopyFrom(timestamp_of_ms(int(deliver)))
    if receipt_handle is not None:
        system.receipt_handle = receipt_handle
    if invisible_time_ms is not None:
        system.invisible_duration.CopyFrom(duration_of_ms(invisible_time_ms))
    group = props.get(SHARDING_KEY)
    if group:
        system.message_group = group
    trace = props.get(TRACE_CONTEXT)
    if trace:
        system.trace_context = trace
    immunity = props.get(MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS)
    if immunity and immunity.isdigit():
        system.orphaned_transaction_recovery_duration.CopyFrom(Duration(seconds=int(immunity)))
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTY_NAMES}
    return pb.Message(
        topic=resource(msg.topic, namespace),
        user_properties=user,
        system_properties=system,
        body=msg.body,
    )


def now_ms() -> int:
    return int(time.time() * 1000)
