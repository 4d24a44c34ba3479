import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common import serde

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_dumps_loads_round_trip(value):
    assert serde.loads(serde.dumps(value)) == value


@given(json_values)
def test_tolerant_parser_agrees_with_json_on_strict_input(value):
    text = json.dumps(value)
    assert serde._TolerantParser(text).parse() == value


def test_fastjson_unquoted_int_keys():
    data = b'{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},"offsetTable":{-1:5}}'
    assert serde.loads(data) == {
        "brokerAddrs": {"0": "10.0.0.1:10911", "1": "10.0.0.2:10911"},
        "offsetTable": {"-1": 5},
    }


def test_bare_identifier_keys_and_single_quotes():
    assert serde.loads("{code:105, 'topic':'Top\\'ic', list:['a', \"b\"]}") == {
        "code": 105,
        "topic": "Top'ic",
        "list": ["a", "b"],
    }


def test_escapes_in_tolerant_path():
    assert serde.loads("{k:'\\u0001\\n\\\"x'}") == {"k": '\x01\n"x'}


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"{",
        b"{0:1}x",
        b'{"a":1} trailing',
        b"[1,]",
        b"{a b}",
        b"NaN",
        b'{"a":NaN}',
        b'"\\q"',
        b"\xff\xfe",
        b"{'a':'unterminated}",
        b"[" * 5000,
    ],
)
def test_malformed_input_raises_value_error(bad):
    with pytest.raises(ValueError):
        serde.loads(bad)


def test_dumps_is_compact_strict_and_quotes_int_keys():
    out = serde.dumps({"brokerAddrs": {0: "a", 1: "b"}, "x": None, "é": "ü"})
    assert out == '{"brokerAddrs":{"0":"a","1":"b"},"x":null,"é":"ü"}'.encode()
    json.loads(out)  # strict JSON


def test_dumps_bytes_as_base64_and_sets_sorted():
    assert serde.dumps({"b": b"\x00\x01", "s": {3, 1}}) == b'{"b":"AAE=","s":[1,3]}'


def test_dumps_rejects_unknown_objects():
    with pytest.raises(TypeError):
        serde.dumps({"x": object()})


def test_from_json_wraps_structure_errors():
    import attrs

    @attrs.define
    class Thing:
        n: int

    with pytest.raises(ValueError):
        serde.from_json(b'{"n":"not a number"}', Thing)
    with pytest.raises(ValueError):
        serde.from_json(b"{}", Thing)
    assert serde.from_json(b'{"n":"12","ignored":1}', Thing) == Thing(12)


def test_bool_structure_does_not_treat_false_string_as_true():
    assert serde.converter.structure("false", bool) is False
    assert serde.converter.structure("true", bool) is True
    assert serde.converter.structure(0, bool) is False
    with pytest.raises(ValueError):
        serde.converter.structure("maybe", bool)
