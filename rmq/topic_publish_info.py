"""Which queues a producer may write and a consumer may read, from a TopicRouteData.

Theory of operation (MQClientInstance.topicRouteData2TopicPublishInfo / ...SubscribeInfo and
TopicPublishInfo.selectOneMessageQueue in the Java client), all pure:

* Publish queues: for each QueueData that is writable and whose broker has a master
  (`brokerAddrs[0]`), queue ids 0..writeQueueNums-1. QueueDatas are taken sorted by broker
  name, so the round-robin order is stable across refreshes. An `orderTopicConf`
  ("broker-a:4;broker-b:4") replaces that list, as in the Java client.
* Selection is round-robin with a cursor that starts at a random point (Java's
  ThreadLocalIndex). On a retry the previous broker is avoided when any other broker has a
  queue: one full turn looking for another broker name, else the next queue anyway.
* The TBW102 fallback: when the nameserver does not know a topic yet, the producer uses the
  route of the auto-create topic with each queue count capped at `defaultTopicQueueNums` (4);
  the broker then creates the topic on first send.
* Subscribe queues: every readable QueueData, queue ids 0..readQueueNums-1 (whether or not a
  master is up: a consumer can read from a slave).
"""

from __future__ import annotations

import random

import attrs

from common.model import BrokerData, MessageQueue, PermName, QueueData, TopicRouteData


@attrs.define(eq=False)
class TopicPublishInfo:
    topic: str
    queues: list[MessageQueue]
    # True when built from the TBW102 route because the topic itself had none yet
    from_default: bool = False
    order_topic: bool = False
    # round-robin cursor; only ever incremented (mod len(queues) when used)
    _cursor: int = attrs.field(factory=lambda: random.randrange(1 << 16))

    @property
    def ok(self) -> bool:
        return bool(self.queues)

    def broker_names(self) -> list[str]:
        return sorted({q.brokerName for q in self.queues})

    def select_queue(self, last_broker: str | None = None) -> MessageQueue:
        """The next queue; avoids `last_broker` (the one that just failed) if it can."""
        if not self.queues:
            raise LookupError(f"no writable queue for topic {self.topic}")
        n = len(self.queues)
        if last_broker is not None:
            for _ in range(n):
                self._cursor += 1
                mq = self.queues[self._cursor % n]
                if mq.brokerName != last_broker:
                    return mq
        self._cursor += 1
        return self.queues[self._cursor % n]

    def select_queue_avoiding(self, brokers: set[str]) -> MessageQueue | None:
        """The next queue of a broker not in `brokers`; None when every broker is in it."""
        n = len(self.queues)
        for _ in range(n):
            self._cursor += 1
            mq = self.queues[self._cursor % n]
            if mq.brokerName not in brokers:
                return mq
        return None

    def adopt_cursor(self, other: TopicPublishInfo | None) -> TopicPublishInfo:
        """Keep the round-robin position of the info this one replaces (route refresh)."""
        if other is not None:
            self._cursor = other._cursor
        return self


def _masters(route: TopicRouteData) -> dict[str, BrokerData]:
    return {bd.brokerName: bd for bd in route.brokerDatas if 0 in bd.brokerAddrs}


def publish_info_from_route(
    topic: str, route: TopicRouteData, *, max_queue_nums: int | None = None
) -> TopicPublishInfo:
    """The writable queues of `route` for `topic` (see the module docstring)."""
    queues: list[MessageQueue] = []
    if route.orderTopicConf:
        for item in route.orderTopicConf.split(";"):
            name, _, num = item.partition(":")
            if name and num.strip().isdigit():
                queues += [MessageQueue(topic, name, i) for i in range(int(num))]
        return TopicPublishInfo(topic, queues, order_topic=True)
    masters = _masters(route)
    for qd in sorted(route.queueDatas, key=lambda q: q.brokerName):
        if not PermName.is_writeable(qd.perm) or qd.brokerName not in masters:
            continue
        nums = qd.writeQueueNums
        if max_queue_nums is not None:
            nums = min(nums, max_queue_nums)
        queues += [MessageQueue(topic, qd.brokerName, i) for i in range(nums)]
    return TopicPublishInfo(topic, queues)


def default_publish_info(
    topic: str, default_route: TopicRouteData, default_topic_queue_nums: int = 4
) -> TopicPublishInfo:
    """Publish queues for an unknown topic, taken from the auto-create topic's route."""
    info = publish_info_from_route(topic, default_route, max_queue_nums=default_topic_queue_nums)
    info.from_default = True
    return info


def subscribe_queues(topic: str, route: TopicRouteData) -> list[MessageQueue]:
    """The readable queues of `route`, sorted by broker name then queue id."""
    out: list[MessageQueue] = []
    for qd in sorted(route.queueDatas, key=lambda q: q.brokerName):
        if PermName.is_readable(qd.perm):
            out += [MessageQueue(topic, qd.brokerName, i) for i in range(qd.readQueueNums)]
    return out


def find_broker_addr_in_subscribe(
    brokers: dict[int, str], broker_id: int, *, only_this: bool = False
) -> tuple[str, bool] | None:
    """(address, is_slave) of `broker_id`, else of id+1 for a slave id, else any address.

    MQClientInstance.findBrokerAddressInSubscribe: a consumer follows the broker's
    suggestWhichBrokerId but falls back to whatever node of that broker name is alive.
    """
    if not brokers:
        return None
    addr = brokers.get(broker_id)
    if addr is None and broker_id != 0:
        addr = brokers.get(broker_id + 1)
        if addr is not None:
            return addr, True
    if addr is not None:
        return addr, broker_id != 0
    if only_this:
        return None
    first_id = min(brokers)
    return brokers[first_id], first_id != 0


def queue_data_for(route: TopicRouteData, broker_name: str) -> QueueData | None:
    for qd in route.queueDatas:
        if qd.brokerName == broker_name:
            return qd
    return None
