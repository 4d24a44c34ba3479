"""What a member keeps on disk besides its log: the ``currterm`` and ``checkpoint`` files.

Theory of operation
-------------------
DLedger's ``MemberState`` keeps ``currTerm`` and ``voteLeader`` in the ``currterm`` file.  The
core emits a ``PersistState`` action carrying a :class:`HardState` whenever either changes; the
driver writes it (fsync, then atomic replace, then fsync of the directory) before it runs any
later action or answers.  The ``checkpoint`` file holds ``endIndex`` and ``committedIndex``,
written every ``checkPointInterval``; it is a hint (a restarted member starts with that
committed index instead of -1), never a source of truth: the log is.

Both are Java properties files, as DLedger writes them, read tolerantly (``#`` comments, blank
lines, ``key=value``); an unreadable file is an error, never silently a fresh state.

Invariant: for one node, ``term`` never decreases across the persisted sequence, and within one
term ``voted_for`` goes at most from None to one member id.  Functions here are blocking:
the driver runs them in a worker thread.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from broker.dledger.raft.member_state import HardState
from common.config_file import atomic_write

__all__ = [
    "Checkpoint",
    "StateFileError",
    "load_checkpoint",
    "load_hard_state",
    "save_checkpoint",
    "save_hard_state",
]

CURRTERM = "currterm"
CHECKPOINT = "checkpoint"


class StateFileError(ValueError):
    """A ``currterm`` or ``checkpoint`` file that does not parse."""


@attrs.frozen
class Checkpoint:
    end_index: int = -1
    committed_index: int = -1


def _read_properties(path: Path) -> dict[str, str] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    out = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise StateFileError(f"{path}: line {raw!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def _int(path: Path, props: dict[str, str], key: str, default: int) -> int:
    value = props.get(key)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise StateFileError(f"{path}: {key}={value!r} is not an integer") from None


def load_hard_state(directory: str) -> HardState:
    path = Path(directory) / CURRTERM
    props = _read_properties(path)
    if props is None:
        return HardState()
    vote = props.get("voteLeader") or None
    return HardState(term=_int(path, props, "currTerm", 0), voted_for=vote)


def save_hard_state(directory: str, state: HardState) -> None:
    # DLedger writes an empty voteLeader when it has not voted in the term
    text = f"currTerm={state.term}\nvoteLeader={state.voted_for or ''}\n"
    atomic_write(Path(directory) / CURRTERM, text.encode())


def load_checkpoint(directory: str) -> Checkpoint | None:
    path = Path(directory) / CHECKPOINT
    props = _read_properties(path)
    if props is None:
        return None
    return Checkpoint(
        end_index=_int(path, props, "endIndex", -1),
        committed_index=_int(path, props, "committedIndex", -1),
    )


def save_checkpoint(directory: str, checkpoint: Checkpoint) -> None:
    text = f"endIndex={checkpoint.end_index}\ncommittedIndex={checkpoint.committed_index}\n"
    atomic_write(Path(directory) / CHECKPOINT, text.encode())
