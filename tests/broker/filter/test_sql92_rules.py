"""RocketMQ 4.9's SQL92 typing and null rules, one test each (docs/sql92.md lists them).

Each expected value is what RocketMQ's ``ExpressionMessageFilter`` answers for the same
expression and properties (worked out from ``ComparisonExpression``, ``LogicExpression``,
``UnaryExpression`` and ``ConstantExpression`` in apache/rocketmq 4.9's ``filter`` module).
"""

from __future__ import annotations

import pytest

from broker.filter.consumer_filter_manager import compile_filter
from broker.filter.selector_parser import parse_selector
from broker.filter.tokens import SelectorSyntaxError


def matches(expression: str, **props: str) -> bool:
    return compile_filter(expression).matcher(props)


def refused(expression: str) -> SelectorSyntaxError:
    with pytest.raises(SelectorSyntaxError) as info:
        parse_selector(expression)
    return info.value


# --- null ------------------------------------------------------------------------------------


def test_a_missing_property_is_null_and_null_never_matches() -> None:
    assert not matches("a = 'x'")
    assert not matches("NOT (a = 'x')")  # NOT null is null
    assert not matches("a > 1")
    assert not matches("NOT (a > 1)")


def test_is_null_and_is_not_null() -> None:
    assert matches("a IS NULL")
    assert not matches("a IS NULL", a="")  # an empty value is not stored, see the next test
    assert matches("a IS NOT NULL", a="x")
    assert not matches("a IS NOT NULL")


def test_equality_is_asymmetric_in_null_as_in_rocketmq() -> None:
    # only the left side null -> null; only the right side null -> FALSE
    assert not matches("a = 'x'") and not matches("NOT (a = 'x')")
    assert not matches("'x' = a") and matches("NOT ('x' = a)")
    assert matches("'x' <> a")
    assert not matches("a <> 'x'")
    assert matches("a <> 'x'", a="y")


def test_two_missing_properties_are_equal() -> None:
    assert matches("a = b")
    assert not matches("a = b", a="1")


def test_and_or_are_three_valued() -> None:
    assert matches("a = '1' OR TRUE")  # null OR TRUE
    assert not matches("a = '1' OR FALSE")  # null
    assert not matches("NOT (a = '1' OR FALSE)")
    assert not matches("a = '1' AND TRUE")  # null
    assert matches("NOT (a = '1' AND FALSE)")  # FALSE wins over null


def test_in_and_not_in_with_null() -> None:
    assert matches("a IN ('x', 'y')", a="y")
    assert not matches("a IN ('x', 'y')", a="z")
    assert matches("a NOT IN ('x', 'y')", a="z")
    assert not matches("a NOT IN ('x')")  # null
    assert not matches("a IN ('x')")


def test_between_is_inclusive_and_null_safe() -> None:
    assert matches("a BETWEEN 1 AND 3", a="1") and matches("a BETWEEN 1 AND 3", a="3")
    assert not matches("a BETWEEN 1 AND 3", a="4")
    assert matches("a NOT BETWEEN 1 AND 3", a="4")
    assert not matches("a NOT BETWEEN 1 AND 3")  # null


# --- types -----------------------------------------------------------------------------------


def test_strings_compare_exactly() -> None:
    assert matches("a = 'x'", a="x")
    assert not matches("a = 'X'", a="x")
    assert not matches("a = 'x'", a=" x")
    assert matches("a = 'it''s'", a="it's")


def test_a_property_compared_with_an_integer_is_read_as_a_java_integer() -> None:
    assert matches("a = 10", a="10")
    assert matches("a > 5", a="10")
    assert matches("a > 5", a="+10")
    assert not matches("a > 5", a="10.5")  # Integer.valueOf fails: no match
    assert matches("a > 5.0", a="10.5")
    assert not matches("a > 5", a=" 10")  # Integer.valueOf does not trim


def test_integer_and_long_literals_read_properties_differently() -> None:
    # 5 is an Integer literal: '5000000000' does not parse as one
    assert not matches("a > 5", a="5000000000")
    # a literal beyond 32 bits is a Long
    assert matches("a > 4999999999", a="5000000000")
    assert matches("a = 5L", a="5")


def test_a_property_that_is_not_a_number_fails_the_whole_expression() -> None:
    assert not matches("a > 5", a="abc")
    assert not matches("NOT (a > 5)", a="abc")
    # the failure propagates: the left side of OR is evaluated first
    assert not matches("a > 5 OR b = 'x'", a="abc", b="x")
    assert matches("b = 'x' OR a > 5", a="abc", b="x")


def test_two_string_properties_compare_as_doubles() -> None:
    assert matches("a > b", a="10", b="9")  # as strings '10' < '9'
    assert not matches("a > b", a="x", b="9")
    assert matches("a = b", a="x", b="x")
    assert not matches("a = b", a="1.0", b="1")  # equality stays a string comparison


def test_doubles_read_properties_as_java_double_value_of() -> None:
    assert matches("a > 1.5", a=" 2 ")  # trimmed
    assert matches("a > 1.5", a="2f")
    assert matches("a > 1.5", a="0x1p3")  # 8.0
    assert matches("a > 1.5", a="Infinity")
    assert matches("a > 1.5", a="NaN")  # Double.compareTo: NaN above everything
    assert not matches("a < 1.5", a="NaN")
    assert matches("a = 1.0", a="1")
    assert not matches("a > 1.5", a="inf")


def test_booleans() -> None:
    assert matches("a = TRUE", a="true")
    assert matches("a = TRUE", a="TRUE")
    assert not matches("a = TRUE", a="yes")
    assert matches("a = FALSE", a="yes")  # Boolean.valueOf: anything but "true" is false
    # RocketMQ casts the Boolean to a String when it is on the left: an error, no match
    assert not matches("TRUE = a", a="true")


def test_mismatched_literal_types_compare_as_unequal() -> None:
    assert not matches("1 = TRUE")
    assert matches("NOT (1 = TRUE)")
    assert matches("'1' = 1")  # a string against a number is converted


def test_a_bare_property_as_a_condition() -> None:
    # a property value is a string, never a Boolean: as a condition it is FALSE
    assert not matches("a", a="true")
    assert matches("NOT a", a="true")
    assert not matches("NOT a")  # null


def test_not_binds_tighter_than_a_comparison() -> None:
    # (NOT a) = 'x': a Boolean compared with a string fails; never a match
    assert not matches("NOT a = 'x'", a="y")
    assert not matches("NOT a = 'x'")
    assert matches("NOT (a = 'x')", a="y")


def test_unary_minus_of_a_property_is_null() -> None:
    assert not matches("-a < 0", a="5")
    assert matches("a > -5", a="-4")


def test_tags_is_a_property() -> None:
    assert matches("TAGS = 'paid'", TAGS="paid")
    assert matches("TAGS IN ('paid', 'refunded') AND amount > 100", TAGS="paid", amount="250")
    assert not matches("TAGS = 'paid'")


def test_keywords_are_case_insensitive_and_property_names_are_not() -> None:
    assert matches("a is not null and b between 1 and 2", a="x", b="1")
    assert not matches("A = 'x'", a="x")


def test_evaluation_never_raises() -> None:
    f = compile_filter("a > 5 AND b = TRUE OR c IN ('x') OR -d > 1")
    for value in ["", "x", "1e999", "9" * 400, "\x00", "0x", "NaN", "-0", "true"]:
        for name in "abcd":
            f.matcher({name: value})


# --- what the parser refuses, as RocketMQ's does ----------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "a = NULL",  # NULL cannot be compared; use IS NULL
        "NULL <> a",
        "TRUE = 1",  # a boolean literal against another literal
        "a > 'x'",  # only numbers are ordered
        "a > TRUE",
        "(a = 1) > 2",  # a condition cannot be ordered
        "a BETWEEN 2 AND 1",
        "a BETWEEN 'a' AND 'b'",
        "a > 0.0",  # floating literals below Double.MIN_VALUE, as RocketMQ
        "a > 1e999",
        "a > 9223372036854775808",
        "5",  # not a condition
        "'x'",
        "NOT 5",
        "a = 1 AND 5",
        "1 IN ('x')",  # IN wants a property
        "a IN (1, 2)",  # and string literals
        "a IN ()",
        "a == 1",
        "a != 1",
        "a = 1 #",  # the token after the expression is read
        "a = 1 NOT x",
        "a IS x",
        "(a = 1",
        "",
        "a.b = 1",
        "a = 'unterminated",
    ],
)
def test_refused(expression: str) -> None:
    refused(expression)


def test_refusals_say_where() -> None:
    e = refused("a = 1 AND\n  b > 'x'")
    assert (e.line, e.column) == (2, 5)
    assert "line 2, column 5" in str(e)
    e = refused("a = 1 #")
    assert (e.line, e.column) == (1, 7)


@pytest.mark.parametrize(
    "expression",
    [
        "a = 1 b",  # parsing stops where the expression ends, as RocketMQ's
        "a LIKE 'x%'",  # LIKE is not in the grammar: this is `a` (never matches)
        "a BETWEEN 10 AND -5",  # a negated literal is not checked as a bound
        "NULL",
        "NULL IS NULL",
        "a = -NULL",
        "a > 1 -- a comment\n",
        "/* c */ a > 1",
        "+a > 1",
        "a > .5 AND b < 5. AND c = 5E3 AND d = 1.5e-3",
        "$x_1 = 'y'",
    ],
)
def test_accepted(expression: str) -> None:
    parse_selector(expression)


def test_trailing_input_after_the_expression_is_ignored() -> None:
    assert matches("a = 1 b", a="1")
    assert not matches("a LIKE 'x%'", a="xyz")


def test_nesting_is_bounded() -> None:
    refused("(" * 200 + "a = 1" + ")" * 200)
    refused("NOT " * 200 + "TRUE")
    refused(" OR ".join(["a = 1"] * 200))
    parse_selector(" OR ".join(["a = 1"] * 50))


def test_huge_input_is_refused_quickly_with_a_short_message() -> None:
    e = refused("a = " + "9" * 10_000)  # beyond Python's int-from-string limit too
    assert len(str(e)) < 200
    refused(" AND ".join(["a = 1"] * 100_000))  # stops at the depth bound, not at the end
