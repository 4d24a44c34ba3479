"""`rmq dledger leadership-transfer`: hand a DLedger group's leadership to a chosen member.

Theory of operation, one bounded network step after the other:

1. Find the group (`find_members`, `choose_group`). The nameserver's cluster table lists every
   registered broker; each answers GET_BROKER_RUNTIME_INFO, and a DLedger member names there
   its group, its member id and its group's dLegerPeers (member -> DLedger address). With
   one DLedger group in the cluster `--group` may be left out.
2. Find the leader (`find_leader`): METADATA (50000) to the members' DLedger addresses, the
   first answer that names a leader wins; when none answers, the runtime info's
   dledgerLeaderId of the member in the highest term. The term sent with the transfer is the
   leader's own (its runtime info), else the highest term a member reported.
3. LEADERSHIP_TRANSFER (51005) to the leader's DLedger address, as DLedger's own admin tool
   sends it: group, remoteId = leaderId = transferId = the leader, term, transfereeId = the
   target (localId names us, "rmq-cli"). The leader answers SUCCESS once the target has
   taken over, or with the DLedgerResponseCode that says why not (the target is too far
   behind, a transfer is already under way, it is no longer the leader...).
4. Wait until the target's own runtime info says LEADER, and report its term.

A target that already leads is no error (nothing to move). Every failure is a
`TransferError`, one line: no such group or member, no leader, a refusal, no answer in time.
The network is injected (`remoting` for the nameserver and brokers, `dledger` for the DLedger
RPCs) so the tests run the whole flow against fakes.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import attrs
import trio

from cli.errors import CliError
from cli.runtime_info.raft import RaftStatus, group_leaders, parse_raft

if TYPE_CHECKING:
    from broker.dledger.driver.transport import DLedgerClient
    from rmq.remoting import Invoker

LOCAL_ID = "rmq-cli"  # who asks, in the request's localId
_MEMBER = re.compile(r"n\d+")
_NODE = re.compile(r"(?P<group>.+)-(?P<member>n\d+)")


class TransferError(CliError):
    """The leadership could not be moved (or the group, its members or leader not found)."""


@attrs.frozen
class Member:
    broker_addr: str  # where its broker answers (runtime info)
    raft: RaftStatus


@attrs.frozen
class GroupInfo:
    group: str
    peers: dict[str, str]  # member id -> DLedger address, every member of the group
    members: dict[str, Member]  # member id -> the members that answered


@attrs.frozen
class TransferOutcome:
    group: str
    previous_leader: str
    new_leader: str
    term: int | None  # the new leader's term, as it reported it
    moved: bool  # False: the target led already, nothing was sent
    seconds: float  # from the transfer request to the target leading

    def to_json(self) -> dict[str, object]:
        return {**attrs.asdict(self), "seconds": round(self.seconds, 3)}


def parse_target(to: str, group: str | None) -> tuple[str | None, str]:
    """(group, member id) of `--to n1` or `--to broker-a-n1` (the `rmq up` node name)."""
    to = to.strip()
    if _MEMBER.fullmatch(to):
        return group, to
    m = _NODE.fullmatch(to)
    if m is None:
        raise TransferError(
            f"--to takes a member id (n0, n1, ...) or a node name (broker-a-n1), not {to!r}"
        )
    if group is not None and group != m["group"]:
        raise TransferError(f"--to {to} is a member of {m['group']}, not of --group {group}")
    return m["group"], m["member"]


def parse_peers(peers: str) -> dict[str, str]:
    """dLegerPeers `n0-host:port;n1-host:port` -> {member: "host:port"} (malformed parts are
    skipped: the broker checked the string when it started)."""
    out: dict[str, str] = {}
    for part in peers.split(";"):
        member, sep, addr = part.strip().partition("-")
        if sep and member and addr:
            out[member] = addr
    return out


def choose_group(members: list[Member], group: str | None) -> GroupInfo:
    """The group `group` (or the only group) among the members found; TransferError else."""
    groups = sorted({m.raft.group for m in members})
    if not groups:
        raise TransferError(
            "no DLedger group is registered with the nameserver (is the cluster running "
            "`rmq up --dledger 3`?)"
        )
    if group is None:
        if len(groups) > 1:
            raise TransferError(
                f"the cluster has {len(groups)} DLedger groups ({', '.join(groups)}); "
                "name one with --group"
            )
        group = groups[0]
    if group not in groups:
        raise TransferError(f"no DLedger group {group!r} (groups: {', '.join(groups)})")
    mine = {m.raft.self_id: m for m in members if m.raft.group == group}
    peers: dict[str, str] = {}
    for m in mine.values():
        peers.update(parse_peers(m.raft.peers))
    return GroupInfo(group, peers, mine)


def check_member(info: GroupInfo, target: str) -> None:
    if target not in info.peers:
        members = ", ".join(sorted(info.peers, key=_member_order))
        raise TransferError(f"{info.group} has no member {target} (members: {members})")


def _member_order(member: str) -> tuple[int, str]:
    return (int(member[1:]) if _MEMBER.fullmatch(member) else 1 << 30, member)


def leader_from_runtime(info: GroupInfo) -> tuple[str | None, int | None]:
    """(leader id, highest term) as the members' runtime info tell it."""
    rafts = [m.raft for m in info.members.values()]
    term = max((r.term for r in rafts if r.term is not None), default=None)
    leader = group_leaders(rafts).get(info.group)
    if leader is not None:
        return leader.self_id, leader.term
    knowing = sorted((r for r in rafts if r.leader_id), key=lambda r: r.term or -1)
    return (knowing[-1].leader_id if knowing else None), term


# --- the network steps -----------------------------------------------------------------------


async def _runtime_table(remoting: Invoker, addr: str, timeout: float) -> dict[str, str]:
    from cli.runtime_info.status import fetch_runtime_table

    return await fetch_runtime_table(remoting, addr, timeout)


async def find_members(remoting: Invoker, namesrv: str, timeout: float) -> list[Member]:
    """Every registered broker that answers as a DLedger member (the others are left out)."""
    from common.remoting.codes import RequestCode, ResponseCode
    from common.remoting.command import RemotingCommand
    from common.serde import loads

    resp = await remoting.invoke(
        namesrv, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), timeout
    )
    if resp.code != ResponseCode.SUCCESS:
        raise TransferError(f"nameserver answered cluster info with {resp.code}: {resp.remark}")
    info = loads(resp.body_bytes())
    table = info.get("brokerAddrTable") if isinstance(info, dict) else None
    addrs = sorted(
        {
            str(addr)
            for data in (table or {}).values()
            if isinstance(data, dict)
            for addr in (data.get("brokerAddrs") or {}).values()
        }
    )
    found: dict[str, Member] = {}

    async def ask(addr: str) -> None:
        try:
            with trio.fail_after(timeout):
                raft = parse_raft(await _runtime_table(remoting, addr, timeout))
        except Exception:  # a broker that does not answer (or too slowly) is left out
            return
        if raft is not None:
            found[addr] = Member(addr, raft)

    async with trio.open_nursery() as nursery:
        for addr in addrs:
            nursery.start_soon(ask, addr)
    return [found[a] for a in addrs if a in found]


async def find_leader(
    dledger: DLedgerClient, info: GroupInfo, timeout: float
) -> tuple[str, int | None]:
    """(leader id, its term): METADATA to the members, else their runtime info."""
    from broker.dledger.driver.transport import RpcError
    from broker.dledger.raft.messages import MetadataRequest, MetadataResponse

    _, term = leader_from_runtime(info)
    for member in sorted(info.peers, key=_member_order):
        request = MetadataRequest(group=info.group, remote_id=member, local_id=LOCAL_ID)
        try:
            answer = await dledger.call(info.peers[member], request, timeout=timeout)
        except RpcError:
            continue
        if isinstance(answer, MetadataResponse) and answer.leader_id:
            known = info.members.get(answer.leader_id)
            own_term = known.raft.term if known is not None and known.raft.is_leader else None
            return answer.leader_id, own_term if own_term is not None else term
    leader, term = leader_from_runtime(info)
    if leader is None:
        raise TransferError(f"{info.group} has no leader right now (an election may be under way)")
    return leader, term


async def leadership_transfer(
    namesrv: str,
    to: str,
    *,
    group: str | None = None,
    timeout: float = 10.0,
    remoting: Invoker | None = None,
    dledger: DLedgerClient | None = None,
) -> TransferOutcome:
    """Move the leadership of `group` (or the only group) to member `to` (see module doc)."""
    import contextlib

    from broker.dledger.driver.transport import RemotingDLedgerNetwork
    from common.remoting.client import open_remoting_client

    async with contextlib.AsyncExitStack() as stack:
        if remoting is None:
            from cli.client_network import network_from_env

            remoting = await stack.enter_async_context(
                open_remoting_client(connect_timeout=3.0, network=network_from_env())
            )
        if dledger is None:
            network = RemotingDLedgerNetwork(connect_timeout=3.0)
            dledger = await stack.enter_async_context(network.open_client(LOCAL_ID))
        try:
            with trio.fail_after(timeout):
                return await _transfer(remoting, dledger, namesrv, to, group, timeout)
        except trio.TooSlowError:
            raise TransferError(
                f"the transfer to {to} did not finish within {timeout:g} s (see `rmq cluster`)"
            ) from None


async def _transfer(
    remoting: Invoker,
    dledger: DLedgerClient,
    namesrv: str,
    to: str,
    group: str | None,
    timeout: float,
) -> TransferOutcome:
    from broker.dledger.driver.transport import RpcError
    from broker.dledger.raft.messages import LeadershipTransferRequest
    from common.remoting.codes import DLedgerResponseCode

    named_group, target = parse_target(to, group)
    rpc_timeout = min(timeout, 3.0)
    info = choose_group(await find_members(remoting, namesrv, rpc_timeout), named_group)
    check_member(info, target)
    leader, term = await find_leader(dledger, info, rpc_timeout)
    if leader == target:
        known = info.members.get(target)
        own = known.raft.term if known is not None else term
        return TransferOutcome(info.group, leader, target, own, False, 0.0)
    if leader not in info.peers:
        raise TransferError(f"{info.group}: its leader {leader} is not among its peers")
    started = trio.current_time()
    request = LeadershipTransferRequest(
        group=info.group,
        remote_id=leader,
        local_id=LOCAL_ID,
        leader_id=leader,
        term=-1 if term is None else term,
        transfer_id=leader,
        transferee_id=target,
    )
    try:
        # the leader answers once the target leads: give it the rest of the budget
        answer = await dledger.call(info.peers[leader], request, timeout=timeout)
    except RpcError as exc:
        raise TransferError(
            f"{info.group}: leader {leader} did not take the transfer: {exc}"
        ) from None
    if answer.code != DLedgerResponseCode.SUCCESS:
        raise TransferError(
            f"{info.group}: leader {leader} refused to hand over to {target}: {answer.code.name} "
            f"({int(answer.code)})"
        )
    new_term = await _until_leading(remoting, info, target)
    return TransferOutcome(
        info.group, leader, target, new_term, True, trio.current_time() - started
    )


async def _until_leading(remoting: Invoker, info: GroupInfo, target: str) -> int | None:
    """The target's term once its runtime info says LEADER (the caller bounds the wait)."""
    member = info.members.get(target)
    if member is None:
        return None  # its broker did not answer before: the leader's SUCCESS is all we know
    while True:
        try:
            raft = parse_raft(await _runtime_table(remoting, member.broker_addr, 3.0))
        except Exception:  # restarting or busy: ask again
            raft = None
        if raft is not None and raft.is_leader:
            return raft.term
        await trio.sleep(0.05)
