import pytest

from common.errors import (
    BadRequestHeader,
    BrokerResponseError,
    QueryNotFoundError,
    RemotingConnectError,
    RemotingTimeoutError,
    RequestError,
    ServiceNotAvailableError,
    SubscriptionError,
    TopicNotExistError,
    error_for_response,
    unwrap_group,
    unwrapping_groups,
)
from common.remoting.codes import ResponseCode, SerializeType
from common.remoting.command import ONEWAY_FLAG, RESPONSE_FLAG, RemotingCommand


def test_request_stringifies_and_drops_none():
    cmd = RemotingCommand.request(10, {"a": 1, "b": True, "c": False, "d": None, "e": "x"})
    assert cmd.ext_fields == {"a": "1", "b": "true", "c": "false", "e": "x"}
    assert not cmd.is_response and not cmd.is_oneway
    assert RemotingCommand.request(15, oneway=True).flag == ONEWAY_FLAG


def test_response_copies_opaque_and_serialize_type():
    req = RemotingCommand(code=10, opaque=42, serialize_type=SerializeType.ROCKETMQ)
    resp = req.response(ResponseCode.TOPIC_NOT_EXIST, "nope", {"x": 5})
    assert resp.flag == RESPONSE_FLAG and resp.is_response
    assert resp.opaque == 42 and resp.serialize_type == SerializeType.ROCKETMQ
    assert resp.code == 17 and resp.remark == "nope" and resp.ext_fields == {"x": "5"}


def test_typed_getters():
    cmd = RemotingCommand(
        code=11, ext_fields={"n": "-12", "b": "TRUE", "z": "0", "s": "str", "bad": "1_0"}
    )
    assert cmd.get_int("n") == -12
    assert cmd.get_bool("b") is True and cmd.get_bool("z") is False
    assert cmd.get_str("s") == "str"
    assert cmd.get_int("missing", 7) == 7 and cmd.get_str("missing", None) is None
    with pytest.raises(BadRequestHeader) as info:
        cmd.get_int("missing")
    assert info.value.code == ResponseCode.SYSTEM_ERROR
    assert info.value.remark == "the custom field missing is null"
    with pytest.raises(BadRequestHeader):
        cmd.get_int("bad")
    with pytest.raises(BadRequestHeader):
        cmd.get_int("s")
    with pytest.raises(BadRequestHeader):
        cmd.get_bool("s")


def test_body_helpers_and_repr_hides_bytes():
    cmd = RemotingCommand(code=0, body=[b"ab", memoryview(b"cde")])
    assert cmd.body_length == 5 and cmd.body_bytes() == b"abcde"
    assert "cde" not in repr(cmd) and "5 bytes" in repr(cmd)


def test_error_for_response_by_code():
    def err(code):
        return error_for_response(code, "r")

    assert isinstance(err(17), TopicNotExistError) and err(17).retriable
    assert isinstance(err(14), ServiceNotAvailableError) and err(14).retriable
    assert err(1).retriable and err(16).retriable and err(204).retriable and err(205).retriable
    assert isinstance(err(22), QueryNotFoundError) and not err(22).retriable
    assert isinstance(err(25), SubscriptionError)
    e = err(999)
    assert type(e) is BrokerResponseError and e.code == 999 and e.remark == "r"
    assert not e.retriable


def test_transport_errors_are_retriable():
    assert RemotingConnectError.retriable and RemotingTimeoutError.retriable
    assert RequestError(3, "x").code == 3


def test_unwrap_group():
    inner = ValueError("x")
    assert unwrap_group(ExceptionGroup("g", [ExceptionGroup("h", [inner])])) is inner
    multi = ExceptionGroup("g", [ValueError(), KeyError()])
    assert unwrap_group(multi) is multi
    assert unwrap_group(inner) is inner
    with pytest.raises(ValueError), unwrapping_groups():
        raise ExceptionGroup("g", [inner])
    with pytest.raises(ExceptionGroup), unwrapping_groups():
        raise multi
