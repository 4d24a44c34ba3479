"""RocketMQ's reserved topic names: the one place they are spelled (TopicValidator, MixAll).

Theory of operation: the names, prefixes and sets below are RocketMQ 4.9's, with its constant
names (``TopicValidator`` for the system topics, ``MixAll`` for the retry/DLQ prefixes), and
every module that needs one imports it from here; ``tests/test_constants.py`` fails when a
second definition appears. Two sets of "system topics" exist on purpose:

* ``SYSTEM_TOPICS`` is ``TopicValidator``'s set: the fixed names RocketMQ reserves.
* ``is_system_topic`` is wider, for listings meant for people (``rmq top``, the Spark
  source's topicPattern): it also hides every %RETRY%/%DLQ% topic, ``rmq_sys_``-prefixed and
  reply topics, and the topics each broker creates named after itself and its cluster
  (passed in as ``own_names``), none of which a user made.
"""

from __future__ import annotations

# The template topic a producer names in ``defaultTopic`` when it sends to a topic nobody
# created: a broker with autoCreateTopicEnable creates it at start (MixAll.DEFAULT_TOPIC).
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
# Delayed messages wait here, one queue per delay level (TopicValidator.RMQ_SYS_SCHEDULE_TOPIC,
# ScheduleMessageService.SCHEDULE_TOPIC before 4.9).
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# RocketMQ 5 timer messages wait here, queue 0, until their TIMER_OUT_MS
# (TimerMessageStore.TIMER_TOPIC = TopicValidator.SYSTEM_TOPIC_PREFIX + "wheel_timer")
TIMER_TOPIC = "rmq_sys_wheel_timer"
BENCHMARK_TOPIC = "BenchmarkTest"
RMQ_SYS_TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
RMQ_SYS_TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
RMQ_SYS_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"

SYSTEM_TOPIC_PREFIX = "rmq_sys_"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
# a cluster's reply topic is "<cluster>_REPLY_TOPIC" (TopicConfigManager)
REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"

# TopicValidator.SYSTEM_TOPIC_SET
SYSTEM_TOPICS = frozenset(
    {
        AUTO_CREATE_TOPIC_KEY_TOPIC,
        SCHEDULE_TOPIC,
        BENCHMARK_TOPIC,
        RMQ_SYS_TRANS_HALF_TOPIC,
        RMQ_SYS_TRACE_TOPIC,
        RMQ_SYS_TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        SELF_TEST_TOPIC,
        OFFSET_MOVED_EVENT,
    }
)


def retry_topic(group: str) -> str:
    """MixAll.getRetryTopic: where a group's messages to consume again go."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """MixAll.getDLQTopic: where a group's messages go once retried too often."""
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_system_topic(topic: str, own_names: frozenset[str] | set[str] = frozenset()) -> bool:
    """Whether a listing for people leaves `topic` out (wider than SYSTEM_TOPICS, see above)."""
    return (
        topic in SYSTEM_TOPICS
        or topic.startswith(
            (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX, SYSTEM_TOPIC_PREFIX, "RMQ_SYS_")
        )
        or topic.endswith("_" + REPLY_TOPIC_POSTFIX)
        or topic in own_names
    )
