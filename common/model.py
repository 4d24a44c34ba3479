"""attrs value types for RocketMQ's JSON bodies, with RocketMQ's own (camelCase) field names.

Theory of operation: each class mirrors one Java body class (``common/protocol/body/`` and
``common/protocol/route/`` in apache/rocketmq 4.9), and its attribute names are the JSON names, so
``serde.converter`` maps them 1:1 and there is no renaming table to get wrong. Input is lenient the
way fastjson is: unknown keys are ignored, missing fields take Java's defaults, numbers may arrive
as strings (the C++ client sends ``"subVersion":"1795313758651"``), integer map keys arrive quoted
or bare. Output is strict JSON with null fields omitted (fastjson skips nulls).

Special cases registered on the converter here:

* ``QueueData`` is written with both ``topicSysFlag`` (4.9.0+) and ``topicSynFlag`` (older clients,
  the C++ client) and read from either.
* The consumer enums (:class:`ConsumeType`, :class:`MessageModel`, :class:`ConsumeFromWhere`) are
  written as names (Java) and read from names or ordinals (the C++ client sends ints).

Value types are frozen (replace with ``attrs.evolve``); aggregates that servers build up are mutable.
"""

from __future__ import annotations

import enum
import time
from typing import Any

import attrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn

from common.serde import converter


class PermName:
    PRIORITY = 8
    READ = 4
    WRITE = 2
    INHERIT = 1

    @staticmethod
    def is_readable(perm: int) -> bool:
        return bool(perm & PermName.READ)

    @staticmethod
    def is_writeable(perm: int) -> bool:
        return bool(perm & PermName.WRITE)

    @staticmethod
    def is_inherited(perm: int) -> bool:
        return bool(perm & PermName.INHERIT)

    @staticmethod
    def to_string(perm: int) -> str:
        return (
            ("R" if perm & PermName.READ else "-")
            + ("W" if perm & PermName.WRITE else "-")
            + ("X" if perm & PermName.INHERIT else "-")
        )


class TopicSysFlag:
    UNIT = 1
    UNIT_SUB = 2


def _now_ms() -> int:
    # A wall-clock *timestamp* stored in data, never used to measure a timeout.
    return int(time.time() * 1000)


@attrs.frozen
class DataVersion:
    timestamp: int = 0
    counter: int = 0

    @classmethod
    def now(cls) -> DataVersion:
        return cls(timestamp=_now_ms(), counter=0)

    def next_version(self, now_ms: int | None = None) -> DataVersion:
        """Java ``nextVersion``: new timestamp, counter + 1."""
        return DataVersion(
            timestamp=_now_ms() if now_ms is None else now_ms, counter=self.counter + 1
        )


@attrs.frozen
class TopicConfig:
    topicName: str
    readQueueNums: int = 16
    writeQueueNums: int = 16
    perm: int = PermName.READ | PermName.WRITE
    topicFilterType: str = "SINGLE_TAG"
    topicSysFlag: int = 0
    order: bool = False
    # RocketMQ 5's TopicConfig.attributes, e.g. {"message.type": "FIFO"}
    # (common/topic_message_type.py); None (left out of the JSON, as 4.x writes it) when empty;
    # not hashed: a dict is not hashable
    attributes: dict[str, str] | None = attrs.field(default=None, hash=False)

    def encode(self) -> str:
        """The space-separated form of the compressed REGISTER_BROKER body (Java's ``encode``)."""
        return (
            f"{self.topicName} {self.readQueueNums} {self.writeQueueNums} "
            f"{self.perm} {self.topicFilterType}"
        )

    @classmethod
    def decode(cls, text: str) -> TopicConfig:
        parts = text.split(" ")
        if len(parts) < 5:
            raise ValueError(f"bad encoded TopicConfig: {text!r}")
        return cls(
            topicName=parts[0],
            readQueueNums=int(parts[1]),
            writeQueueNums=int(parts[2]),
            perm=int(parts[3]),
            topicFilterType=parts[4],
        )


@attrs.define
class TopicConfigSerializeWrapper:
    topicConfigTable: dict[str, TopicConfig] = attrs.field(factory=dict)
    dataVersion: DataVersion = attrs.field(factory=DataVersion)


@attrs.define
class RegisterBrokerBody:
    topicConfigSerializeWrapper: TopicConfigSerializeWrapper = attrs.field(
        factory=TopicConfigSerializeWrapper
    )
    filterServerList: list[str] = attrs.field(factory=list)


@attrs.frozen
class QueueData:
    brokerName: str
    readQueueNums: int = 0
    writeQueueNums: int = 0
    perm: int = PermName.READ | PermName.WRITE
    topicSysFlag: int = 0


@attrs.define
class BrokerData:
    cluster: str
    brokerName: str
    brokerAddrs: dict[int, str] = attrs.field(factory=dict)

    def select_broker_addr(self) -> str | None:
        """The master's address if present, else any (Java ``selectBrokerAddr`` without random)."""
        if 0 in self.brokerAddrs:
            return self.brokerAddrs[0]
        return next(iter(self.brokerAddrs.values()), None)


@attrs.define
class TopicRouteData:
    queueDatas: list[QueueData] = attrs.field(factory=list)
    brokerDatas: list[BrokerData] = attrs.field(factory=list)
    filterServerTable: dict[str, list[str]] = attrs.field(factory=dict)
    orderTopicConf: str | None = None


@attrs.define
class ClusterInfo:
    brokerAddrTable: dict[str, BrokerData] = attrs.field(factory=dict)
    clusterAddrTable: dict[str, list[str]] = attrs.field(factory=dict)


@attrs.define
class TopicList:
    topicList: list[str] = attrs.field(factory=list)
    brokerAddr: str | None = None


@attrs.define
class KVTable:
    table: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen
class MessageQueue:
    topic: str
    brokerName: str
    queueId: int


class ConsumeType(enum.IntEnum):
    CONSUME_ACTIVELY = 0  # pull
    CONSUME_PASSIVELY = 1  # push


class MessageModel(enum.IntEnum):
    """How a group shares a topic; the values are Java's ordinals (what the C++ client sends)."""

    BROADCASTING = 0
    CLUSTERING = 1


class ConsumeFromWhere(enum.IntEnum):
    """Where a push consumer starts a queue its group has no offset for (RocketMQ 4.9's
    members and ordinals; the three deprecated ones behave as CONSUME_FROM_LAST_OFFSET)."""

    CONSUME_FROM_LAST_OFFSET = 0
    CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST = 1  # deprecated in RocketMQ
    CONSUME_FROM_MIN_OFFSET = 2  # deprecated in RocketMQ
    CONSUME_FROM_MAX_OFFSET = 3  # deprecated in RocketMQ
    CONSUME_FROM_FIRST_OFFSET = 4
    CONSUME_FROM_TIMESTAMP = 5
    # The rmq client's short spellings (PushConsumer(consume_from=ConsumeFromWhere.FIRST_OFFSET),
    # LitePullConsumer(consume_from="FIRST_OFFSET")): aliases of the same members, so `.name`
    # and the wire keep RocketMQ's names and nothing can drift.
    LAST_OFFSET = 0
    FIRST_OFFSET = 4
    TIMESTAMP = 5


@attrs.frozen
class SubscriptionData:
    topic: str
    subString: str = "*"
    tagsSet: list[str] = attrs.field(factory=list)
    codeSet: list[int] = attrs.field(factory=list)
    subVersion: int = 0
    expressionType: str = "TAG"
    classFilterMode: bool = False

    @property
    def subscribes_all(self) -> bool:
        return self.subString in ("*", "") or not self.subString.strip()


@attrs.define
class ConsumerData:
    groupName: str
    consumeType: ConsumeType = ConsumeType.CONSUME_PASSIVELY
    messageModel: MessageModel = MessageModel.CLUSTERING
    consumeFromWhere: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    subscriptionDataSet: list[SubscriptionData] = attrs.field(factory=list)
    unitMode: bool = False


@attrs.frozen
class ProducerData:
    groupName: str


@attrs.define
class HeartbeatData:
    clientID: str
    producerDataSet: list[ProducerData] = attrs.field(factory=list)
    consumerDataSet: list[ConsumerData] = attrs.field(factory=list)


@attrs.frozen
class SubscriptionGroupConfig:
    groupName: str
    consumeEnable: bool = True
    consumeFromMinEnable: bool = True
    consumeBroadcastEnable: bool = True
    retryQueueNums: int = 1
    retryMaxTimes: int = 16
    brokerId: int = 0
    whichBrokerWhenConsumeSlowly: int = 1
    notifyConsumerIdsChangedEnable: bool = True
    # RocketMQ 5: pop serves such a group in FIFO order (broker/pop/order.py)
    consumeMessageOrderly: bool = False


@attrs.define
class SubscriptionGroupWrapper:
    subscriptionGroupTable: dict[str, SubscriptionGroupConfig] = attrs.field(factory=dict)
    dataVersion: DataVersion = attrs.field(factory=DataVersion)


@attrs.define
class ConsumerOffsetSerializeWrapper:
    """``{"offsetTable":{"topic@group":{queueId:offset}}}`` (``ConsumerOffsetManager.java``)."""

    offsetTable: dict[str, dict[int, int]] = attrs.field(factory=dict)


@attrs.define
class DelayOffsetSerializeWrapper:
    """``{"offsetTable":{delayLevel:offset}}`` (``store/schedule/ScheduleMessageService.java``)."""

    offsetTable: dict[int, int] = attrs.field(factory=dict)


@attrs.define
class GetConsumerListByGroupResponseBody:
    consumerIdList: list[str] = attrs.field(factory=list)


@attrs.define
class CheckClientRequestBody:
    """CHECK_CLIENT_CONFIG's body: a consumer asks whether the broker takes its subscription."""

    clientId: str | None = None
    group: str | None = None
    subscriptionData: SubscriptionData | None = None


@attrs.define
class LockBatchRequestBody:
    consumerGroup: str = ""
    clientId: str = ""
    mqSet: list[MessageQueue] = attrs.field(factory=list)
    onlyThisBroker: bool = False


@attrs.define
class LockBatchResponseBody:
    lockOKMQSet: list[MessageQueue] = attrs.field(factory=list)


@attrs.define
class UnlockBatchRequestBody:
    consumerGroup: str = ""
    clientId: str = ""
    mqSet: list[MessageQueue] = attrs.field(factory=list)
    onlyThisBroker: bool = False


# --- converter hooks ---------------------------------------------------------------------------


def _enum_hook(cls: type[enum.IntEnum]) -> None:
    def structure(value: Any, _type: Any) -> enum.IntEnum:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            if value in cls.__members__:
                return cls[value]
            if value.lstrip("-").isdigit():
                return cls(int(value))
            raise ValueError(f"{value!r} is not a {cls.__name__}")
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value)
        raise ValueError(f"{value!r} is not a {cls.__name__}")

    converter.register_structure_hook(cls, structure)
    converter.register_unstructure_hook(cls, lambda v: v.name)


for _enum in (ConsumeType, MessageModel, ConsumeFromWhere):
    _enum_hook(_enum)

_queue_data_structure = make_dict_structure_fn(QueueData, converter)
_queue_data_unstructure = make_dict_unstructure_fn(QueueData, converter)


def _structure_queue_data(value: Any, _type: Any) -> QueueData:
    if isinstance(value, dict) and "topicSysFlag" not in value and "topicSynFlag" in value:
        value = {**value, "topicSysFlag": value["topicSynFlag"]}
    return _queue_data_structure(value, QueueData)


def _unstructure_queue_data(qd: QueueData) -> dict[str, Any]:
    out = _queue_data_unstructure(qd)
    out["topicSynFlag"] = qd.topicSysFlag  # pre-4.9.0 name, still read by the C++ client
    return out


converter.register_structure_hook(QueueData, _structure_queue_data)
converter.register_unstructure_hook(QueueData, _unstructure_queue_data)
