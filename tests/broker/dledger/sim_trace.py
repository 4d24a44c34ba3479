"""One-line descriptions of DLedger messages and core actions, for the simulator's trace."""

from __future__ import annotations

from broker.dledger.raft.core import (
    Action,
    AppendDone,
    Committed,
    LogReset,
    PersistState,
    RoleChanged,
    Send,
    TransferDone,
)
from broker.dledger.raft.messages import (
    HeartBeatRequest,
    HeartBeatResponse,
    LeadershipTransferRequest,
    Message,
    PushEntryRequest,
    PushEntryResponse,
    VoteRequest,
    VoteResponse,
)


def _entries(request: PushEntryRequest) -> str:
    if not request.entries:
        return ""
    first, last = request.entries[0], request.entries[-1]
    span = f"{first.index}" if first is last else f"{first.index}..{last.index}"
    return f" {span}@t{first.term}"


def describe(item: Action | Message) -> str:
    if isinstance(item, Send):
        return f"-> {item.to} {describe(item.request)}"
    if isinstance(item, PersistState):
        return f"persist term={item.state.term} vote={item.state.voted_for}"
    if isinstance(item, Committed):
        return f"committed {item.index}"
    if isinstance(item, AppendDone):
        return f"append done {item.first}..{item.last} {item.code.name}"
    if isinstance(item, RoleChanged):
        return f"ROLE {item.role.name} term={item.term} leader={item.leader_id}"
    if isinstance(item, TransferDone):
        return f"transfer to {item.transferee} done {item.code.name}"
    if isinstance(item, LogReset):
        return f"LOG RESET begins at {item.begin_index} pos={item.begin_pos}"
    head = f"{item.local_id}>{item.remote_id} t{item.term}"
    if isinstance(item, VoteRequest):
        return f"VOTE {head} end={item.ledger_end_index}@t{item.ledger_end_term}"
    if isinstance(item, VoteResponse):
        return f"vote answer {head} {item.vote_result.name}"
    if isinstance(item, HeartBeatRequest):
        return f"HEARTBEAT {head}"
    if isinstance(item, HeartBeatResponse):
        return f"heartbeat answer {head} {item.code.name}"
    if isinstance(item, PushEntryRequest):
        return f"PUSH {item.type.name} {head}{_entries(item)} commit={item.commit_index}"
    if isinstance(item, PushEntryResponse):
        return (
            f"push answer {head} {item.code.name} index={item.index} count={item.count} "
            f"log={item.begin_index}..{item.end_index}"
        )
    if isinstance(item, LeadershipTransferRequest):
        return f"TAKE LEADERSHIP {head} from={item.transfer_id} to={item.transferee_id}"
    return f"{type(item).__name__} {head} {item.code.name}"
