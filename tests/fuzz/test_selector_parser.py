"""The SQL92 selector parser, fuzzed: it builds a tree or raises SelectorSyntaxError, nothing else.

A selector arrives from any client (CHECK_CLIENT_CONFIG, a heartbeat, every pull with the
SUBSCRIPTION flag), so an IndexError, a RecursionError or a hang in the parser would be a crash
path of the broker.  Inputs are random text over the grammar's characters and words, random
unicode, and valid selectors with characters flipped, cut or repeated.  A selector that parses
is compiled and evaluated on a few messages: that never raises either (a non-match is False).

The suite runs a few thousand inputs; the long run (docs/sql92.md records its result) is

    SQL92_FUZZ_EXAMPLES=100000 .venv/bin/pytest -p no:xdist tests/fuzz/test_selector_parser.py
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.filter.evaluation import compile_selector
from broker.filter.selector_parser import parse_selector
from broker.filter.tokens import SelectorSyntaxError

EXAMPLES = int(os.environ.get("SQL92_FUZZ_EXAMPLES", "3000"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

WORDS = [
    "NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "LIKE", "a", "b", "TAGS",
    "$x", "_", "0", "1", "5L", "2147483648", "9223372036854775808", "1.5", ".5", "5.", "1E3",
    "1e-400", "1e400", "0.0", "'x'", "''''", "'", "=", "<>", "<", "<=", ">", ">=", "(", ")", ",",
    "+", "-", "--", "/*", "*/", "\n", "\t", " ", "!", "#", ".", "é",
]  # fmt: skip
SEEDS = [
    "a = 'x'",
    "TAGS IN ('paid', 'refunded') AND amount > 100",
    "a BETWEEN 1 AND 5 OR b NOT BETWEEN -1.5 AND 2E3",
    "a IS NOT NULL AND NOT (b <> 'it''s')",
    "(a > 1 OR b < 2) AND c IS NULL -- note\n",
    "/* c */ x NOT IN ('1', '2', '3') AND y = TRUE",
]

word_soup = st.lists(st.sampled_from(WORDS), max_size=40).map(" ".join)
glued = st.lists(st.sampled_from(WORDS), max_size=40).map("".join)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    s = list(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 5))):
        if s:
            i = draw(st.integers(0, len(s) - 1))
            s[i] = draw(st.sampled_from([*"()'=<>-+*/ \n,.", *WORDS[:10], "", "(" * 50]))
    text = "".join(s)
    if text and draw(st.booleans()):
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] if draw(st.booleans()) else text[cut:]
    if draw(st.booleans()):
        text = text * draw(st.integers(1, 30))
    return text


nested = st.integers(1, 400).map(lambda n: "(" * n + "a = 1" + ")" * n)
inputs = st.one_of(word_soup, glued, mutated(), st.text(max_size=80), nested)
MESSAGES = [{}, {"a": "x"}, {"a": "1", "b": "2", "TAGS": "paid"}, {"a": "NaN", "b": "1e999"}]


@FUZZ
@given(inputs)
def test_parser_builds_a_tree_or_says_why_not(text: str) -> None:
    try:
        tree = parse_selector(text)
    except SelectorSyntaxError as exc:
        assert str(exc)
        return
    matches = compile_selector(tree)
    for props in MESSAGES:
        assert matches(props) in (True, False)
