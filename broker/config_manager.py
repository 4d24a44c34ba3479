"""The one way broker tables reach and leave their JSON files (RocketMQ ``ConfigManager``).

Theory of operation
-------------------
RocketMQ has one abstract ``ConfigManager``: each table says how to ``encode`` itself and how to
``decode`` a file's text, and the base class reads ``configFilePath`` at start (``load``) and
rewrites it (``persist``).  Here the same split holds, so reading, error naming and atomic
writing exist once:

* :func:`atomic_write` (``common/config_file.py``) writes a temp file in the same directory,
  fsyncs it and renames it over the old one: a reader (or a broker restarting after a crash) sees
  the old or the new file, never a torn one.  The broker hands topic and group snapshots to a
  ``WriteBehind`` (same module) so the fsyncs happen in a worker thread, off the event loop.
* :func:`read_json_file` parses a file with the tolerant reader (fastjson's unquoted integer keys
  included, so files written by a Java broker load); a missing or blank file means "nothing
  stored yet".
* :class:`ConfigManager.load` hands the parsed JSON to the table's ``_load_obj`` and turns any
  shape error into one ``ValueError`` that names the file, so a broker refusing to start says
  which file is bad.

Two kinds of tables build on it:

* :class:`VersionedConfigManager` - topic configs and subscription groups: a ``table`` and a
  ``DataVersion`` bumped on every change, serialised as a ``*Wrapper`` object; slaves compare
  versions and ``adopt`` the master's wrapper whole.
* :class:`DirtyConfigManager` - consumer and delay offsets: changed many times a second, so
  ``persist`` rewrites the file only when something changed since the last write (or ``force``).

The bases carry methods only (no attrs fields), so each table keeps its own attrs fields,
constructor order and field comments.  The bases declare no ``__slots__``: with an empty one,
the bases' own assignments to ``table``, ``data_version`` and ``_dirty`` (slots that only the
subclasses create) do not type-check; the subclasses stay slotted attrs classes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Generic, Protocol, TypeVar

from common import serde
from common.config_file import atomic_write, read_json_file
from common.model import DataVersion


def config_dir(store_root: str | os.PathLike[str]) -> Path:
    return Path(store_root) / "config"


class Versioned(Protocol):
    """A table file's wrapper (``TopicConfigSerializeWrapper``, ``SubscriptionGroupWrapper``)."""

    dataVersion: DataVersion


# a table's value type (TopicConfig, SubscriptionGroupConfig) and its file's wrapper type
V = TypeVar("V")
W = TypeVar("W", bound=Versioned)


class ConfigManager:
    """``encode`` + ``_load_obj`` per table; ``load`` and ``persist`` written once here."""

    def encode(self) -> bytes:
        raise NotImplementedError

    def _load_obj(self, obj: object) -> None:
        """Take over the parsed JSON of the table's file; ValueError/TypeError on a bad shape."""
        raise NotImplementedError

    def load(self, path: Path) -> None:
        """Read ``path`` if it exists; ValueError naming ``path`` if it is not this table."""
        obj = read_json_file(path)
        if obj is None:
            return
        try:
            self._load_obj(obj)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from exc
        self._loaded()

    def _loaded(self) -> None:
        """Called after a file was loaded (the table now equals the file)."""

    def persist(self, path: Path) -> None:
        atomic_write(path, self.encode())


class VersionedConfigManager(ConfigManager, Generic[V, W]):
    """A ``table`` with a ``DataVersion``, stored as ``wrapper_type`` (table in ``table_field``).

    Subclasses are attrs classes with fields ``table``, ``data_version`` and ``on_change``; they
    name their value type ``V`` and their ``wrapper_type`` ``W`` as the type arguments (a
    ClassVar cannot hold a type variable, so ``wrapper_type`` itself is a plain ``type``).
    """

    wrapper_type: ClassVar[type]
    table_field: ClassVar[str]
    table: dict[str, V]
    data_version: DataVersion
    on_change: Callable[[], None] | None

    def _changed(self) -> None:
        self.data_version = self.data_version.next_version()
        if self.on_change is not None:
            self.on_change()

    def wrapper(self) -> W:
        wrapper: W = self.wrapper_type(
            **{self.table_field: dict(self.table)}, dataVersion=self.data_version
        )
        return wrapper

    def encode(self) -> bytes:
        return serde.to_json(self.wrapper())

    def adopt(self, wrapper: W) -> None:
        """Slave sync: replace the table and adopt the master's data version."""
        self.table = dict(getattr(wrapper, self.table_field))
        self.data_version = wrapper.dataVersion

    def _load_obj(self, obj: object) -> None:
        try:
            w: W = serde.converter.structure(obj, self.wrapper_type)
        except Exception as exc:
            raise ValueError(f"not a {self.wrapper_type.__name__}: {exc}") from exc
        # Stored entries override the defaults; built-in entries missing from the file stay.
        self.table.update(getattr(w, self.table_field))
        self.data_version = w.dataVersion


class DirtyConfigManager(ConfigManager):
    """A table written only when it changed: subclasses set ``_dirty`` on every change."""

    _dirty: bool

    def _loaded(self) -> None:
        self._dirty = False

    def take_snapshot(self, *, force: bool = False) -> bytes | None:
        """The encoded table if it changed since the last snapshot (or ``force``), now marked
        clean; None when there is nothing to write. Encode on the event loop (the table changes
        under it); the bytes can then be written anywhere, e.g. in a worker thread."""
        if not (self._dirty or force):
            return None
        data = self.encode()
        self._dirty = False
        return data

    def mark_dirty(self) -> None:
        """A snapshot was not written after all: write it next time."""
        self._dirty = True

    def persist(self, path: Path, *, force: bool = False) -> bool:  # type: ignore[override]
        """Write the file if anything changed (or ``force``); True when it was written."""
        data = self.take_snapshot(force=force)
        if data is None:
            return False
        try:
            atomic_write(path, data)
        except OSError:
            self.mark_dirty()
            raise
        return True
