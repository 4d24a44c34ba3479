"""The Raft hard state: the term and the vote, which must be durable before the node answers.

Theory of operation
-------------------
DLedger's ``MemberState`` keeps ``currTerm`` and ``voteLeader`` in the ``currterm`` file.  The
core emits a ``PersistState`` action carrying a :class:`HardState` whenever either changes; the
driver writes it (fsync, then atomic replace) before it runs any later action or answers.

Invariant: for one node, ``term`` never decreases across the persisted sequence, and within one
term ``voted_for`` goes at most from None to one member id.
"""

from __future__ import annotations

import attrs

__all__ = ["HardState"]


@attrs.frozen
class HardState:
    """What the ``currterm`` file holds: ``currTerm`` and ``voteLeader``."""

    term: int = 0
    voted_for: str | None = None
