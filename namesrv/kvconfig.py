"""KVConfigManager: the nameserver's namespaced key/value store, persisted as JSON.

Theory of operation
-------------------
The table is `namespace -> key -> value`, all strings. Every change is written out at once to
`kv_config_path` as `{"configTable":{ns:{k:v}}}` (RocketMQ's kvConfig.json), so a restart sees
exactly what was acknowledged. The write is atomic: a temporary file in the same directory is
written, fsynced and renamed over the old one, so a crash mid-write leaves either the old or the
new file, never a torn one.

A handler that changes the table returns only after the data is on disk, but the write and its
fsyncs run in a worker thread, so the nameserver keeps serving routes meanwhile.  Changes are
serialised by a lock: each one starts from the table the previous one left on disk.

A file that cannot be parsed at start raises KVConfigError rather than being silently replaced:
overwriting it on the next put would lose what it held.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import trio

from common.config_file import atomic_write

# Namespace whose entries a namesrv hands to registering brokers and, with orderMessageEnable,
# puts in routes as orderTopicConf (NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG).
NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


class KVConfigError(Exception):
    """The persisted KV file exists but is not a valid kvConfig.json."""


@attrs.define(eq=False)
class KVConfigManager:
    path: str
    # namespace -> key -> value; invariant: equals the file content after every public call
    _table: dict[str, dict[str, str]] = attrs.Factory(dict)
    # held from snapshot to adoption of a change (no change starts from a stale table)
    _write_lock: trio.Lock = attrs.Factory(trio.Lock)

    @classmethod
    def load(cls, path: str) -> KVConfigManager:
        mgr = cls(path)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return mgr
        if not text.strip():
            return mgr
        try:
            data = json.loads(text)
            table = data.get("configTable") or {}
            mgr._table = {
                str(ns): {str(k): str(v) for k, v in kv.items()} for ns, kv in table.items()
            }
        except (ValueError, AttributeError) as exc:
            raise KVConfigError(f"cannot parse {path}: {exc}") from exc
        return mgr

    async def put(self, namespace: str, key: str, value: str) -> None:
        async with self._write_lock:
            new = self.snapshot()
            new.setdefault(namespace, {})[key] = value
            await self._commit(new)

    def get(self, namespace: str, key: str) -> str | None:
        return self._table.get(namespace, {}).get(key)

    async def delete(self, namespace: str, key: str) -> None:
        async with self._write_lock:
            if key not in self._table.get(namespace, {}):
                return
            new = self.snapshot()
            del new[namespace][key]
            if not new[namespace]:
                del new[namespace]
            await self._commit(new)

    def get_namespace(self, namespace: str) -> dict[str, str] | None:
        """A copy of one namespace, or None when it has no entries."""
        kv = self._table.get(namespace)
        return dict(kv) if kv else None

    def snapshot(self) -> dict[str, dict[str, str]]:
        return {ns: dict(kv) for ns, kv in self._table.items()}

    async def _commit(self, new: dict[str, dict[str, str]]) -> None:
        # Write first, then adopt: if the write fails (disk full...) memory still matches disk
        # and the caller's request fails instead of being half-applied.
        data = json.dumps({"configTable": new}, indent=2, sort_keys=True).encode()
        await trio.to_thread.run_sync(atomic_write, Path(self.path), data)
        self._table = new
