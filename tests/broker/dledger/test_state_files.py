"""The ``currterm`` and ``checkpoint`` files: DLedger's properties, written durably and atomically,
read back tolerantly, and never silently reset when they do not parse."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.dledger.driver.state_files import (
    Checkpoint,
    StateFileError,
    load_checkpoint,
    load_hard_state,
    save_checkpoint,
    save_hard_state,
)
from broker.dledger.raft.member_state import HardState


def test_missing_files_are_a_fresh_member(tmp_path: Path) -> None:
    assert load_hard_state(str(tmp_path)) == HardState(term=0, voted_for=None)
    assert load_checkpoint(str(tmp_path)) is None
    assert load_hard_state(str(tmp_path / "not-yet")) == HardState()


def test_hard_state_round_trip_in_dledger_format(tmp_path: Path) -> None:
    d = str(tmp_path)
    save_hard_state(d, HardState(term=5, voted_for="n2"))
    assert (tmp_path / "currterm").read_text() == "currTerm=5\nvoteLeader=n2\n"
    assert load_hard_state(d) == HardState(5, "n2")
    save_hard_state(d, HardState(term=6))
    assert (tmp_path / "currterm").read_text() == "currTerm=6\nvoteLeader=\n"
    assert load_hard_state(d) == HardState(6, None)
    assert sorted(os.listdir(d)) == ["currterm"]  # no temp file left behind


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    d = str(tmp_path)
    save_checkpoint(d, Checkpoint(end_index=10, committed_index=8))
    assert (tmp_path / "checkpoint").read_text() == "endIndex=10\ncommittedIndex=8\n"
    assert load_checkpoint(d) == Checkpoint(10, 8)
    save_checkpoint(d, Checkpoint())
    assert load_checkpoint(d) == Checkpoint(end_index=-1, committed_index=-1)
    assert sorted(os.listdir(d)) == ["checkpoint"]


def test_reads_what_java_properties_writes(tmp_path: Path) -> None:
    (tmp_path / "currterm").write_text(
        "#Mon Nov 23 22:00:00 UTC 2026\n\ncurrTerm = 12\r\nvoteLeader=n0\n"
    )
    assert load_hard_state(str(tmp_path)) == HardState(12, "n0")
    (tmp_path / "checkpoint").write_text("! a comment\ncommittedIndex=3\n")
    assert load_checkpoint(str(tmp_path)) == Checkpoint(end_index=-1, committed_index=3)


@pytest.mark.parametrize(
    "name,text",
    [
        ("currterm", "#DLedger\ncurrTerm=x\n"),
        ("currterm", "currTerm 5\n"),
        ("checkpoint", "endIndex=1\ncommittedIndex=one\n"),
    ],
)
def test_a_file_that_does_not_parse_is_an_error(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    load = load_hard_state if name == "currterm" else load_checkpoint
    with pytest.raises(StateFileError, match=name):
        load(str(tmp_path))


def test_save_is_durable_before_it_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync of the new file, then the rename, then fsync of the directory (the rename)."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync file")
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save_hard_state(str(tmp_path), HardState(term=1, voted_for="n1"))
    assert events == ["fsync file", "replace", "fsync dir"]
    events.clear()
    save_checkpoint(str(tmp_path), Checkpoint(1, 1))
    assert events == ["fsync file", "replace", "fsync dir"]
    assert load_hard_state(str(tmp_path)) == HardState(1, "n1")
