"""RocketMQ's reserved group names and the master's broker id (RocketMQ's ``MixAll``).

Theory of operation: one place spells each of these, with RocketMQ 4.9's constant names and
values; every module imports them from here and ``tests/test_constants.py`` fails when a second
definition appears. (MixAll's topic names and prefixes live with the other topic names, in
``common/topics.py``.) Two sets of "system groups" exist on purpose:

* ``SYSTEM_GROUPS`` is what a broker creates at start (``SubscriptionGroupManager.init``), in
  that order.
* ``is_system_group`` is wider, for listings meant for people (``rmq top``, ``rmq group
  list``): it also hides the monitor's group and every ``CID_RMQ_SYS_`` group
  (``MixAll.isSysConsumerGroup``), none of which a user made.
"""

from __future__ import annotations

# brokerId 0 is the master of its broker name; slaves have ids > 0
MASTER_ID = 0

TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"  # mqadmin's (and our Admin's) pulls and queries
FILTERSRV_CONSUMER_GROUP = "FILTERSRV_CONSUMER"
MONITOR_CONSUMER_GROUP = "__MONITOR_CONSUMER"
SELF_TEST_CONSUMER_GROUP = "SELF_TEST_C_GROUP"
ONS_HTTP_PROXY_GROUP = "CID_ONS-HTTP-PROXY"
CID_ONSAPI_PULL_GROUP = "CID_ONSAPI_PULL"
CID_ONSAPI_PERMISSION_GROUP = "CID_ONSAPI_PERMISSION"
CID_ONSAPI_OWNER_GROUP = "CID_ONSAPI_OWNER"
# the transaction check's group: RocketMQ's constant and its value spell it differently
CID_SYS_RMQ_TRANS = "CID_RMQ_SYS_TRANS"
CID_RMQ_SYS_PREFIX = "CID_RMQ_SYS_"

# SubscriptionGroupManager.init, in its order
SYSTEM_GROUPS = (
    TOOLS_CONSUMER_GROUP,
    FILTERSRV_CONSUMER_GROUP,
    SELF_TEST_CONSUMER_GROUP,
    ONS_HTTP_PROXY_GROUP,
    CID_ONSAPI_PULL_GROUP,
    CID_ONSAPI_PERMISSION_GROUP,
    CID_ONSAPI_OWNER_GROUP,
    CID_SYS_RMQ_TRANS,
)


def is_system_group(group: str) -> bool:
    """Whether a listing for people leaves `group` out (wider than SYSTEM_GROUPS, see above)."""
    return (
        group in SYSTEM_GROUPS
        or group == MONITOR_CONSUMER_GROUP
        or group.startswith(CID_RMQ_SYS_PREFIX)
    )
