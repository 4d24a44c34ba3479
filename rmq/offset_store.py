"""Where a push consumer keeps its consume offsets (Java OffsetStore and its two implementations).

Theory of operation
-------------------
Both stores keep an in-memory table queue -> next offset to consume, which the consume
services raise as listener calls finish (`update_offset(..., increase_only=True)` so a late,
smaller result never moves an offset back). What differs is where the table is persisted:

* `RemoteBrokerOffsetStore` (CLUSTERING): the group's offsets live on the broker. `read_offset`
  from the store sends QUERY_CONSUMER_OFFSET (the master, or any node while the master is gone,
  like the Java store); "not found" reads as -1 and a failure as -2, Java's convention, so the
  rebalance can tell "start per consume_from" from "try again later". `persist_all` sends
  UPDATE_CONSUMER_OFFSET for every queue still assigned (every 5 s and on shutdown) and
  forgets the rest; `persist` does one queue (a queue being dropped by rebalance).
* `LocalFileOffsetStore` (BROADCASTING): each consumer has its own offsets in
  `<offset_store_dir>/<client_id>/<group>/offsets.json`, written to a temporary file and renamed
  over the old one so a crash leaves the previous or the new file, never half of one.
  Deviation: Java's file holds fastjson's MessageQueue-keyed map; ours is a list of
  `{"topic", "brokerName", "queueId", "offset"}` (only this client reads it). The file is
  small, so it is written synchronously on the event loop (no worker thread that an
  autojump clock could race).
"""

from __future__ import annotations

import enum
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from common.model import MessageQueue
from rmq.client_instance import ClientInstance
from rmq.errors import ClientError

log = logging.getLogger(__name__)


class ReadOffsetType(enum.Enum):
    MEMORY = "MEMORY"
    STORE = "STORE"
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


class OffsetStore(Protocol):
    def load(self) -> None: ...
    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None: ...
    async def read_offset(self, mq: MessageQueue, kind: ReadOffsetType) -> int: ...
    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None: ...
    async def persist(self, mq: MessageQueue) -> None: ...
    def remove_offset(self, mq: MessageQueue) -> None: ...
    def table(self) -> dict[MessageQueue, int]: ...


class _MemoryTable:
    def __init__(self) -> None:
        # queue -> next offset to consume; only ever raised when increase_only is asked
        self._table: dict[MessageQueue, int] = {}

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None:
        if offset < 0:
            return
        old = self._table.get(mq)
        if old is None or not increase_only or offset > old:
            self._table[mq] = offset

    def remove_offset(self, mq: MessageQueue) -> None:
        self._table.pop(mq, None)

    def table(self) -> dict[MessageQueue, int]:
        return dict(self._table)


class RemoteBrokerOffsetStore(_MemoryTable):
    def __init__(self, client: ClientInstance, group: str, timeout: float = 3.0) -> None:
        super().__init__()
        self._client = client
        self.group = group
        self.timeout = timeout

    def load(self) -> None:
        pass  # nothing local: the broker holds the offsets

    async def read_offset(self, mq: MessageQueue, kind: ReadOffsetType) -> int:
        if kind is not ReadOffsetType.STORE:
            found = self._table.get(mq)
            if found is not None or kind is ReadOffsetType.MEMORY:
                return -1 if found is None else found
        try:
            addr = await self._client.any_addr(mq.brokerName, mq.topic)
            stored = await self._client.api.query_consumer_offset(
                addr, self.group, mq, timeout=self.timeout
            )
        except Exception as exc:
            log.warning("query offset of %s for %s failed: %s", mq, self.group, exc)
            return -2
        if stored is None:
            return -1
        self.update_offset(mq, stored)
        return stored

    async def persist(self, mq: MessageQueue) -> None:
        offset = self._table.get(mq)
        if offset is None:
            return
        try:
            addr = await self._client.any_addr(mq.brokerName, mq.topic)
            await self._client.api.update_consumer_offset(
                addr, self.group, mq, offset, timeout=self.timeout
            )
        except Exception as exc:
            log.warning("persist offset %s of %s for %s failed: %s", offset, mq, self.group, exc)

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        keep = set(mqs)
        for mq in list(self._table):
            if mq in keep:
                await self.persist(mq)
            else:
                # no longer ours: the new owner commits it from now on
                self._table.pop(mq, None)


class LocalFileOffsetStore(_MemoryTable):
    def __init__(self, base_dir: str | os.PathLike, client_id: str, group: str) -> None:
        super().__init__()
        safe_id = client_id.replace(":", "_").replace("/", "_")
        self.path = Path(base_dir) / safe_id / group / "offsets.json"

    def load(self) -> None:
        try:
            raw = self.path.read_text("utf-8")
        except FileNotFoundError:
            return
        try:
            for e in json.loads(raw)["offsets"]:
                mq = MessageQueue(str(e["topic"]), str(e["brokerName"]), int(e["queueId"]))
                self._table[mq] = int(e["offset"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ClientError(f"offset file {self.path} is not valid: {exc}") from None

    async def read_offset(self, mq: MessageQueue, kind: ReadOffsetType) -> int:
        if kind is ReadOffsetType.STORE:
            # re-read the file: what a previous run of this client persisted
            fresh = LocalFileOffsetStore.__new__(LocalFileOffsetStore)
            _MemoryTable.__init__(fresh)
            fresh.path = self.path
            fresh.load()
            found = fresh._table.get(mq)
            if found is not None:
                self.update_offset(mq, found)
            return -1 if found is None else found
        found = self._table.get(mq)
        return -1 if found is None else found

    def _write(self) -> None:
        entries = [
            {"topic": mq.topic, "brokerName": mq.brokerName, "queueId": mq.queueId, "offset": off}
            for mq, off in sorted(
                self._table.items(), key=lambda kv: (kv[0].topic, kv[0].brokerName, kv[0].queueId)
            )
        ]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"offsets": entries}, indent=1), "utf-8")
        os.replace(tmp, self.path)

    async def persist(self, mq: MessageQueue) -> None:
        self._write_logged()

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        # keep offsets of queues not assigned right now: in broadcasting every queue is ours
        self._write_logged()

    def _write_logged(self) -> None:
        try:
            self._write()
        except OSError as exc:
            log.warning("writing offsets to %s failed: %s", self.path, exc)
