"""The Raft state of DLedger members, as `rmq cluster` and `rmq top` show it.

Theory of operation: a broker in DLedger mode adds its member's Raft state to
GET_BROKER_RUNTIME_INFO (strings, like every runtime-info value): `dledgerGroup`,
`dledgerSelfId`, `dledgerRole` (LEADER / FOLLOWER / CANDIDATE), `dledgerTerm`,
`dledgerLeaderId` (empty while it knows none), `dledgerLedgerEndIndex`,
`dledgerCommittedIndex`, `dledgerPeers` (its dLegerPeers string) and `dledgerRebuilding`
(`true` while a member whose log the leader reset, after retention left it behind the leader's
first entry, catches up; broker/dledger/driver/node.py). `parse_raft` reads them into a
`RaftStatus` (None for a broker that is not a DLedger member).

A member knows its own log, not the others': how far a follower is behind is read across the
group, from the leader's ledger end index minus the follower's (`with_lag`). The leader of a
group is the member that says LEADER in the highest term (`group_leaders`): right after a
failover an old leader that has not heard of the new term may still say LEADER, and the
higher term is the one the group follows. The leader's own lag is blank, as is every lag of
a group whose leader did not answer.

Everything here is pure: the tests hand in plain tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

LEADER = "LEADER"


@attrs.frozen
class RaftStatus:
    group: str
    self_id: str  # n0, n1, ...
    role: str  # LEADER | FOLLOWER | CANDIDATE (as the member said it)
    term: int | None
    leader_id: str | None  # the leader this member knows, None while it knows none
    ledger_end_index: int | None
    committed_index: int | None
    peers: str = ""  # dLegerPeers: n0-host:port;n1-host:port;...
    # the group leader's ledger end index minus this member's (>= 0); None for the leader
    # itself or while the group has no known leader (`with_lag` fills it in)
    lag: int | None = None
    # its log was reset to the leader's first entry and it is catching up (dledgerRebuilding)
    rebuilding: bool = False

    @property
    def is_leader(self) -> bool:
        return self.role == LEADER


def _int(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        return None  # a number we cannot read is shown as unknown, not as an error


def parse_raft(table: Mapping[str, str]) -> RaftStatus | None:
    """The member's Raft state from its runtime-info table; None when it is no member."""
    group = table.get("dledgerGroup")
    self_id = table.get("dledgerSelfId")
    if not group or not self_id:
        return None
    return RaftStatus(
        group=group,
        self_id=self_id,
        role=table.get("dledgerRole", "") or "?",
        term=_int(table.get("dledgerTerm")),
        leader_id=table.get("dledgerLeaderId") or None,
        ledger_end_index=_int(table.get("dledgerLedgerEndIndex")),
        committed_index=_int(table.get("dledgerCommittedIndex")),
        peers=table.get("dledgerPeers", ""),
        rebuilding=table.get("dledgerRebuilding") == "true",
    )


def group_leaders(members: Iterable[RaftStatus]) -> dict[str, RaftStatus]:
    """group -> its leader: the member saying LEADER in the highest term."""
    leaders: dict[str, RaftStatus] = {}
    for m in members:
        if not m.is_leader:
            continue
        best = leaders.get(m.group)
        if best is None or (m.term or -1) > (best.term or -1):
            leaders[m.group] = m
    return leaders


def with_lag(member: RaftStatus, leader: RaftStatus | None) -> RaftStatus:
    """`member` with its lag behind `leader` (see `RaftStatus.lag`)."""
    if (
        leader is None
        or leader.self_id == member.self_id
        or leader.ledger_end_index is None
        or member.ledger_end_index is None
    ):
        return attrs.evolve(member, lag=None)
    return attrs.evolve(member, lag=max(0, leader.ledger_end_index - member.ledger_end_index))


def with_lags(members: Iterable[RaftStatus]) -> list[RaftStatus]:
    """Every member with its lag behind its own group's leader."""
    members = list(members)
    leaders = group_leaders(members)
    return [with_lag(m, leaders.get(m.group)) for m in members]


def raft_cell(raft: RaftStatus, leader: RaftStatus | None) -> str:
    """`n1 LEADER *` (the group's current leader is marked), `n0 FOLLOWER`, `n2 FOLLOWER
    rebuilding` (reset to the leader's first entry and catching up)."""
    mark = " *" if leader is not None and leader.self_id == raft.self_id else ""
    rebuilding = " rebuilding" if raft.rebuilding else ""
    return f"{raft.self_id} {raft.role}{mark}{rebuilding}"
