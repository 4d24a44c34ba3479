"""KVConfigManager: the nameserver's namespaced key/value store, persisted as JSON.

Theory of operation
-------------------
The table is `namespace -> key -> value`, all strings. Every change is written out at once to
`kv_config_path` as `{"configTable":{ns:{k:v}}}` (RocketMQ's kvConfig.json), so a restart sees
exactly what was acknowledged. The write is atomic: a temporary file in the same directory is
written, fsynced and renamed over the old one, so a crash mid-write leaves either the old or the
new file, never a torn one.

The file is small and changes rarely (admin commands), so writes are synchronous; a handler
that changes the table returns only after the data is on disk.

A file that cannot be parsed at start raises KVConfigError rather than being silently replaced:
overwriting it on the next put would lose what it held.
"""

from __future__ import annotations

import json
import os
import tempfile

import attrs

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

    def put(self, namespace: str, key: str, value: str) -> None:
        new = self.snapshot()
        new.setdefault(namespace, {})[key] = value
        self._commit(new)

    def get(self, namespace: str, key: str) -> str | None:
        return self._table.get(namespace, {}).get(key)

    def delete(self, namespace: str, key: str) -> None:
        if key not in self._table.get(namespace, {}):
            return
        new = self.snapshot()
        del new[namespace][key]
        if not new[namespace]:
            del new[namespace]
        self._commit(new)

    def get_namespace(self, namespace: str) -> dict[str, str] | None:
        """A copy of one namespace, or None when it has no entries."""
        kv = self._table.get(namespace)
        return dict(kv) if kv else None

    def snapshot(self) -> dict[str, dict[str, str]]:
        return {ns: dict(kv) for ns, kv in self._table.items()}

    def _commit(self, new: dict[str, dict[str, str]]) -> None:
        # Write first, then adopt: if the write fails (disk full...) memory still matches disk
        # and the caller's request fails instead of being half-applied.
        self._write(new)
        self._table = new

    def _write(self, table: dict[str, dict[str, str]]) -> None:
        data = json.dumps({"configTable": table}, indent=2, sort_keys=True).encode()
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".kvConfig.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        # Make the rename itself durable.
        try:
            dfd = os.open(directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)
