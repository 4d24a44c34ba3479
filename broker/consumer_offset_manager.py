"""Consumer offsets (RocketMQ ``ConsumerOffsetManager``).

Theory of operation
-------------------
The broker keeps, per ``topic@group`` key, the next logical queue offset each consumer group
committed for each queue (``broker/offset/ConsumerOffsetManager.java``).  Commits come from
UPDATE_CONSUMER_OFFSET and from the COMMIT_OFFSET flag of PULL_MESSAGE; reads from
QUERY_CONSUMER_OFFSET.  The table lives in memory and is written to
``<storeRoot>/config/consumerOffset.json`` every few seconds and at shutdown by the broker service;
a crash loses at most that interval, exactly as in RocketMQ (clients re-commit on their own 5 s
cadence).

Reading and atomically writing the file is :class:`broker.config_manager.DirtyConfigManager`'s
job (``atomic_write``, ``read_json_file`` and ``config_dir`` are re-exported here for callers).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import attrs

from broker.config_manager import DirtyConfigManager, atomic_write, config_dir, read_json_file
from common import serde

log = logging.getLogger(__name__)

TOPIC_GROUP_SEPARATOR = "@"


@attrs.define(eq=False)
class ConsumerOffsetManager(DirtyConfigManager):
    # "topic@group" -> {queueId: next offset}; offsets are >= 0 (negative commits are ignored)
    _table: dict[str, dict[int, int]] = attrs.field(factory=dict)
    # set when the table changed since the last persist (skip rewriting an unchanged file)
    _dirty: bool = attrs.field(default=False, init=False)

    @staticmethod
    def key(topic: str, group: str) -> str:
        return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        if offset < 0:
            # The C++ client sends commitOffset "-1" on pulls when it has nothing to commit.
            return
        queues = self._table.setdefault(self.key(topic, group), {})
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self._dirty = True

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, -1 when the group never committed for that queue."""
        return self._table.get(self.key(topic, group), {}).get(queue_id, -1)

    def offsets_of(self, group: str, topic: str) -> dict[int, int]:
        return dict(self._table.get(self.key(topic, group), {}))

    def groups_of_topic(self, topic: str) -> set[str]:
        out = set()
        for k in self._table:
            t, _, g = k.partition(TOPIC_GROUP_SEPARATOR)
            if t == topic:
                out.add(g)
        return out

    def group_topics(self) -> list[tuple[str, str]]:
        """Every (group, topic) with committed offsets."""
        out = []
        for k in self._table:
            t, _, g = k.rpartition(TOPIC_GROUP_SEPARATOR)
            out.append((g, t))
        return out

    def topics_of_group(self, group: str) -> set[str]:
        out = set()
        for k in self._table:
            t, _, g = k.rpartition(TOPIC_GROUP_SEPARATOR)
            if g == group:
                out.add(t)
        return out

    def remove_topics(self, topics: Iterable[str]) -> None:
        gone = set(topics)
        for k in list(self._table):
            if k.partition(TOPIC_GROUP_SEPARATOR)[0] in gone:
                del self._table[k]
                self._dirty = True

    def remove_offset(self, group: str) -> None:
        """Forget every offset of ``group`` (deleteSubGroup with removeOffset)."""
        for k in list(self._table):
            if k.rpartition(TOPIC_GROUP_SEPARATOR)[2] == group:
                del self._table[k]
                self._dirty = True

    def put_all(self, table: dict[str, dict[int, int]]) -> None:
        """Slave sync: adopt the master's offsets (RocketMQ ``offsetTable.putAll``)."""
        for k, queues in table.items():
            self._table[k] = dict(queues)
        self._dirty = True

    # --- JSON -------------------------------------------------------------------------------
    def to_wire(self) -> dict[str, dict[str, dict[str, int]]]:
        return {
            "offsetTable": {
                k: {str(q): o for q, o in sorted(v.items())} for k, v in self._table.items()
            }
        }

    def encode(self) -> bytes:
        return serde.dumps(self.to_wire())

    @staticmethod
    def parse_table(obj: object) -> dict[str, dict[int, int]]:
        """``{"offsetTable": {"t@g": {0: 12}}}`` -> table; ValueError on a wrong shape."""
        if not isinstance(obj, dict):
            raise ValueError("consumer offsets: expected a JSON object")
        raw = obj.get("offsetTable") or {}
        if not isinstance(raw, dict):
            raise ValueError("consumer offsets: offsetTable is not an object")
        table: dict[str, dict[int, int]] = {}
        for k, queues in raw.items():
            if not isinstance(queues, dict):
                raise ValueError(f"consumer offsets: entry {k!r} is not an object")
            table[str(k)] = {int(q): int(o) for q, o in queues.items()}
        return table

    def _load_obj(self, obj: object) -> None:
        self._table = self.parse_table(obj)


__all__ = ["ConsumerOffsetManager", "atomic_write", "config_dir", "read_json_file"]
