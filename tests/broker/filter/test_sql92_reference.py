"""The compiled evaluator against a straightforward reference, on random expressions and messages.

The reference below walks the tree and spells RocketMQ's rules out one case at a time, with a
Java exception as the value ``ERR`` (which then propagates, as the exception does).  It shares no
code with ``broker/filter/evaluation.py`` (closures, conversion tables) beyond the tree types.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from broker.filter.evaluation import compile_selector
from broker.filter.expression import (
    And,
    BooleanCast,
    Compare,
    Constant,
    Equal,
    Expr,
    In,
    Int32,
    Negate,
    Not,
    Op,
    Or,
    Property,
)
from broker.filter.selector_parser import parse_selector
from broker.filter.tokens import SelectorSyntaxError

ERR = object()  # a Java exception during evaluation


# --- Java's conversions, spelled out ---------------------------------------------------------


def ref_int(s: str, bits: int) -> object:
    body = s[1:] if s[:1] in ("+", "-") else s
    if not body or not all(c.isdecimal() for c in body):
        return ERR
    v = int(s)
    if not -(2 ** (bits - 1)) <= v < 2 ** (bits - 1):
        return ERR
    return Int32(v) if bits == 32 else v


def ref_double(s: str) -> object:
    t = s
    while t and t[0] <= " ":
        t = t[1:]
    while t and t[-1] <= " ":
        t = t[:-1]
    sign = -1.0 if t.startswith("-") else 1.0
    u = t[1:] if t[:1] in "+-" and t else t
    if u == "NaN":
        return math.nan
    if u == "Infinity":
        return sign * math.inf
    if u[:2].lower() == "0x":
        h = u[:-1] if u[-1:] in "fFdD" else u
        if "p" not in h.lower():
            return ERR
        try:
            return sign * float.fromhex(h)
        except (ValueError, OverflowError):
            return ERR
    if u[-1:] in "fFdD":
        u = u[:-1]
    if not u or any(c not in "0123456789.eE+-" for c in u) or not any(c.isdigit() for c in u):
        return ERR
    if u[0] in "+-":
        return ERR  # a second sign
    try:
        return sign * float(u)
    except ValueError:
        return ERR


def jclass(v: object) -> str:
    return {bool: "Boolean", Int32: "Integer", int: "Long", float: "Double", str: "String"}[type(v)]


def ref_compare_same(a: object, b: object) -> int:
    if isinstance(a, float):
        assert isinstance(b, float)
        if math.isnan(a) or math.isnan(b):
            return int(math.isnan(a)) - int(math.isnan(b))
        if a == b == 0.0:
            return int(math.copysign(1, a) > 0) - int(math.copysign(1, b) > 0)
    return (a > b) - (a < b)  # type: ignore[operator]


def ref_compare(a: object, b: object) -> object:
    ca, cb = jclass(a), jclass(b)
    if ca == cb:
        return ref_compare_same(a, b)
    numbers = ["Integer", "Long", "Double"]
    if ca in numbers and cb in numbers:
        wider = max(numbers.index(ca), numbers.index(cb))
        convert: list[Callable[[Any], object]] = [Int32, int, float]
        return ref_compare_same(convert[wider](a), convert[wider](b))
    if ca == "String" and cb in numbers:
        parsed = {"Integer": lambda: ref_int(a, 32), "Long": lambda: ref_int(a, 64)}.get(  # type: ignore[arg-type]
            cb,
            lambda: ref_double(a),  # type: ignore[arg-type]
        )()
        return ERR if parsed is ERR else ref_compare_same(parsed, b)
    if cb == "String" and ca in numbers:
        parsed = {"Integer": lambda: ref_int(b, 32), "Long": lambda: ref_int(b, 64)}.get(  # type: ignore[arg-type]
            ca,
            lambda: ref_double(b),  # type: ignore[arg-type]
        )()
        return ERR if parsed is ERR else ref_compare_same(a, parsed)
    if ca == "String" and cb == "Boolean":
        return ref_compare_same(a.lower() == "true", b)  # type: ignore[attr-defined]
    if ca == "Boolean" and cb == "String":
        return ERR  # RocketMQ casts the Boolean to String
    return -1


def java_equals(a: object, b: object) -> bool:
    if jclass(a) != jclass(b):
        return False
    return ref_compare_same(a, b) == 0


# --- the reference evaluator -----------------------------------------------------------------


def ref(e: Expr, props: dict[str, str]) -> object:
    if isinstance(e, Constant):
        return e.value
    if isinstance(e, Property):
        return props.get(e.name)
    if isinstance(e, Negate):
        v = ref(e.operand, props)
        if v is ERR:
            return ERR
        if type(v) in (Int32, int, float):
            return type(v)(-v) if type(v) is not bool else None  # type: ignore[operator,call-arg]
        return None
    if isinstance(e, Not):
        v = ref(e.operand, props)
        if v is ERR or v is None:
            return v
        return not v
    if isinstance(e, BooleanCast):
        v = ref(e.operand, props)
        if v is ERR or v is None:
            return v
        return v if isinstance(v, bool) else False
    if isinstance(e, In):
        v = props.get(e.property.name)
        if v is None:
            return None
        return (v in e.values) != e.negated
    if isinstance(e, Equal):
        a = ref(e.left, props)
        if a is ERR:
            return ERR
        b = ref(e.right, props)
        if b is ERR:
            return ERR
        if a is None and b is None:
            return True
        if a is None:
            return None
        if b is None:
            return False
        if java_equals(a, b):
            return True
        c = ref_compare(a, b)
        return ERR if c is ERR else c == 0
    if isinstance(e, Compare):
        a = ref(e.left, props)
        if a is ERR or a is None:
            return a
        b = ref(e.right, props)
        if b is ERR or b is None:
            return b
        if isinstance(a, str) and isinstance(b, str):
            a, b = ref_double(a), ref_double(b)
            if a is ERR or b is ERR:
                return ERR
            c = ref_compare_same(a, b)
        else:
            found = ref_compare(a, b)
            if found is ERR:
                return ERR
            assert isinstance(found, int)
            c = found
        return {Op.GT: c > 0, Op.GE: c >= 0, Op.LT: c < 0, Op.LE: c <= 0}[e.op]
    if isinstance(e, And):
        a = ref(e.left, props)
        if a is ERR:
            return ERR
        if a is False:
            return False
        b = ref(e.right, props)
        if b is ERR:
            return ERR
        if b is False:
            return False
        return None if a is None or b is None else True
    if isinstance(e, Or):
        a = ref(e.left, props)
        if a is ERR:
            return ERR
        if a is True:
            return True
        b = ref(e.right, props)
        if b is ERR:
            return ERR
        if b is True:
            return True
        return None if a is None or b is None else False
    raise AssertionError(e)


# --- random selectors and messages ------------------------------------------------------------

NAMES = ["a", "b", "TAGS"]
VALUES = [
    "1", "-1", "+5", "0", "10", "2147483648", "9223372036854775808", "1.5", "-0.0", "0.0",
    "1e3", "2f", " 7 ", "NaN", "Infinity", "-Infinity", "0x1p3", "abc", "x", "true", "TRUE",
    "false", "yes", "", "٣",
]  # fmt: skip
LITERALS = [
    "1", "5", "0", "2147483648", "5L", "1.5", ".5", "2.", "1E3", "'x'", "'1'", "'abc'",
    "'true'", "TRUE", "FALSE", "NULL", "-1", "-2147483649",
]  # fmt: skip

operand = st.one_of(st.sampled_from(NAMES), st.sampled_from(LITERALS))


def _cond(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(children, st.sampled_from(["AND", "OR"]), children).map(
            lambda t: f"({t[0]}) {t[1]} ({t[2]})"
        ),
        children.map(lambda c: f"NOT ({c})"),
    )


leaf = st.one_of(
    st.tuples(operand, st.sampled_from(["=", "<>", ">", ">=", "<", "<="]), operand).map(" ".join),
    st.tuples(operand, st.sampled_from(["IS NULL", "IS NOT NULL"])).map(" ".join),
    st.tuples(
        st.sampled_from(NAMES),
        st.sampled_from(["IN", "NOT IN"]),
        st.lists(st.sampled_from(["'x'", "'1'", "'true'", "''"]), min_size=1, max_size=3),
    ).map(lambda t: f"{t[0]} {t[1]} ({', '.join(t[2])})"),
    st.tuples(operand, st.sampled_from(["BETWEEN", "NOT BETWEEN"]), operand, operand).map(
        lambda t: f"{t[0]} {t[1]} {t[2]} AND {t[3]}"
    ),
    st.sampled_from(NAMES + ["TRUE", "FALSE", "NULL"]),
)
selectors = st.recursive(leaf, _cond, max_leaves=8)
messages = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VALUES), max_size=3)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(selectors, st.lists(messages, min_size=1, max_size=4))
def test_evaluator_agrees_with_the_reference(text: str, props_list: list[dict[str, str]]) -> None:
    try:
        tree = parse_selector(text)
    except SelectorSyntaxError:
        assume(False)
        return
    matcher = compile_selector(tree)
    for props in props_list:
        assert matcher(props) == (ref(tree, props) is True), (text, props)
