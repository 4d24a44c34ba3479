"""The DLedger JSON codec: byte-exact against hand-written fastjson output, round trips, garbage."""

from __future__ import annotations

import base64
import json
from typing import TypedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.dledger.driver.wire import (
    AnyRequest,
    AnyResponse,
    WireError,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    request_code,
)
from broker.dledger.raft.messages import (
    Entry,
    HeartBeatRequest,
    HeartBeatResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    MetadataRequest,
    MetadataResponse,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from common.errors import ProtocolError
from common.remoting.codes import DLedgerRequestCode as Code
from common.remoting.codes import DLedgerResponseCode as RC

BODY = b"\x00\x01hello\xff"
B64 = base64.b64encode(BODY).decode()


def entry(index: int = 7, body: bytes = BODY) -> Entry:
    return Entry(index=index, term=3, pos=1000 + index, body=body)


def entry_json(index: int = 7, body: bytes = BODY) -> str:
    b64 = base64.b64encode(body).decode()
    return (
        f'{{"body":"{b64}","bodyCrc":0,"chainCrc":0,"channel":0,"index":{index},"magic":1,'
        f'"pos":{1000 + index},"size":{48 + len(body)},"term":3}}'
    )


class _Base(TypedDict):
    group: str
    remote_id: str
    local_id: str
    term: int


BASE: _Base = {"group": "g", "remote_id": "n1", "local_id": "n0", "term": 3}

# (message, the JSON fastjson writes for it) - properties sorted, nulls left out
REQUESTS: list[tuple[AnyRequest, str]] = [
    (
        VoteRequest(**BASE, leader_id="n0", ledger_end_index=9, ledger_end_term=2),
        '{"code":200,"group":"g","leaderId":"n0","ledgerEndIndex":9,"ledgerEndTerm":2,'
        '"localId":"n0","remoteId":"n1","term":3}',
    ),
    (
        HeartBeatRequest(**BASE, leader_id="n0"),
        '{"code":200,"group":"g","leaderId":"n0","localId":"n0","remoteId":"n1","term":3}',
    ),
    (
        PushEntryRequest(
            **BASE, leader_id="n0", type=PushType.APPEND, commit_index=5, entries=(entry(),)
        ),
        '{"batch":false,"batchEntry":[],"code":200,"commitIndex":5,"count":1,'
        f'"entry":{entry_json()},"firstEntryIndex":7,"group":"g","lastEntryIndex":7,'
        '"leaderId":"n0","localId":"n0","remoteId":"n1","term":3,"totalSize":0,"type":"APPEND"}',
    ),
    (
        PushEntryRequest(
            **BASE, leader_id="n0", type=PushType.APPEND, entries=(entry(7), entry(8, b""))
        ),
        f'{{"batch":true,"batchEntry":[{entry_json(7)},{entry_json(8, b"")}],"code":200,'
        '"commitIndex":-1,"count":2,"firstEntryIndex":7,"group":"g","lastEntryIndex":8,'
        f'"leaderId":"n0","localId":"n0","remoteId":"n1","term":3,"totalSize":{48 * 2 + len(BODY)},'
        '"type":"APPEND"}',
    ),
    (
        PushEntryRequest(**BASE, leader_id="n0", type=PushType.COMMIT, commit_index=12),
        '{"batch":false,"batchEntry":[],"code":200,"commitIndex":12,"count":0,'
        '"firstEntryIndex":-1,"group":"g","lastEntryIndex":-1,"leaderId":"n0","localId":"n0",'
        '"remoteId":"n1","term":3,"totalSize":0,"type":"COMMIT"}',
    ),
    (
        LeadershipTransferRequest(
            **BASE,
            leader_id="n0",
            transfer_id="n0",
            transferee_id="n2",
            take_leadership_ledger_index=4,
        ),
        '{"code":200,"group":"g","leaderId":"n0","localId":"n0","remoteId":"n1",'
        '"takeLeadershipLedgerIndex":4,"term":3,"transferId":"n0","transfereeId":"n2"}',
    ),
    (
        MetadataRequest(**BASE),
        '{"code":200,"group":"g","localId":"n0","remoteId":"n1","term":3}',
    ),
]

RESPONSES: list[tuple[Code, AnyResponse, str]] = [
    (
        Code.VOTE,
        VoteResponse(**BASE, vote_result=VoteResult.REJECT_ALREADY_VOTED),
        '{"code":200,"group":"g","localId":"n0","remoteId":"n1","term":3,'
        '"voteResult":"REJECT_ALREADY_VOTED"}',
    ),
    (
        Code.HEART_BEAT,
        HeartBeatResponse(**BASE, leader_id="n2", code=RC.INCONSISTENT_LEADER),
        '{"code":409,"group":"g","leaderId":"n2","localId":"n0","remoteId":"n1","term":3}',
    ),
    (
        Code.PUSH,
        PushEntryResponse(**BASE, index=7, begin_index=0, end_index=6, count=1),
        '{"beginIndex":0,"code":200,"count":1,"endIndex":6,"group":"g","index":7,'
        '"localId":"n0","remoteId":"n1","term":3}',
    ),
    (
        Code.PUSH,
        PushEntryResponse(**BASE, code=RC.INCONSISTENT_STATE),
        '{"beginIndex":-1,"code":406,"count":0,"endIndex":-1,"group":"g","localId":"n0",'
        '"remoteId":"n1","term":3}',
    ),
    (
        Code.LEADERSHIP_TRANSFER,
        LeadershipTransferResponse(**BASE, code=RC.TAKE_LEADERSHIP_FAILED),
        '{"code":418,"group":"g","localId":"n0","remoteId":"n1","term":3}',
    ),
    (
        Code.METADATA,
        MetadataResponse(**BASE, leader_id="n1", peers={"n1": "h:2", "n0": "h:1"}),
        '{"code":200,"group":"g","leaderId":"n1","localId":"n0","peers":{"n0":"h:1","n1":"h:2"},'
        '"remoteId":"n1","term":3}',
    ),
]


@pytest.mark.parametrize(("message", "expected"), REQUESTS)
def test_requests_byte_exact(message, expected):
    assert encode_request(message) == expected.encode()
    assert decode_request(request_code(message), expected.encode()) == message


@pytest.mark.parametrize(("code", "message", "expected"), RESPONSES)
def test_responses_byte_exact(code, message, expected):
    assert encode_response(message) == expected.encode()
    assert decode_response(code, expected.encode()) == message


def test_request_codes():
    assert request_code(VoteRequest(**BASE)) == Code.VOTE and int(Code.VOTE) == 51001
    assert request_code(PushEntryRequest(**BASE, type=PushType.COMMIT)) == Code.PUSH
    assert int(Code.PUSH) == 51004
    assert request_code(MetadataRequest(**BASE)) == Code.METADATA and int(Code.METADATA) == 50000


def test_non_ascii_ids_are_raw_utf8():
    message = HeartBeatRequest(group="grüppe", remote_id="n1", local_id="n0")
    assert b'"group":"gr\xc3\xbcppe"' in encode_request(message)
    assert decode_request(Code.HEART_BEAT, encode_request(message)) == message


def test_java_response_without_ids_reads_with_defaults():
    # DLedger answers heartbeats with a fresh HeartBeatResponse: no group, remoteId or localId
    got = decode_response(Code.HEART_BEAT, b'{"code":403,"term":9}')
    assert got == HeartBeatResponse(
        group="", remote_id="", local_id="", term=9, code=RC.EXPIRED_TERM
    )


def test_batch_entry_with_one_entry_reads_as_one_entry():
    doc = json.loads(encode_request(REQUESTS[2][0]))
    doc["batchEntry"], doc["entry"] = [doc["entry"]], None
    assert decode_request(Code.PUSH, json.dumps(doc).encode()) == REQUESTS[2][0]


def test_fastjson_spacing_and_escapes_take_the_slow_path():
    message = REQUESTS[3][0]
    doc = json.loads(encode_request(message))
    spaced = json.dumps(doc, indent=1).encode()  # '"body": "..."' - not the fast path's pattern
    assert decode_request(Code.PUSH, spaced) == message
    escaped = encode_request(message).replace(B64.encode(), B64.replace("/", "\\/").encode())
    assert decode_request(Code.PUSH, escaped) == message


def test_fastjson_unquoted_keys_are_read():
    assert decode_response(Code.VOTE, b"{code:200,term:4,voteResult:'ACCEPT'}") == VoteResponse(
        group="", remote_id="", local_id="", term=4, vote_result=VoteResult.ACCEPT
    )


def test_unknown_response_code_reads_as_unknown():
    assert decode_response(Code.HEART_BEAT, b'{"code":777}').code == RC.UNKNOWN


# --- garbage -----------------------------------------------------------------------------------

GARBAGE = [
    (Code.PUSH, b""),
    (Code.PUSH, b"\xff\xfe"),
    (Code.PUSH, b"[1,2]"),
    (Code.PUSH, b'{"type":"SHOVE"}'),
    (Code.PUSH, b'{"type":1}'),
    (Code.PUSH, b'{"term":"3"}'),
    (Code.PUSH, b'{"term":3.5}'),
    (Code.PUSH, b'{"term":true}'),
    (Code.PUSH, b'{"entry":"x"}'),
    (Code.PUSH, b'{"batchEntry":{}}'),
    (Code.PUSH, b'{"entry":{"body":"!!!!"}}'),
    (Code.PUSH, b'{"entry":{"body":5}}'),
    (Code.PUSH, b'{"entry":{"body":"#0"}}'),
    (Code.PUSH, b'{"entry":{"body":"AAAA","size":3}}'),
    (Code.PUSH, f'{{"entry":{entry_json()},"batchEntry":[{entry_json()}]}}'.encode()),
    (Code.VOTE, b'{"group":["g"]}'),
    (Code.VOTE, b"[" * 100_000),
    (Code.VOTE, b'{"ledgerEndIndex":NaN}'),
    (Code.METADATA, b'{"leaderId":1}'),
    (Code.GET, b"{}"),
]


@pytest.mark.parametrize(("code", "body"), GARBAGE)
def test_garbage_requests_raise_wire_error(code, body):
    with pytest.raises(WireError):
        decode_request(code, body)


@pytest.mark.parametrize(
    ("code", "body"),
    [
        (Code.VOTE, b'{"voteResult":"MAYBE"}'),
        (Code.VOTE, b'{"voteResult":null}'),
        (Code.PUSH, b'{"index":"7"}'),
        (Code.METADATA, b'{"peers":[1]}'),
        (Code.METADATA, b'{"peers":{"n0":1}}'),
        (Code.HEART_BEAT, b"not json"),
        (Code.APPEND, b"{}"),
    ],
)
def test_garbage_responses_raise_wire_error(code, body):
    with pytest.raises(WireError):
        decode_response(code, body)


def test_wire_error_is_a_protocol_error():
    assert issubclass(WireError, ProtocolError)


@given(st.binary(max_size=300), st.sampled_from(list(Code)))
def test_any_bytes_decode_or_raise_wire_error(body, code):
    for decode in (decode_request, decode_response):
        try:
            decode(code, body)
        except WireError:
            pass


# --- round trips -------------------------------------------------------------------------------

longs = st.integers(-(2**63), 2**63 - 1)
ids = st.text(max_size=8)
codes = st.sampled_from(list(RC))


def base_fields():
    return {
        "group": ids,
        "remote_id": ids,
        "local_id": ids,
        "term": longs,
        "leader_id": st.none() | ids,
        "code": codes,
    }


entries = st.builds(
    Entry,
    index=longs,
    term=longs,
    pos=longs,
    body=st.binary(max_size=64),
    magic=st.integers(-(2**31), 2**31 - 1),
    channel=st.integers(-(2**31), 2**31 - 1),
)

requests = st.one_of(
    st.builds(VoteRequest, **base_fields(), ledger_end_index=longs, ledger_end_term=longs),
    st.builds(HeartBeatRequest, **base_fields()),
    st.builds(
        PushEntryRequest,
        **base_fields(),
        type=st.sampled_from(list(PushType)),
        commit_index=longs,
        entries=st.lists(entries, max_size=4).map(tuple),
    ),
    st.builds(
        LeadershipTransferRequest,
        **base_fields(),
        transfer_id=ids,
        transferee_id=ids,
        take_leadership_ledger_index=longs,
    ),
    st.builds(MetadataRequest, **base_fields()),
)

responses = st.one_of(
    st.tuples(
        st.just(Code.VOTE),
        st.builds(VoteResponse, **base_fields(), vote_result=st.sampled_from(list(VoteResult))),
    ),
    st.tuples(st.just(Code.HEART_BEAT), st.builds(HeartBeatResponse, **base_fields())),
    st.tuples(
        st.just(Code.PUSH),
        st.builds(
            PushEntryResponse,
            **base_fields(),
            index=st.none() | longs,
            begin_index=longs,
            end_index=longs,
            count=st.integers(0, 2**31 - 1),
        ),
    ),
    st.tuples(
        st.just(Code.LEADERSHIP_TRANSFER), st.builds(LeadershipTransferResponse, **base_fields())
    ),
    st.tuples(
        st.just(Code.METADATA),
        st.builds(MetadataResponse, **base_fields(), peers=st.dictionaries(ids, ids, max_size=4)),
    ),
)


@given(requests)
def test_request_round_trip(message):
    body = encode_request(message)
    json.loads(body)  # standard JSON
    assert decode_request(request_code(message), body) == message


@given(responses)
def test_response_round_trip(pair):
    code, message = pair
    body = encode_response(message)
    json.loads(body)
    assert decode_response(code, body) == message


@given(requests)
def test_keys_are_sorted_like_fastjson(message):
    doc = json.loads(encode_request(message))
    assert list(doc) == sorted(doc)
    for e in [doc.get("entry") or {}, *doc["batchEntry"]] if "batchEntry" in doc else []:
        assert list(e) == sorted(e)


def test_a_kept_rendering_serves_only_its_own_entry() -> None:
    """Two groups in one process may hold different entries with the same index and term:
    each push carries its own entry's body, whatever was rendered before."""
    a = Entry(index=5, term=2, pos=0, body=b"group a")
    b = Entry(index=5, term=2, pos=0, body=b"group b")
    for entry in (a, b, a, b):
        req = PushEntryRequest(
            group="g",
            remote_id="n1",
            local_id="n0",
            term=2,
            leader_id="n0",
            type=PushType.APPEND,
            entries=(entry,),
            commit_index=4,
        )
        decoded = decode_request(int(request_code(req)), encode_request(req))
        assert isinstance(decoded, PushEntryRequest) and decoded.entries == (entry,)
