"""The system groups: what a broker creates at start, and what listings for people hide.

The broker, `rmq top` and `rmq group list` all follow RocketMQ 4.9's
SubscriptionGroupManager.init: the broker makes SELF_TEST_C_GROUP but not __MONITOR_CONSUMER, and
listings hide "CID_RMQ_SYS_TRANS" (the value of CID_SYS_RMQ_TRANS, not the Java constant's name).
The lists are spelled out here, from RocketMQ's source, not imported: they are the specification.
"""

from __future__ import annotations

import pytest

from broker.subscription import SubscriptionGroupManager
from common.mixall import is_system_group

# SubscriptionGroupManager.init, RocketMQ 4.9, in its order
ROCKETMQ_SYSTEM_GROUPS = [
    "TOOLS_CONSUMER",
    "FILTERSRV_CONSUMER",
    "SELF_TEST_C_GROUP",
    "CID_ONS-HTTP-PROXY",
    "CID_ONSAPI_PULL",
    "CID_ONSAPI_PERMISSION",
    "CID_ONSAPI_OWNER",
    "CID_RMQ_SYS_TRANS",
]


def test_a_broker_starts_with_rocketmqs_system_groups() -> None:
    assert list(SubscriptionGroupManager().table) == ROCKETMQ_SYSTEM_GROUPS


@pytest.mark.parametrize(
    ("group", "hidden"),
    [
        *((g, True) for g in ROCKETMQ_SYSTEM_GROUPS),
        ("__MONITOR_CONSUMER", True),  # MixAll.MONITOR_CONSUMER_GROUP, a tool's group
        ("CID_RMQ_SYS_ANYTHING", True),  # MixAll.isSysConsumerGroup
        ("orders-consumer", False),
        ("CID_SYS_RMQ_TRANS", False),  # not a group anyone makes: no special case
    ],
)
def test_listings_hide_the_system_groups(group: str, hidden: bool) -> None:
    assert is_system_group(group) is hidden
