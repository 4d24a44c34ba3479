import json
import struct
from collections.abc import Iterator

import attrs
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import FrameDecodeError, FrameTooLarge, ProtocolError
from common.remoting import codec
from common.remoting.codec import MAX_FRAME_LENGTH, FrameDecoder, encode
from common.remoting.codes import RequestCode, ResponseCode, SerializeType
from common.remoting.command import ONEWAY_FLAG, RESPONSE_FLAG, RemotingCommand


@pytest.fixture(autouse=True, scope="module", params=["compiled", "python"])
def header_codec(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test twice: through the compiled JSON header codec (common/remoting/_json_header.c,
    built by `make install`) and through the Python path an install without a compiler runs."""
    saved = codec._json_header
    if request.param == "python":
        codec._json_header = None  # type: ignore[assignment]  # (as without a compiler)
    try:
        yield request.param
    finally:
        codec._json_header = saved


int32 = st.integers(-(2**31), 2**31 - 1)
short = st.integers(-(2**15), 2**15 - 1)
languages = st.sampled_from(["JAVA", "CPP", "PYTHON", "GO", "OTHER"])
ext_fields = st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=5)


@st.composite
def commands(draw, serialize_type=None):
    stype = draw(st.sampled_from(list(SerializeType))) if serialize_type is None else serialize_type
    return RemotingCommand(
        code=draw(short),
        language=draw(languages),
        version=draw(short),
        opaque=draw(int32),
        flag=draw(st.sampled_from([0, RESPONSE_FLAG, ONEWAY_FLAG])),
        # the binary header cannot tell "" from null; JSON can
        remark=draw(st.none() | st.text(min_size=1, max_size=30)),
        ext_fields=draw(ext_fields),
        body=draw(st.binary(max_size=200)),
        serialize_type=stype,
    )


def same(a: RemotingCommand, b: RemotingCommand) -> bool:
    return (
        a.code == b.code
        and a.language == b.language
        and a.version == b.version
        and a.opaque == b.opaque
        and a.flag == b.flag
        and a.remark == b.remark
        and a.ext_fields == b.ext_fields
        and a.body_bytes() == b.body_bytes()
        and a.serialize_type == b.serialize_type
    )


@given(commands())
def test_round_trip_whole(cmd):
    [out] = FrameDecoder().feed(encode(cmd))
    assert same(cmd, out)


@given(st.lists(commands(), min_size=1, max_size=4))
def test_round_trip_one_byte_at_a_time(cmds):
    data = b"".join(encode(c) for c in cmds)
    dec = FrameDecoder()
    out = []
    for i in range(len(data)):
        out.extend(dec.feed(data[i : i + 1]))
    assert len(out) == len(cmds)
    assert all(same(a, b) for a, b in zip(cmds, out, strict=True))
    assert dec.buffered == 0


@given(commands(), st.binary(min_size=1, max_size=3))
def test_trailing_bytes_stay_buffered(cmd, trailing):
    dec = FrameDecoder()
    [out] = dec.feed(encode(cmd) + trailing)
    assert same(cmd, out)
    assert dec.buffered == len(trailing)


@given(commands(), commands())
def test_second_frame_completes_later(a, b):
    dec = FrameDecoder()
    fb = encode(b)
    assert [same(a, x) for x in dec.feed(encode(a) + fb[:-1])] == [True]
    [out] = dec.feed(fb[-1:])
    assert same(b, out)


def test_json_header_shape():
    cmd = RemotingCommand.request(105, {"topic": "TopicTest"})
    cmd.opaque = 3
    frame = encode(cmd)
    length, type_len = struct.unpack(">iI", frame[:8])
    assert length == len(frame) - 4
    assert type_len >> 24 == 0
    header = json.loads(frame[8 : 8 + (type_len & 0xFFFFFF)])
    assert header == {
        "code": 105,
        "extFields": {"topic": "TopicTest"},
        "flag": 0,
        "language": "JAVA",
        "opaque": 3,
        "serializeTypeCurrentRPC": "JSON",
        "version": 407,
    }


def test_binary_header_layout():
    cmd = RemotingCommand(
        code=10,
        language="CPP",
        version=63,
        opaque=7,
        flag=1,
        remark="ok",
        ext_fields={"a": "bc"},
        serialize_type=SerializeType.ROCKETMQ,
    )
    header = codec.encode_binary_header(cmd)
    assert header == (
        struct.pack(">hbhii", 10, 1, 63, 7, 1)
        + struct.pack(">i", 2)
        + b"ok"
        + struct.pack(">i", 2 + 1 + 4 + 2)
        + struct.pack(">h", 1)
        + b"a"
        + struct.pack(">i", 2)
        + b"bc"
    )
    assert encode(cmd)[4] == 1  # serialize type in the high byte


def test_binary_header_rejects_large_codes():
    cmd = RemotingCommand(code=51001, serialize_type=SerializeType.ROCKETMQ)
    with pytest.raises(ValueError):
        encode(cmd)


def _frame(header: bytes, body: bytes = b"", stype: int = 0) -> bytes:
    return (
        struct.pack(">iI", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body
    )


def test_cpp_client_header_with_mixed_ext_types():
    # what the C++ client sends for SEND_MESSAGE (rocketmq-client-cpp 2.0, CommandHeader.cpp)
    header = (
        b'{"code":10,"language":"CPP","version":63,"opaque":0,"flag":0,"remark":"",'
        b'"extFields":{"producerGroup":"pg","topic":"T","defaultTopic":"TBW102",'
        b'"defaultTopicQueueNums":4,"queueId":0,"sysFlag":0,"bornTimestamp":"1700000000000",'
        b'"flag":0,"properties":"KEYS\\u0001k\\u0002","reconsumeTimes":"0","unitMode":"0",'
        b'"batch":"0","ok":true,"no":false,"gone":null,"AccessKey":"","OnsChannel":"ALIYUN"}}'
    )
    [cmd] = FrameDecoder().feed(_frame(header, b"hello"))
    assert cmd.language == "CPP" and cmd.version == 63 and cmd.remark == ""
    assert cmd.ext_fields["queueId"] == "0"
    assert cmd.ext_fields["defaultTopicQueueNums"] == "4"
    assert cmd.ext_fields["bornTimestamp"] == "1700000000000"
    assert cmd.ext_fields["properties"] == "KEYS\x01k\x02"
    assert cmd.ext_fields["ok"] == "true" and cmd.ext_fields["no"] == "false"
    assert "gone" not in cmd.ext_fields
    assert cmd.get_int("queueId") == 0 and cmd.get_bool("unitMode") is False
    assert cmd.body == b"hello"


def test_fastjson_style_header_uses_tolerant_parser():
    header = b"{code:105,extFields:{topic:'T',0:1},flag:0,language:'JAVA',opaque:9,version:407}"
    [cmd] = FrameDecoder().feed(_frame(header))
    assert cmd.code == 105 and cmd.opaque == 9
    assert cmd.ext_fields == {"topic": "T", "0": "1"}


def test_null_remark_and_ext_fields_and_numeric_language():
    header = b'{"code":0,"flag":1,"opaque":5,"remark":null,"extFields":null,"language":1}'
    [cmd] = FrameDecoder().feed(_frame(header))
    assert cmd.remark is None and cmd.ext_fields == {} and cmd.language == "CPP"
    assert cmd.is_response


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (struct.pack(">i", -5), FrameDecodeError),  # negative length
        (struct.pack(">i", 2) + b"xx", FrameDecodeError),  # shorter than the type/len int
        (struct.pack(">i", MAX_FRAME_LENGTH), FrameTooLarge),  # + 4 > max
        (struct.pack(">i", 0x7FFFFFFF), FrameTooLarge),  # garbage length
        (_frame(b"{not json"), FrameDecodeError),
        (_frame(b"[1,2]"), FrameDecodeError),  # not an object
        (_frame(b'{"opaque":1}'), FrameDecodeError),  # no code
        (_frame(b'{"code":"x"}'), FrameDecodeError),  # ill-typed code
        (_frame(b'{"code":1,"extFields":[1]}'), FrameDecodeError),
        (_frame(b"\xff\xfe{}"), FrameDecodeError),  # not UTF-8
        (_frame(b"{}", stype=2), FrameDecodeError),  # unknown serialize type
        (_frame(b"{}", stype=0x80), FrameDecodeError),  # "negative" header length/type
        (struct.pack(">iI", 8, 100) + b"{}{}", FrameDecodeError),  # header longer than frame
        (_frame(b"\x00\x01", stype=1), FrameDecodeError),  # truncated binary header
    ],
)
def test_bad_input(data, error):
    dec = FrameDecoder()
    with pytest.raises(error):
        dec.feed(data)
    # the stream is out of sync for good
    with pytest.raises(ProtocolError):
        dec.feed(encode(RemotingCommand(code=1)))


def test_too_large_is_refused_before_the_bytes_arrive():
    dec = FrameDecoder(max_frame_length=1024)
    with pytest.raises(FrameTooLarge):
        dec.feed(struct.pack(">i", 1021))
    assert dec.buffered == 0
    ok = FrameDecoder(max_frame_length=1024)
    assert ok.feed(struct.pack(">i", 1020)) == []


def test_good_frames_before_a_bad_one_are_returned_then_error_sticks():
    good = encode(RemotingCommand(code=11, opaque=1))
    dec = FrameDecoder()
    [out] = dec.feed(good + struct.pack(">i", -1))
    assert out.opaque == 1
    with pytest.raises(FrameDecodeError):
        dec.feed(b"")


@given(
    st.binary(min_size=8, max_size=64).filter(lambda b: 0 <= struct.unpack(">i", b[:4])[0] < 1000)
)
def test_random_garbage_never_crashes_unexpectedly(data):
    dec = FrameDecoder()
    try:
        dec.feed(data)
    except ProtocolError:
        pass


def test_binary_header_bad_lengths():
    base = struct.pack(">hbhii", 10, 0, 1, 1, 0)
    for header in (
        base + struct.pack(">i", -1) + struct.pack(">i", 0),  # negative remark length
        base + struct.pack(">i", 50) + struct.pack(">i", 0),  # remark longer than header
        base + struct.pack(">i", 0) + struct.pack(">i", 20),  # ext longer than header
        base + struct.pack(">i", 0) + struct.pack(">i", 3) + b"\x00\x05a",  # key out of range
        base + struct.pack(">i", 0) + struct.pack(">i", 7) + b"\x00\x01a" + struct.pack(">i", 9),
    ):
        with pytest.raises(FrameDecodeError):
            codec.decode_binary_header(header)


def test_list_and_memoryview_bodies_encode_back_to_back():
    data = bytearray(b"0123456789")
    cmd = RemotingCommand(code=0, flag=1, body=[memoryview(data)[2:5], b"xy", memoryview(b"Z")])
    [out] = FrameDecoder().feed(encode(cmd))
    assert out.body == b"234xyZ"
    prefix = codec.encode_header_and_prefix(cmd, cmd.body_length)
    assert encode(cmd) == prefix + b"234xyZ"


def _dumps_header(cmd: RemotingCommand) -> bytes:
    """The JSON header as json.dumps writes it (the reference for the fast formatter)."""
    header = {
        "code": cmd.code,
        "extFields": cmd.ext_fields if cmd.ext_fields is not None else {},
        "flag": cmd.flag,
        "language": cmd.language,
        "opaque": cmd.opaque,
        "serializeTypeCurrentRPC": "JSON",
        "version": cmd.version,
    }
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


odd_values = st.text(max_size=20) | st.integers() | st.booleans()


@given(
    commands(serialize_type=SerializeType.JSON),
    st.dictionaries(st.text(max_size=10), odd_values, max_size=5),
)
def test_json_header_is_byte_for_byte_json_dumps(cmd, ext):
    # the common shape (str values) takes the fast formatter, the rest the generic path
    assert codec.encode_json_header(cmd) == _dumps_header(cmd)
    cmd.ext_fields = ext
    assert codec.encode_json_header(cmd) == _dumps_header(cmd)
    cmd.ext_fields = None
    assert codec.encode_json_header(cmd) == _dumps_header(cmd)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("code", [RequestCode.SEND_MESSAGE_V2, ResponseCode.FLUSH_SLAVE_TIMEOUT])
def test_an_enum_code_is_written_as_its_number(code, monkeypatch):
    # a producer's SEND_MESSAGE_V2 is an IntEnum member: the fast path takes it, same bytes
    cmd = RemotingCommand(code=code, ext_fields={"b": "T", "i": "WAIT\x01true"})
    monkeypatch.setattr(codec, "_encode_json_header_generic", None)  # not used for this shape
    assert codec.encode_json_header(cmd) == _dumps_header(cmd)
    assert b'"code":%d,' % int(code) in codec.encode_json_header(cmd)


def test_json_header_in_utf16_and_control_characters():
    header = json.dumps({"code": 10, "opaque": 3, "extFields": {"k": "v\u00e9\n\u2028"}})
    cmd = FrameDecoder().feed(_frame(header.encode("utf-16")))[0]
    assert cmd.code == 10 and cmd.opaque == 3 and cmd.ext_fields == {"k": "v\u00e9\n\u2028"}
    again = FrameDecoder().feed(encode(cmd))[0]
    assert again.ext_fields == {"k": "v\u00e9\n\u2028"}


header_values = (
    st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.booleans()
    | st.none()
    | st.integers(min_value=2**63 - 2, max_value=2**70)
)


def _standard_library_decode(data: bytes) -> dict[str, object] | str:
    """The header as the decoder reads it with orjson out of the way (the reference)."""

    def refuse(_data: object) -> object:
        raise orjson.JSONDecodeError("off", "", 0)

    real = codec.orjson.loads
    codec.orjson.loads = refuse
    try:
        return attrs.asdict(codec.decode_json_header(data))
    except FrameDecodeError as exc:
        return f"error: {exc}"
    finally:
        codec.orjson.loads = real


@pytest.mark.parametrize("field", ["version", "opaque", "flag", "code"])
def test_an_infinite_number_is_an_ill_typed_field_not_a_crash(field):
    data = b'{"code": 0, "%s": Infinity}' % field.encode()
    with pytest.raises(FrameDecodeError, match="ill-typed"):
        codec.decode_json_header(data)


@settings(max_examples=1000)
@given(
    st.fixed_dictionaries(
        {"code": header_values},
        optional={
            "opaque": header_values,
            "flag": header_values,
            "version": header_values,
            "language": header_values,
            "remark": header_values,
            "extFields": st.dictionaries(st.text(max_size=6), header_values, max_size=4),
        },
    )
)
def test_json_headers_decode_as_the_standard_library_reads_them(header):
    # orjson reads integers beyond 64 bits as floats: such headers (and any with a float or a
    # non-string extField) are read again by the standard library, so nothing changes
    data = json.dumps(header, ensure_ascii=False).encode()
    try:
        got: dict[str, object] | str = attrs.asdict(codec.decode_json_header(data))
    except FrameDecodeError as exc:
        got = f"error: {exc}"
    assert got == _standard_library_decode(data)


def test_a_lone_surrogate_is_encoded_as_a_json_escape():
    """A request's "\\ud800" escape decodes to a lone surrogate, which has no UTF-8 form; an
    answer echoing it is written with \\u escapes (plain ASCII JSON) and reads back the same."""
    cmd = RemotingCommand.request(105, {"topic": "a\ud800b"})
    cmd.remark = "no route for a\ud800b"
    header = codec.encode_json_header(cmd)
    assert header.isascii() and b"\\ud800" in header
    back = json.loads(header)
    assert back["remark"] == "no route for a\ud800b"
    assert back["extFields"] == {"topic": "a\ud800b"}
