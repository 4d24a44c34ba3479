"""Every decoder of bytes from outside, fuzzed: it decodes or raises its own decode error.

Inputs are random bytes and valid encodings with bytes flipped, cut or grown.  A decoder may
return something or raise its declared error (the class its callers catch), nothing else: an
IndexError or a struct.error escaping from one of them would be a crash path for whoever feeds
it bytes from a socket or a file.  Sizes are checked against the declared limits: a frame
decoder never accepts a frame over its maximum, the HA decoder never a body over its limit.

The coverage-guided counterpart is `python -m tests.fuzz.atheris_remoting` (docs/guarantees.md).
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.dledger.driver import wire
from broker.dledger.raft.messages import DLedgerRequestCode
from broker.ha.protocol import HAProtocolError, ReportDecoder, TransferDecoder
from common import model
from common.errors import ProtocolError
from common.message import MessageExtBrokerInner, RecordDecodeError, decode_records
from common.message_encoder import encode_records
from common.remoting.codec import (
    FrameDecoder,
    decode_binary_header,
    decode_json_header,
    encode,
)
from common.remoting.codes import SerializeType
from common.remoting.command import RemotingCommand
from common.serde import from_json, to_json

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A seed with a few bytes flipped, a cut, or garbage appended."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 6))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    if data and draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    if draw(st.booleans()):
        data += draw(st.binary(max_size=64))
    return bytes(data)


def any_bytes(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=512), mutated(seeds))


# --- remoting frames and headers -------------------------------------------------------------

_CMDS = [
    RemotingCommand.request(310, {"a": "pg", "b": "T", "e": 0, "g": 1_700_000_000_000}, b"x" * 40),
    RemotingCommand.request(105, {"topic": "TopicA"}),
    RemotingCommand.request(34, {}, b'{"clientID":"c","consumerDataSet":[]}'),
]
_FRAMES = [encode(c) for c in _CMDS]
_BINARY_FRAMES = []
for _c in _CMDS:
    _c2 = RemotingCommand.request(_c.code, dict(_c.ext_fields or {}), _c.body_bytes())
    _c2.serialize_type = SerializeType.ROCKETMQ  # binary header
    _BINARY_FRAMES.append(encode(_c2))


@FUZZ
@given(any_bytes(_FRAMES + _BINARY_FRAMES), st.integers(1, 64))
def test_frame_decoder_raises_only_protocol_errors(data: bytes, step: int) -> None:
    decoder = FrameDecoder(max_frame_length=4096)
    try:
        for i in range(0, len(data), step):
            for cmd in decoder.feed(data[i : i + step]):
                assert isinstance(cmd, RemotingCommand)
                assert cmd.body_length <= 4096
    except ProtocolError:
        pass


def _header_of(frame: bytes) -> bytes:
    mark = struct.unpack_from(">i", frame, 4)[0]
    return frame[8 : 8 + (mark & 0xFFFFFF)]


@FUZZ
@given(any_bytes([_header_of(f) for f in _FRAMES]))
def test_json_header_decoder_raises_only_protocol_errors(data: bytes) -> None:
    try:
        decode_json_header(data)
    except ProtocolError:
        pass


@FUZZ
@given(any_bytes([_header_of(f) for f in _BINARY_FRAMES]))
def test_binary_header_decoder_raises_only_protocol_errors(data: bytes) -> None:
    try:
        decode_binary_header(data)
    except ProtocolError:
        pass


# --- CommitLog records ------------------------------------------------------------------------


def _records() -> bytes:
    msgs = [
        MessageExtBrokerInner(
            topic="T",
            queue_id=i,
            body=b"body-%d" % i,
            properties={"KEYS": "k", "TAGS": "t"},
            born_host=("10.0.0.1", 1),
            store_host=("127.0.0.1", 10911),
        )
        for i in range(3)
    ]
    buf, _sizes = encode_records(msgs, [0, 1, 2], 1_700_000_000_000)
    return bytes(buf)


@FUZZ
@given(any_bytes([_records()]), st.booleans())
def test_record_decoder_raises_only_record_decode_errors(data: bytes, crc: bool) -> None:
    try:
        for m in decode_records(data, check_crc=crc):
            assert len(m.body) <= len(data)
    except RecordDecodeError:
        pass


# --- the HA stream ------------------------------------------------------------------------------

_HA = [struct.pack(">qi", 0, 5) + b"hello" + struct.pack(">qi", 5, 0), struct.pack(">q", 77)]


@FUZZ
@given(any_bytes(_HA), st.integers(1, 32))
def test_ha_decoders_raise_only_ha_protocol_errors(data: bytes, step: int) -> None:
    transfers, reports = TransferDecoder(max_body_size=1024), ReportDecoder()
    for decoder in (transfers, reports):
        try:
            for i in range(0, len(data), step):
                got = decoder.feed(data[i : i + step])
                if decoder is transfers:
                    assert all(len(t.body) <= 1024 for t in got)  # type: ignore[union-attr]
        except HAProtocolError:
            pass


# --- DLedger messages -------------------------------------------------------------------------

_DLEDGER = [
    b'{"group":"g","remoteId":"n0","leaderId":"n1","term":3,"code":200}',
    b'{"group":"g","remoteId":"n0","term":3,"ledgerEndIndex":5,"ledgerEndTerm":2}',
    b'{"group":"g","term":1,"type":"APPEND","commitIndex":1,"entries":[{"index":2,"term":1,'
    b'"pos":0,"body":"aGVsbG8=","magic":-1,"channel":0}]}',
]


@FUZZ
@given(any_bytes(_DLEDGER), st.sampled_from(list(DLedgerRequestCode)))
def test_dledger_decoders_raise_only_wire_errors(data: bytes, code: DLedgerRequestCode) -> None:
    for decode in (wire.decode_request, wire.decode_response):
        try:
            decode(int(code), data)
        except wire.WireError:
            pass


# --- JSON bodies --------------------------------------------------------------------------------

_BODIES = {
    model.HeartbeatData: to_json(
        model.HeartbeatData(clientID="c", consumerDataSet=[], producerDataSet=[])
    ),
    model.RegisterBrokerBody: b'{"topicConfigSerializeWrapper":{"topicConfigTable":{}},'
    b'"filterServerList":[]}',
    model.TopicRouteData: b'{"brokerDatas":[],"queueDatas":[],"filterServerTable":{}}',
}


@pytest.mark.parametrize("cls", list(_BODIES), ids=lambda c: c.__name__)
def test_json_bodies_raise_only_value_errors(cls: type) -> None:
    @FUZZ
    @given(any_bytes([_BODIES[cls]]))
    def check(data: bytes) -> None:
        try:
            from_json(data, cls)
        except ValueError:
            pass

    check()
