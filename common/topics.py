"""Topics no user made (RocketMQ TopicValidator's system topics, plus what brokers add).

Listings meant for people (`rmq top`, the Spark source's topicPattern) leave these out: the
fixed system topics, every %RETRY%/%DLQ% topic, reply topics, and the topics each broker creates
named after itself and its cluster (passed in as `own_names`).
"""

from __future__ import annotations

SYSTEM_TOPICS = frozenset(
    {
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "OFFSET_MOVED_EVENT",
        "SELF_TEST_TOPIC",
        "BenchmarkTest",
    }
)


def is_system_topic(topic: str, own_names: frozenset[str] | set[str] = frozenset()) -> bool:
    return (
        topic in SYSTEM_TOPICS
        or topic.startswith(("%RETRY%", "%DLQ%", "rmq_sys_", "RMQ_SYS_"))
        or topic.endswith("_REPLY_TOPIC")
        or topic in own_names
    )
