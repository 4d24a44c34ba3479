"""RocketMQ's directory layout for a DLedger member, and the move of a store from ours before it.

RocketMQ 4.9 (``DLedgerCommitLog``'s constructor: ``storeBaseDir = storePathRootDir``,
``dataStorePath = storePathDLedgerCommitLog``; ``DLedgerConfig.getDefaultPath``) keeps::

    <storePathRootDir>/dledger-<selfId>/currterm, checkpoint, index/
    <storePathDLedgerCommitLog> or <storePathRootDir>/dledger-<selfId>/data/   the data files

Until issue 27 this broker kept everything one level down, in
``<storePathDLedgerCommitLog or <storePathRootDir>/dledger_commitlog>/dledger-<selfId>/``
(data/, index/, currterm, checkpoint), so a store written by Apache RocketMQ could not be
opened in place nor ours by it.  :func:`move_legacy_layout` moves such a store to RocketMQ's
layout before the member opens its log: the data files one by one, then index/, currterm and
checkpoint, each moved only when its target is absent, so a start that dies half-way finishes
the move on the next start; the directories left empty are removed.  A member in both places
refuses to start (which one is the truth is for the operator to say).
"""

from __future__ import annotations

import logging
import os
import shutil

from broker.dledger.driver.mmap_file_store import sync_dir
from broker.store.config import MessageStoreConfig

__all__ = ["LayoutError", "legacy_member_dir", "move_legacy_layout"]

log = logging.getLogger(__name__)

_MEMBER_FILES = ("index", "currterm", "checkpoint")


class LayoutError(OSError):
    """The member's files are both where RocketMQ keeps them and where we used to."""


def legacy_member_dir(store: MessageStoreConfig) -> str:
    """Where this broker kept the member's files before RocketMQ's layout."""
    base = store.store_path_dledger_commit_log or os.path.join(
        store.store_path_root_dir, "dledger_commitlog"
    )
    return os.path.join(base, f"dledger-{store.dleger_self_id}")


def _segments(directory: str) -> list[str]:
    if not os.path.isdir(directory):
        return []
    return sorted(n for n in os.listdir(directory) if n.isdigit() and len(n) == 20)


def move_legacy_layout(store: MessageStoreConfig) -> bool:
    """Move the member's files from the old layout to RocketMQ's; True when anything moved."""
    old = legacy_member_dir(store)
    if not os.path.isdir(old):
        return False
    new = store.dledger_member_dir
    old_data = os.path.join(old, "data")
    new_data = store.dledger_data_dir
    old_segments = _segments(old_data)
    # the data files move first, the index after them: data files on both sides with the
    # index not yet moved is a move a crash cut short; with an index at the new place too,
    # two stores
    if old_segments and os.path.exists(os.path.join(new, "index")):
        raise LayoutError(
            f"DLedger data files in {old_data} (the layout before RocketMQ's) and a member "
            f"in {new}: remove the stale one"
        )
    moved = False
    os.makedirs(new, exist_ok=True)
    if old_segments:
        os.makedirs(new_data, exist_ok=True)
        for name in old_segments:
            target = os.path.join(new_data, name)
            if not os.path.exists(target):
                shutil.move(os.path.join(old_data, name), target)
                moved = True
        sync_dir(new_data)
    for name in _MEMBER_FILES:
        src, dst = os.path.join(old, name), os.path.join(new, name)
        if not os.path.exists(src):
            continue
        if not os.path.exists(dst):
            shutil.move(src, dst)
            moved = True
        else:
            raise LayoutError(f"both {src} and {dst} exist: remove the stale one")
    sync_dir(new)
    for directory in (old_data, os.path.join(old, "index")):
        if os.path.isdir(directory) and not os.listdir(directory):
            os.rmdir(directory)
    for directory in (old, os.path.dirname(old)):
        if (
            os.path.isdir(directory)
            and not os.listdir(directory)
            and directory != store.store_path_dledger_commit_log
        ):
            os.rmdir(directory)
    if moved:
        log.warning(
            "DLedger store moved from %s to RocketMQ's layout: %s (data files in %s)",
            old,
            new,
            new_data,
        )
    return moved
