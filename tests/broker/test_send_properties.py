"""The send path's spliced stored-properties string equals the generic encoding."""

from hypothesis import given
from hypothesis import strategies as st

from broker.processor.send import _stored_properties
from common.message_properties import MessageConst, decode_properties, encode_properties

names = st.sampled_from(["WAIT", "TAGS", "KEYS", "UNIQ_KEY", "DELAY", "CLUSTER", "a", "b"])
values = st.text(alphabet=st.sampled_from("xyz\x01\x02 é"), min_size=0, max_size=4)
# what a client's canonical encoding can hold: non-empty, no separators (drawn, not filtered:
# a filter rejecting most draws fails Hypothesis's health check)
clean_values = st.text(alphabet=st.sampled_from("xyz é"), min_size=1, max_size=4)


def generic(raw: str, cluster: str) -> str:
    props = decode_properties(raw)
    props[MessageConst.CLUSTER] = cluster
    return encode_properties({k: v for k, v in props.items() if k != MessageConst.WAIT})


@given(st.dictionaries(names, clean_values))
def test_canonical_strings_take_the_splice(props):
    raw = encode_properties(props)
    fast = _stored_properties(raw, decode_properties(raw), "DefaultCluster")
    if MessageConst.CLUSTER in props:
        assert fast is None
    else:
        assert fast == generic(raw, "DefaultCluster")


@given(st.lists(st.tuples(names | values, values), max_size=5), st.booleans(), values)
def test_any_string_spliced_or_refused(pairs, trailing, cluster):
    raw = "\x02".join(f"{k}\x01{v}" for k, v in pairs) + ("\x02" if trailing else "")
    fast = _stored_properties(raw, decode_properties(raw), cluster)
    if fast is not None:
        assert fast == generic(raw, cluster)


def test_wait_anywhere_is_cut():
    for raw in ("WAIT\x01true", "WAIT\x01true\x02TAGS\x01t", "TAGS\x01t\x02WAIT\x01false"):
        assert _stored_properties(raw, decode_properties(raw), "C") == generic(raw, "C")
    raw = "A\x011\x02WAIT\x01true\x02B\x012"
    assert (
        _stored_properties(raw, decode_properties(raw), "C") == "A\x011\x02B\x012\x02CLUSTER\x01C"
    )
