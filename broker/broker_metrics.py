"""The broker's metrics counted on the request path (RocketMQ 5 ``BrokerMetricsManager``).

Theory of operation
-------------------
Two halves, by what a number costs:

* **counted on the request path** (:class:`BrokerMetrics`): messages and bytes in per (topic,
  message type), out per (topic, group), the message size histogram, sends to the DLQ, and the
  next offset each group's last pull returned per queue (for inflight and ready).  Each event is
  one dict lookup of a plain list and a few integer adds, whatever the batch size: no
  prometheus_client object, label tuple or lock is touched per message.  The SEND path calls
  ``on_put`` once per put (a batch is one call), the PULL path ``on_get`` once per FOUND pull;
* **computed at scrape time** (:class:`BrokerCollector`): the counters above turned into metric
  families, and every gauge read from the controller's tables and the store: consumer lag,
  inflight and ready, topic and group numbers, connections, storage size, flush and dispatch
  behind, disk ratio and refusal state, HA slave lag, DLedger state.  A scrape walks the offset
  table and the store directory; nothing of it runs per message.

Consumer lag is GET_CONSUME_STATS's (``broker/processor/admin.py``, what ``rmq group progress``
shows): per write queue of the topic, the broker's max offset minus the group's committed
offset (0 when none), summed over the queues.

All of it runs on the broker's Trio thread (the counters are plain ints, no lock needed).
This module is the first half; the second, and the wiring that starts the HTTP exporter when
``metricsPromExporterPort`` is set, is ``broker/metrics_exporter.py``.  The controller holds
the counters as ``controller.metrics`` (None while metrics are off: the request paths then
pay one attribute test).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

# rocketmq_message_size buckets (RocketMQ 5 BrokerMetricsManager): 1 KiB .. 4 MiB
MESSAGE_SIZE_BUCKETS = (1024.0, 4096.0, 512 * 1024.0, 1024 * 1024.0, 2 * 1024**2, 4 * 1024**2)

NORMAL, FIFO, DELAY, TRANSACTION = "normal", "fifo", "delay", "transaction"

# message property markers in the header's properties string (name \x01 value \x02 ...):
# TopicMessageType.parseFromMessageProperty's order: transaction, delay, FIFO, normal
_TRANSACTION_MARK = "TRAN_MSG\x01true"
# DELAY (a level) or one of the TIMER_* delivery times (TIMER_DELIVER_MS, TIMER_DELAY_SEC,
# TIMER_DELAY_MS): one scan for the three
_DELAY_MARKS = ("DELAY\x01", "TIMER_D")
_FIFO_MARK = "__SHARDINGKEY\x01"


def message_type(properties: str) -> str:
    """RocketMQ 5's ``message_type`` of a message with these (encoded) properties."""
    if not properties:
        return NORMAL
    if _TRANSACTION_MARK in properties:
        return TRANSACTION
    for mark in _DELAY_MARKS:
        if mark in properties:
            return DELAY
    if _FIFO_MARK in properties:
        return FIFO
    return NORMAL


class BrokerMetrics:
    """The counters of the request path (module docstring)."""

    def __init__(self) -> None:
        # (topic, message type) -> [messages, bytes, size bucket counts..., size sum]
        self.puts: dict[tuple[str, str], list[int]] = {}
        # (topic, group) -> [messages, bytes]
        self.gets: dict[tuple[str, str], list[int]] = {}
        # (original topic, group) -> messages moved to the DLQ
        self.dlq: dict[tuple[str, str], int] = {}
        # (group, topic) -> queue id -> the next offset the group's last FOUND pull returned
        self.pulled: dict[tuple[str, str], dict[int, int]] = {}

    def on_put(self, topic: str, properties: str, messages: int, nbytes: int) -> None:
        """One stored put (a batch: once, its mean size observed once, as RocketMQ does)."""
        kind = message_type(properties)
        row = self.puts.get((topic, kind))
        if row is None:
            row = self.puts[(topic, kind)] = [0] * (3 + len(MESSAGE_SIZE_BUCKETS) + 1)
        row[0] += messages
        row[1] += nbytes
        size = nbytes // messages if messages else nbytes
        row[2 + bisect.bisect_left(MESSAGE_SIZE_BUCKETS, size)] += 1
        row[-1] += size

    def on_get(
        self, topic: str, group: str, queue_id: int, messages: int, nbytes: int, next_offset: int
    ) -> None:
        row = self.gets.get((topic, group))
        if row is None:
            row = self.gets[(topic, group)] = [0, 0]
        row[0] += messages
        row[1] += nbytes
        queues = self.pulled.get((group, topic))
        if queues is None:
            queues = self.pulled[(group, topic)] = {}
        queues[queue_id] = next_offset

    def on_dlq(self, topic: str, group: str) -> None:
        self.dlq[(topic, group)] = self.dlq.get((topic, group), 0) + 1

    def forget_topics(self, topics: Sequence[str]) -> None:
        """Deleted topics: their pull positions go (their counters stay: counters never fall)."""
        gone = set(topics)
        for key in [k for k in self.pulled if k[1] in gone]:
            del self.pulled[key]
