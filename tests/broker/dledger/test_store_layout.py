"""RocketMQ's directory layout for a DLedger member and the move from ours before it
(broker/dledger/broker/store_layout.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from broker.dledger.broker.store_layout import LayoutError, move_legacy_layout
from broker.dledger.driver.mmap_file_store import open_file_log
from broker.dledger.driver.state_files import Checkpoint, save_checkpoint
from broker.store.config import MessageStoreConfig

pytestmark = pytest.mark.timeout(30)

DATA = 1024


def store_config(root: Path, data: Path | None = None) -> MessageStoreConfig:
    return MessageStoreConfig(
        store_path_root_dir=str(root),
        store_path_dledger_commit_log=None if data is None else str(data),
        enable_dleger_commit_log=True,
        dleger_peers="n0-127.0.0.1:40911",
        dleger_self_id="n0",
    )


def write_member(directory: Path, n: int = 12) -> None:
    flog = open_file_log(str(directory), data_file_size=DATA, index_file_size=32 * 64)
    for i in range(n):
        flog.append(1, bytes([i]) * 300)
    flog.close()
    save_checkpoint(str(directory), Checkpoint(end_index=n - 1, committed_index=n - 1))
    (directory / "currterm").write_text("currTerm=1\nvoteLeader=n0\n")


def check_member(store: MessageStoreConfig, n: int = 12) -> None:
    flog = open_file_log(
        store.dledger_member_dir,
        data_file_size=DATA,
        index_file_size=32 * 64,
        data_dir=store.dledger_data_dir,
    )
    try:
        assert flog.end_index == n - 1
        bodies = [entry.body for entry in map(flog.get, range(n)) if entry is not None]
        assert bodies == [bytes([i]) * 300 for i in range(n)]
    finally:
        flog.close()
    member = Path(store.dledger_member_dir)
    assert (member / "currterm").exists() and (member / "checkpoint").exists()


def test_the_default_layout_moves_to_rocketmqs(tmp_path: Path) -> None:
    write_member(tmp_path / "dledger_commitlog" / "dledger-n0")
    store = store_config(tmp_path)
    assert move_legacy_layout(store)
    assert sorted(os.listdir(tmp_path)) == ["dledger-n0"]
    assert sorted(os.listdir(tmp_path / "dledger-n0")) == [
        "checkpoint",
        "currterm",
        "data",
        "index",
    ]
    check_member(store)
    assert not move_legacy_layout(store)  # nothing left to move


def test_store_path_dledger_commit_log_becomes_the_data_directory(tmp_path: Path) -> None:
    raft = tmp_path / "raft"
    write_member(raft / "dledger-n0")
    segments = sorted(os.listdir(raft / "dledger-n0" / "data"))
    assert len(segments) > 2
    store = store_config(tmp_path / "root", raft)
    assert move_legacy_layout(store)
    assert sorted(os.listdir(raft)) == segments
    assert sorted(os.listdir(tmp_path / "root" / "dledger-n0")) == [
        "checkpoint",
        "currterm",
        "index",
    ]
    check_member(store)


def test_a_move_cut_short_is_finished(tmp_path: Path) -> None:
    old = tmp_path / "dledger_commitlog" / "dledger-n0"
    write_member(old)
    store = store_config(tmp_path)
    new_data = tmp_path / "dledger-n0" / "data"
    new_data.mkdir(parents=True)
    first = sorted(os.listdir(old / "data"))[:2]
    for name in first:  # the first two data files moved, then the start died
        shutil.move(str(old / "data" / name), str(new_data / name))
    assert move_legacy_layout(store)
    check_member(store)
    assert not (tmp_path / "dledger_commitlog").exists()


def test_a_member_in_both_places_refuses_to_start(tmp_path: Path) -> None:
    write_member(tmp_path / "dledger_commitlog" / "dledger-n0")
    write_member(tmp_path / "dledger-n0", n=3)
    with pytest.raises(LayoutError, match="stale"):
        move_legacy_layout(store_config(tmp_path))


def test_nothing_to_move(tmp_path: Path) -> None:
    assert not move_legacy_layout(store_config(tmp_path))
    assert os.listdir(tmp_path) == []
