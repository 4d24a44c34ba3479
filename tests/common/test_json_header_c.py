"""The compiled JSON header codec (common/remoting/_json_header.c) against codec.py's Python path.

The C module may decline any input (None), and then the Python path decides; whatever it does
give must be exactly what the Python path gives. Headers are generated as text, field by field:
the known keys in any order and subset, unknown and repeated keys, numbers as JSON writes them
and as it does not (fractions, exponents, leading zeros, 19+ digits, strings, booleans), strings
raw or escaped (every escape, upper and lower case hex, surrogate pairs and lone surrogates, raw
control characters and bytes that are not UTF-8), extFields null, empty, of strings or not, and
whitespace between the tokens. Commands to encode are generated with every field type the Python
path treats apart. The usual headers, ours, Java's and what the broker answers, must take the C
path: otherwise it would be correct and useless.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import ProtocolError
from common.remoting import codec
from common.remoting.codec import _decode_frame, _encode_header_and_prefix, encode
from common.remoting.codes import RequestCode, ResponseCode, SerializeType
from common.remoting.command import RemotingCommand
from tests.support.wire import command_fields

pytestmark = pytest.mark.timeout(120)

fast = codec._json_header


def test_the_checkout_runs_the_compiled_codec() -> None:
    # `make install` (pip install -e) builds it in place; without it every frame is slower
    assert fast is not None, "common.remoting._json_header is not built"


def python_decode(frame: bytes) -> RemotingCommand | None:
    try:
        return _decode_frame(frame)
    except ProtocolError:
        return None


def check_decode(frame: bytes) -> RemotingCommand | None:
    """The C decode of ``frame``, held to the Python path's."""
    assert fast is not None
    got = fast.decode_frame(frame)
    if got is not None:
        want = python_decode(frame)
        assert want is not None, (frame, command_fields(got))
        assert command_fields(got) == command_fields(want), frame
        # what FrameDecoder hands it: a memoryview into a larger buffer
        view = memoryview(b"xx" + frame + b"yy")[2 : 2 + len(frame)]
        again = fast.decode_frame(view)
        assert again is not None and command_fields(again) == command_fields(want)
    return got


def frame_of(header: bytes, body: bytes = b"", stype: int = 0) -> bytes:
    return struct.pack(">I", stype << 24 | len(header)) + header + body


# --- generated header text ---------------------------------------------------------------------

WS = st.sampled_from(["", "", "", " ", "\n", "\t ", "\r\n  "])

NUMBERS = st.one_of(
    st.integers(-(2**40), 2**40).map(str),
    st.sampled_from(
        [
            "0",
            "-0",
            "310",
            "-1",
            "007",
            "1.0",
            "1e3",
            "2E1",
            "-",
            "999999999999999999",
            "1000000000000000000",
            "-999999999999999999",
            "99999999999999999999",
            "true",
            "false",
            "null",
            '"5"',
            "[]",
        ]
    ),
)

# text that stresses the string rules: quotes, backslashes, control characters, non-ASCII
# (two, three and four UTF-8 bytes), the property separators Java uses
TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from('"\\/\x00\x01\x02\x08\x09\x0a\x0c\x0d\x1f\x7f é中😀'),
        st.characters(codec="utf-8"),
    ),
    max_size=12,
)


@st.composite
def json_string(draw: st.DrawFn, valid: bool = False) -> str:
    """A JSON string literal, each character raw or escaped in one of the ways JSON allows (and,
    unless ``valid``, now and then in a way it does not: a raw control character, a lone
    surrogate escape, a bad escape)."""
    s = draw(TEXT)
    out = ['"']
    for ch in s:
        how = draw(st.integers(0 if not valid else 1, 9))
        cp = ord(ch)
        if ch == '"' or ch == "\\" or cp < 0x20:
            if how == 0 and cp < 0x20:
                out.append(ch)  # raw control character: not JSON
            elif how < 4 and ch in '"\\\b\f\n\r\t':
                out.append(json.dumps(ch)[1:-1])
            else:
                out.append(f"\\u{cp:04x}" if how % 2 else f"\\u{cp:04X}")
        elif how == 0:
            if cp > 0xFFFF:  # a surrogate pair, in either case
                hi = 0xD800 + ((cp - 0x10000) >> 10)
                lo = 0xDC00 + ((cp - 0x10000) & 0x3FF)
                out.append(f"\\u{hi:04x}\\u{lo:04X}")
            else:
                out.append(f"\\u{cp:04x}")
        elif how == 1 and ch == "/":
            out.append("\\/")
        else:
            out.append(ch)
    if not valid and draw(st.integers(0, 9)) == 0:
        out.append(draw(st.sampled_from(["\\ud800", "\\udc00", "\\ud800\\u0041", "\\x"])))
    out.append('"')
    return "".join(out)


@st.composite
def ext_object(draw: st.DrawFn, valid: bool = False) -> str:
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return "null"
    if kind == 1 and not valid:
        return "[]"
    items = []
    for _ in range(draw(st.integers(0, 5))):
        key = draw(st.one_of(json_string(valid), st.sampled_from(['"a"', '"b"', '"i"', '"a"'])))
        if valid or draw(st.integers(0, 9)):
            value = draw(json_string(valid))
        else:
            value = draw(st.sampled_from(["1", "true", "null", "{}", "[1]"]))
        items.append(f"{draw(WS)}{key}{draw(WS)}:{draw(WS)}{value}{draw(WS)}")
    return "{" + ",".join(items) + "}"


KEYS = [
    "code",
    "language",
    "version",
    "opaque",
    "flag",
    "remark",
    "extFields",
    "serializeTypeCurrentRPC",
]


VALID_NUMBERS = st.one_of(
    st.integers(-(10**18) + 1, 10**18 - 1).map(str),
    st.integers(-300, 300).map(str),
    st.sampled_from(["-0", "0"]),
)


@st.composite
def header_text(draw: st.DrawFn) -> bytes:
    """Most headers are of the usual shape (so that the C path takes them); about half of those
    then get one thing wrong or unusual, and the rest are anything."""
    usual = draw(st.integers(0, 3)) > 0
    spoil = not usual or draw(st.booleans())
    if usual:
        keys = draw(st.permutations(KEYS))
        if draw(st.booleans()):  # language, remark, extFields and the type may be left out
            gone = draw(st.sets(st.sampled_from(KEYS[5:] + ["language"])))
            keys = [k for k in keys if k not in gone]
    else:
        keys = draw(st.lists(st.sampled_from(KEYS), max_size=8, unique=True))
    if spoil and draw(st.integers(0, 3)) == 0:
        extra = draw(st.sampled_from(["x", "code", "extFields", "remark", "Code", "co\\u0064e"]))
        keys.insert(draw(st.integers(0, len(keys))), extra)
    members = []
    for key in keys:
        odd = spoil and draw(st.integers(0, 4)) == 0
        if key in ("code", "version", "opaque", "flag", "Code", "x"):
            value = draw(NUMBERS if odd else VALID_NUMBERS)
        elif key == "extFields":
            value = draw(ext_object(valid=not odd))
        elif key == "remark":
            value = draw(
                st.one_of(json_string(not odd), st.just("null"), st.just("1" if odd else "null"))
            )
        elif key == "language":
            value = (
                draw(json_string(not odd))
                if not odd
                else draw(st.sampled_from(["null", "7", '"JAVA"']))
            )
        else:
            value = draw(
                st.one_of(
                    st.just('"JSON"'), json_string(not odd), st.just("0" if odd else '"JSON"')
                )
            )
        members.append(f'{draw(WS)}"{key}"{draw(WS)}:{draw(WS)}{value}{draw(WS)}')
    text = draw(WS) + "{" + ",".join(members) + "}" + draw(WS)
    if spoil and draw(st.integers(0, 5)) == 0:
        text += draw(st.sampled_from(["x", "{}", ","]))
    raw = text.encode("utf-8", "surrogatepass")
    # now and then a byte that is not UTF-8, or a cut
    damage = draw(st.integers(0, 19)) if spoil else -1
    if damage == 0 and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = (
            raw[:at]
            + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf"]))
            + raw[at:]
        )
    elif damage == 1 and raw:
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    return raw


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header=header_text(), body=st.binary(max_size=40))
def test_decode_gives_what_the_python_path_gives(header: bytes, body: bytes) -> None:
    check_decode(frame_of(header, body))


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64))
def test_decode_of_any_bytes(data: bytes) -> None:
    check_decode(data)
    check_decode(frame_of(data))


def test_frames_it_declines() -> None:
    assert fast is not None
    header = b'{"code":1,"flag":0,"language":"JAVA","opaque":1,"version":1}'
    assert check_decode(frame_of(header)) is not None
    for frame in (
        b"",
        b"\x00\x00",
        frame_of(header)[:-1],  # the header runs past the frame
        frame_of(header, stype=1),  # ROCKETMQ binary
        frame_of(header, stype=2),
    ):
        assert fast.decode_frame(frame) is None


# --- the usual headers take the C path ---------------------------------------------------------

SEND_EXT = {
    "a": "pg",
    "b": "TopicTest",
    "c": "TBW102",
    "d": "4",
    "e": "3",
    "f": "0",
    "g": "1764412345678",
    "h": "0",
    "i": "UNIQ_KEY\x017F0000011234ABCD\x02WAIT\x01true",
    "j": "0",
    "k": "false",
    "m": "false",
    "n": "broker-a",
}
ANSWER_EXT = {
    "msgId": "7F00000100002A9F0000000000123456",
    "queueId": "3",
    "queueOffset": "12345",
    "MSG_REGION": "DefaultRegion",
    "TRACE_ON": "true",
}


def usual_commands() -> list[RemotingCommand]:
    return [
        RemotingCommand(RequestCode.SEND_MESSAGE_V2, "PYTHON", 399, 7, 0, None, SEND_EXT, b"x" * 9),
        RemotingCommand(int(ResponseCode.SUCCESS), "JAVA", 399, 7, 1, None, ANSWER_EXT),
        RemotingCommand(17, "JAVA", 399, 8, 2, 'a remark, "quoted" \\ é 😀', {}),
        RemotingCommand(105, "JAVA", 0, 2**31 - 1, 0, None, {"topic": "中文 topic"}),
        RemotingCommand(1, "JAVA", 0, -5, 0, "", None),  # type: ignore[arg-type]  # (as a peer's)
    ]


def test_the_usual_headers_take_the_c_path() -> None:
    assert fast is not None
    for cmd in usual_commands():
        body = cmd.body
        assert isinstance(body, bytes)
        head = fast.encode_prefixed(cmd, len(body))
        assert head is not None and head == _encode_header_and_prefix(cmd, len(body))
        got = check_decode((head + body)[4:])
        assert got is not None
        assert got.ext_fields == (cmd.ext_fields or {})
    # Java's fastjson: keys in alphabetical order, no remark when null
    java = (
        b'{"code":0,"extFields":{"queueId":"3","msgId":"AB"},"flag":1,"language":"JAVA",'
        b'"opaque":42,"serializeTypeCurrentRPC":"JSON","version":399}'
    )
    assert check_decode(frame_of(java)) is not None


# --- encoding ----------------------------------------------------------------------------------

_PLAIN_INT = st.integers(-(2**31), 2**31 - 1)
_ODD_INT = st.sampled_from([2**63 - 1, -(2**63), 2**63, 2**64, -(2**70), True, False])
# one in eight an int the Python path treats apart (beyond 64 bits, a bool)
INTS = st.integers(0, 7).flatmap(lambda i: _ODD_INT if i == 0 else _PLAIN_INT)
# mostly text with a UTF-8 form; sometimes a lone surrogate (none: the Python path's fallback)
_UTF8_TEXT = st.text(
    alphabet=st.one_of(st.characters(codec="utf-8"), st.sampled_from('"\\\x00\x1f\x7fé😀')),
    max_size=10,
)
_ANY_TEXT = st.text(alphabet=st.one_of(st.characters(), st.just("\ud800")), max_size=4)
STR = st.integers(0, 11).flatmap(lambda i: _ANY_TEXT if i == 0 else _UTF8_TEXT)


@st.composite
def commands(draw: st.DrawFn) -> RemotingCommand:
    kind = draw(st.integers(0, 9))
    ext: Any
    if kind == 0:
        ext = None
    elif kind == 1:
        ext = draw(st.dictionaries(STR, st.one_of(STR, st.integers(), st.booleans()), max_size=3))
    elif kind == 2:
        ext = draw(st.dictionaries(st.integers(), STR, max_size=2))
    else:
        ext = draw(st.dictionaries(STR, STR, max_size=5))
    cmd = RemotingCommand(
        code=draw(
            st.one_of(INTS, st.sampled_from([RequestCode.SEND_MESSAGE_V2, ResponseCode.SUCCESS]))
        ),
        language=draw(st.one_of(STR, st.just("JAVA"))),
        version=draw(INTS),
        opaque=draw(INTS),
        flag=draw(INTS),
        remark=draw(st.one_of(st.none(), STR)),
        ext_fields=ext,
        serialize_type=draw(st.sampled_from([SerializeType.JSON] * 5 + [SerializeType.ROCKETMQ])),
    )
    return cmd


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cmd=commands(), body_len=st.sampled_from([0, 1, 1024, 2**31 - 100]))
def test_encode_gives_what_the_python_path_gives(cmd: RemotingCommand, body_len: int) -> None:
    assert fast is not None
    got = fast.encode_prefixed(cmd, body_len)
    if got is None:
        return
    assert cmd.serialize_type is SerializeType.JSON
    assert got == _encode_header_and_prefix(cmd, body_len)


def test_encode_of_the_whole_frame_is_unchanged() -> None:
    # codec.encode goes through the C path: the frame is the one the byte-by-byte tests know
    cmd = usual_commands()[0]
    body = cmd.body
    assert isinstance(body, bytes)
    assert encode(cmd) == _encode_header_and_prefix(cmd, len(body)) + body
