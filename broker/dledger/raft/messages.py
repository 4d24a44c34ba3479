"""The DLedger messages (the ``protocol/`` classes of openmessaging/dledger 0.3.1.2) as attrs
values, shared by the Raft core, the log and the wire.

The core (core.py) consumes and produces these values and never sees JSON;
broker/dledger/driver/wire.py is the one place that turns them into DLedger's JSON bodies (camelCase
names, base64 entry bodies) and back.  Every message carries the base fields of DLedger's
``RequestOrResponse``: ``group``, ``remote_id`` (the receiver of a request, the answering node of a
response: DLedger copies it unchanged into the response), ``local_id`` (the sender of a request),
``leader_id``, ``term`` and ``code`` (a :class:`DLedgerResponseCode`, 200 on requests).

Requests and responses are separate classes; the transport pairs a response with its request
(the remoting ``opaque``), so the core treats each response as one more message that arrived.
"""

from __future__ import annotations

import enum

import attrs

from common.remoting.codes import DLedgerRequestCode, DLedgerResponseCode

__all__ = [
    "ENTRY_HEADER_SIZE",
    "ENTRY_MAGIC",
    "DLedgerRequestCode",
    "DLedgerResponseCode",
    "Entry",
    "HeartBeatRequest",
    "HeartBeatResponse",
    "LeadershipTransferRequest",
    "LeadershipTransferResponse",
    "Message",
    "MetadataRequest",
    "MetadataResponse",
    "PushEntryRequest",
    "PushEntryResponse",
    "PushType",
    "REQUEST_CODES",
    "Request",
    "Response",
    "Role",
    "VoteRequest",
    "VoteResponse",
    "VoteResult",
]

# DLedgerEntry.BODY_OFFSET: magic, size, index, term, pos, channel, chainCrc, bodyCrc, bodyLen
ENTRY_HEADER_SIZE = 48
# DLedgerEntry.CURRENT_MAGIC (MAGIC_1)
ENTRY_MAGIC = 1


class Role(enum.Enum):
    """MemberState.Role."""

    FOLLOWER = "FOLLOWER"
    CANDIDATE = "CANDIDATE"
    LEADER = "LEADER"


class VoteResult(enum.Enum):
    """VoteResponse.RESULT; the wire carries the name."""

    UNKNOWN = "UNKNOWN"
    ACCEPT = "ACCEPT"
    REJECT_UNKNOWN_LEADER = "REJECT_UNKNOWN_LEADER"
    REJECT_UNEXPECTED_LEADER = "REJECT_UNEXPECTED_LEADER"
    REJECT_EXPIRED_VOTE_TERM = "REJECT_EXPIRED_VOTE_TERM"
    REJECT_ALREADY_VOTED = "REJECT_ALREADY_VOTED"
    REJECT_ALREADY_HAS_LEADER = "REJECT_ALREADY_HAS_LEADER"
    REJECT_TERM_NOT_READY = "REJECT_TERM_NOT_READY"
    REJECT_TERM_SMALL_THAN_LEDGER = "REJECT_TERM_SMALL_THAN_LEDGER"
    REJECT_EXPIRED_LEDGER_TERM = "REJECT_EXPIRED_LEDGER_TERM"
    REJECT_SMALL_LEDGER_END_INDEX = "REJECT_SMALL_LEDGER_END_INDEX"
    REJECT_TAKING_LEADERSHIP = "REJECT_TAKING_LEADERSHIP"


class PushType(enum.Enum):
    """PushEntryRequest.Type."""

    APPEND = "APPEND"
    COMMIT = "COMMIT"
    COMPARE = "COMPARE"
    TRUNCATE = "TRUNCATE"


@attrs.frozen
class Entry:
    """One DLedgerEntry.  ``pos`` is the absolute data-file position of its 48-byte header; the
    body (in broker mode exactly one CommitLog record) starts at ``pos + 48``."""

    index: int
    term: int
    pos: int
    body: bytes
    magic: int = ENTRY_MAGIC
    channel: int = 0

    @property
    def size(self) -> int:
        return ENTRY_HEADER_SIZE + len(self.body)


@attrs.frozen(kw_only=True)
class _Base:
    group: str
    remote_id: str
    local_id: str
    term: int = -1
    leader_id: str | None = None
    code: DLedgerResponseCode = DLedgerResponseCode.SUCCESS


@attrs.frozen(kw_only=True)
class VoteRequest(_Base):
    """A candidate (``leader_id`` == ``local_id``) asks for a vote in ``term``."""

    ledger_end_index: int = -1
    ledger_end_term: int = -1


@attrs.frozen(kw_only=True)
class VoteResponse(_Base):
    vote_result: VoteResult = VoteResult.UNKNOWN


@attrs.frozen(kw_only=True)
class HeartBeatRequest(_Base):
    pass


@attrs.frozen(kw_only=True)
class HeartBeatResponse(_Base):
    pass


@attrs.frozen(kw_only=True)
class PushEntryRequest(_Base):
    """Leader -> follower.  APPEND carries one or more consecutive entries (several only with
    batch push), COMPARE and TRUNCATE exactly one, COMMIT none."""

    type: PushType
    commit_index: int = -1
    entries: tuple[Entry, ...] = ()


@attrs.frozen(kw_only=True)
class PushEntryResponse(_Base):
    # the (first) pushed entry's index; for COMPARE/TRUNCATE the compared/truncated index
    index: int | None = None
    # the follower's log bounds, sent on COMPARE answers so the leader can step back
    begin_index: int = -1
    end_index: int = -1
    # entries covered by an APPEND answer (1 unless batch push)
    count: int = 0


@attrs.frozen(kw_only=True)
class LeadershipTransferRequest(_Base):
    """Admin -> leader ("move leadership to ``transferee_id``"), then leader -> transferee
    ("take leadership now": the transferee starts an election at once)."""

    transfer_id: str = ""
    transferee_id: str = ""
    take_leadership_ledger_index: int = -1


@attrs.frozen(kw_only=True)
class LeadershipTransferResponse(_Base):
    pass


Request = VoteRequest | HeartBeatRequest | PushEntryRequest | LeadershipTransferRequest
Response = VoteResponse | HeartBeatResponse | PushEntryResponse | LeadershipTransferResponse
Message = Request | Response

REQUEST_CODES: dict[type[Request], DLedgerRequestCode] = {
    VoteRequest: DLedgerRequestCode.VOTE,
    HeartBeatRequest: DLedgerRequestCode.HEART_BEAT,
    PushEntryRequest: DLedgerRequestCode.PUSH,
    LeadershipTransferRequest: DLedgerRequestCode.LEADERSHIP_TRANSFER,
}


@attrs.frozen(kw_only=True)
class MetadataRequest(_Base):
    """Anyone -> any member: who is in the group and who leads (DLedger METADATA, 50000)."""


@attrs.frozen(kw_only=True)
class MetadataResponse(_Base):
    # member id -> DLedger address ("host:port"), self included
    peers: dict[str, str] = attrs.field(factory=dict)
