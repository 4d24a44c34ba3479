"""Consumer group settings (RocketMQ ``SubscriptionGroupManager``) and tag filters.

Theory of operation
-------------------
Every consumer group the broker has seen has a ``SubscriptionGroupConfig``: whether it may
consume, how many retry queues its ``%RETRY%group`` topic has, how often a message is retried
before it goes to ``%DLQ%group`` (``retryMaxTimes``, 16) and which broker it should read from
when it falls behind.  Groups are auto-created on first use when ``autoCreateSubscriptionGroup``
(the default), like RocketMQ.  The table is persisted as ``config/subscriptionGroup.json`` with
a DataVersion bumped on every change (slaves compare it when syncing).

``TagMessageFilter`` is the broker-side consume-queue filter (``ExpressionMessageFilter``
restricted to TAG expressions): ``*`` matches everything, otherwise the unit's tagsCode must be
one of the subscription's tag hash codes.  Clients re-filter by the tag strings themselves, so a
hash collision only costs a wasted transfer, never a wrong delivery.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import ClassVar

import attrs

from broker.config_manager import VersionedConfigManager
from common.mixall import SYSTEM_GROUPS
from common.model import (
    DataVersion,
    SubscriptionData,
    SubscriptionGroupConfig,
    SubscriptionGroupWrapper,
)
from common.string_hash import java_string_hash

log = logging.getLogger(__name__)

SUB_ALL = "*"


def build_subscription_data(
    topic: str, sub_string: str | None, expression_type: str | None = "TAG", sub_version: int = 0
) -> SubscriptionData:
    """``FilterAPI.buildSubscriptionData``: split on ``||``, trim, hash each tag."""
    expr = (sub_string or "").strip()
    if not expr or expr == SUB_ALL:
        return SubscriptionData(
            topic=topic,
            subString=SUB_ALL,
            subVersion=sub_version,
            expressionType=expression_type or "TAG",
        )
    tags = [t.strip() for t in expr.split("||") if t.strip()]
    if not tags:
        raise ValueError(f"subString split error: {sub_string!r}")
    return SubscriptionData(
        topic=topic,
        subString=expr,
        tagsSet=tags,
        codeSet=[java_string_hash(t) for t in tags],
        subVersion=sub_version,
        expressionType=expression_type or "TAG",
    )


@attrs.frozen
class TagMessageFilter:
    """Consume-queue tag filter built from one SubscriptionData."""

    match_all: bool
    codes: frozenset[int]

    @classmethod
    def of(cls, sub: SubscriptionData | None) -> TagMessageFilter:
        if sub is None:
            return cls(True, frozenset())
        if (sub.expressionType or "TAG").upper() != "TAG":
            # SQL92 is not supported: do not filter on the broker (the client filters again)
            return cls(True, frozenset())
        if sub.subscribes_all:
            return cls(True, frozenset())
        codes = set(sub.codeSet)
        if not codes:
            codes = {java_string_hash(t) for t in sub.tagsSet}
        if not codes:
            codes = {java_string_hash(t.strip()) for t in sub.subString.split("||") if t.strip()}
        return cls(False, frozenset(codes))

    def is_matched_by_consume_queue(self, tags_code: int | None) -> bool:
        if self.match_all or tags_code is None:
            return True
        return tags_code in self.codes

    def is_matched_by_commit_log(self, record: object) -> bool:
        return True


@attrs.define(eq=False)
class SubscriptionGroupManager(
    VersionedConfigManager[SubscriptionGroupConfig, SubscriptionGroupWrapper]
):
    """Group table; JSON, slave adoption and persistence come from VersionedConfigManager."""

    wrapper_type: ClassVar[type] = SubscriptionGroupWrapper
    table_field: ClassVar[str] = "subscriptionGroupTable"

    auto_create_subscription_group: bool = True
    # called after every change of the table
    on_change: Callable[[], None] | None = None
    # group name -> config
    table: dict[str, SubscriptionGroupConfig] = attrs.field(factory=dict, init=False)
    # bumped on every change
    data_version: DataVersion = attrs.field(factory=DataVersion.now, init=False)

    def __attrs_post_init__(self) -> None:
        for g in SYSTEM_GROUPS:  # as SubscriptionGroupManager.init
            self.table[g] = SubscriptionGroupConfig(groupName=g)

    def find_subscription_group_config(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config; auto-created if allowed, else None."""
        cfg = self.table.get(group)
        if cfg is None and self.auto_create_subscription_group and group:
            cfg = SubscriptionGroupConfig(groupName=group)
            self.table[group] = cfg
            log.info("auto-created subscription group %s", group)
            self._changed()
        return cfg

    def update_subscription_group_config(self, cfg: SubscriptionGroupConfig) -> None:
        old = self.table.get(cfg.groupName)
        self.table[cfg.groupName] = cfg
        if old != cfg:
            self._changed()

    def delete_subscription_group_config(self, group: str) -> bool:
        if self.table.pop(group, None) is None:
            return False
        self._changed()
        return True
