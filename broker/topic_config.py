"""The broker's topic table (RocketMQ ``TopicConfigManager``).

Theory of operation
-------------------
Every topic the broker serves has a ``TopicConfig`` (queue counts, permission) in one table,
persisted as ``config/topics.json`` (a TopicConfigSerializeWrapper) and sent whole to every
nameserver in REGISTER_BROKER.  The table's ``DataVersion`` is bumped on every change so a
nameserver (and a slave syncing from its master) can tell a new table from an old one.

System topics are created at start like ``TopicConfigManager``'s constructor does: TBW102 (the
template for auto-created topics: perm INHERIT|READ|WRITE, ``defaultTopicQueueNums`` queues,
only with ``autoCreateTopicEnable``), SELF_TEST_TOPIC, the cluster-name and broker-name topics,
OFFSET_MOVED_EVENT, SCHEDULE_TOPIC_XXXX (18 queues, one per delay level), and the cluster's
reply topic.

Topics appear in three other ways:

* a producer sends to a missing topic with ``defaultTopic=TBW102``: created from the template if
  the template has PERM_INHERIT, with ``min(requested, template.writeQueueNums)`` queues and
  the template's perm minus INHERIT (:meth:`create_topic_in_send_message_method`);
* a consumer heartbeats or sends a message back: ``%RETRY%group`` / ``%DLQ%group`` are created
  with the group's retry queue count (:meth:`create_topic_in_send_message_back_method`);
* an admin sends UPDATE_AND_CREATE_TOPIC.

Each creation calls ``on_change`` so the service re-registers with the nameservers at once
(RocketMQ sends that registration oneway; ours runs in the registrar's task).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import ClassVar

import attrs

from broker.config_manager import VersionedConfigManager
from common.model import DataVersion, PermName, TopicConfig, TopicConfigSerializeWrapper
from common.topics import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    BENCHMARK_TOPIC,
    OFFSET_MOVED_EVENT,
    REPLY_TOPIC_POSTFIX,
    RMQ_SYS_TRACE_TOPIC,
    SCHEDULE_TOPIC,
    SELF_TEST_TOPIC,
)

log = logging.getLogger(__name__)

SCHEDULE_QUEUE_NUMS = 18  # one queue per delay level (TopicConfigManager)
TOPIC_MAX_LENGTH = 127
_VALID_TOPIC = re.compile(r"^[%|a-zA-Z0-9_-]+$")


def validate_topic(topic: str) -> str | None:
    """None if ``topic`` is a legal name, else the reason (TopicValidator.validateTopic)."""
    if not topic or not topic.strip():
        return "The specified topic is blank."
    if not _VALID_TOPIC.match(topic):
        return "The specified topic contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
    if len(topic) > TOPIC_MAX_LENGTH:
        return "The specified topic is longer than topic max length 127."
    return None


@attrs.define(eq=False)
class TopicConfigManager(VersionedConfigManager[TopicConfig, TopicConfigSerializeWrapper]):
    wrapper_type: ClassVar[type] = TopicConfigSerializeWrapper
    table_field: ClassVar[str] = "topicConfigTable"

    broker_name: str = "broker-a"
    cluster_name: str = "DefaultCluster"
    auto_create_topic_enable: bool = True
    # ours: auto-creation stops once this many topics exist (each auto-created topic holds its
    # queue files open; admins can still create topics)
    auto_create_topic_max: int = 1000
    default_topic_queue_nums: int = 8
    cluster_topic_enable: bool = True
    broker_topic_enable: bool = True
    trace_topic_enable: bool = False
    # called after every change of the table (the service re-registers with the nameservers)
    on_change: Callable[[], None] | None = None
    # topic name -> config; names are unique keys, values are immutable TopicConfig
    table: dict[str, TopicConfig] = attrs.field(factory=dict, init=False)
    # bumped on every change (never goes back; restored from topics.json)
    data_version: DataVersion = attrs.field(factory=DataVersion.now, init=False)
    # topics that exist only because the broker starts with them (not removable by admins)
    system_topics: set[str] = attrs.field(factory=set, init=False)
    # sends refused because auto_create_topic_max was reached
    auto_create_refused: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        def sys(
            name: str, read: int, write: int, perm: int = PermName.READ | PermName.WRITE
        ) -> None:
            self.table[name] = TopicConfig(name, read, write, perm)
            self.system_topics.add(name)

        if self.auto_create_topic_enable:
            n = self.default_topic_queue_nums
            sys(
                AUTO_CREATE_TOPIC_KEY_TOPIC, n, n, PermName.INHERIT | PermName.READ | PermName.WRITE
            )
            sys(BENCHMARK_TOPIC, 1024, 1024)
        sys(SELF_TEST_TOPIC, 1, 1)
        perm = PermName.INHERIT
        if self.cluster_topic_enable:
            perm |= PermName.READ | PermName.WRITE
        sys(self.cluster_name, 16, 16, perm)
        perm = PermName.INHERIT
        if self.broker_topic_enable:
            perm |= PermName.READ | PermName.WRITE
        sys(self.broker_name, 1, 1, perm)
        sys(OFFSET_MOVED_EVENT, 1, 1)
        sys(SCHEDULE_TOPIC, SCHEDULE_QUEUE_NUMS, SCHEDULE_QUEUE_NUMS)
        if self.trace_topic_enable:
            sys(RMQ_SYS_TRACE_TOPIC, 1, 1)
        sys(f"{self.cluster_name}_{REPLY_TOPIC_POSTFIX}", 1, 1)

    # --- reads ------------------------------------------------------------------------------
    def select_topic_config(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def __contains__(self, topic: str) -> bool:
        return topic in self.table

    def topic_names(self) -> list[str]:
        return list(self.table)

    # --- writes (JSON and persistence: VersionedConfigManager) ------------------------------
    def update_topic_config(self, tc: TopicConfig) -> TopicConfig:
        old = self.table.get(tc.topicName)
        self.table[tc.topicName] = tc
        if old != tc:
            log.info("topic config %s: %s -> %s", tc.topicName, old, tc)
            self._changed()
        return tc

    def delete_topic_config(self, topic: str) -> bool:
        if self.table.pop(topic, None) is None:
            return False
        log.info("topic %s deleted", topic)
        self._changed()
        return True

    def create_topic_in_send_message_method(
        self,
        topic: str,
        default_topic: str,
        client_default_queue_nums: int,
        topic_sys_flag: int = 0,
    ) -> TopicConfig | None:
        """Auto-create ``topic`` from the ``default_topic`` template (None if not allowed)."""
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        template = self.table.get(default_topic)
        if template is None:
            log.warning("create topic %s: default topic %s does not exist", topic, default_topic)
            return None
        if default_topic == AUTO_CREATE_TOPIC_KEY_TOPIC and not self.auto_create_topic_enable:
            return None
        if len(self.table) - len(self.system_topics) >= self.auto_create_topic_max:
            self.auto_create_refused += 1
            if self.auto_create_refused % 1000 == 1:
                log.warning(
                    "not auto-creating topic %s: %d topics is the limit (autoCreateTopicMax)",
                    topic,
                    self.auto_create_topic_max,
                )
            return None
        if not PermName.is_inherited(template.perm):
            log.warning(
                "create topic %s: default topic %s has no inherit perm", topic, default_topic
            )
            return None
        queue_nums = min(max(client_default_queue_nums, 1), template.writeQueueNums)
        if queue_nums <= 0:
            return None
        tc = TopicConfig(
            topicName=topic,
            readQueueNums=queue_nums,
            writeQueueNums=queue_nums,
            perm=template.perm & ~PermName.INHERIT,
            topicSysFlag=topic_sys_flag,
        )
        log.info("auto-created topic %s from %s: %s", topic, default_topic, tc)
        self.table[topic] = tc
        self._changed()
        return tc

    def create_topic_in_send_message_back_method(
        self, topic: str, queue_nums: int, perm: int, topic_sys_flag: int = 0
    ) -> TopicConfig:
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        tc = TopicConfig(
            topicName=topic,
            readQueueNums=queue_nums,
            writeQueueNums=queue_nums,
            perm=perm,
            topicSysFlag=topic_sys_flag,
        )
        self.table[topic] = tc
        self._changed()
        return tc

    def remove_many(self, topics: Iterable[str]) -> None:
        changed = False
        for t in topics:
            changed |= self.table.pop(t, None) is not None
        if changed:
            self._changed()
