"""Evaluating a selector against a message's properties with RocketMQ's typing and null rules.

Theory of operation
-------------------
RocketMQ evaluates the expression tree (``ComparisonExpression``, ``LogicExpression``,
``UnaryExpression`` in ``filter/.../expression`` of apache/rocketmq 4.9) over the message's
properties, which are all strings, and delivers the message only when the result is
``Boolean.TRUE`` (``ExpressionMessageFilter.isMatchedByCommitLog``).  A Java exception during
evaluation (a property that does not parse as the number it is compared with) is caught there
and the message is not delivered.  Here such a failure is :class:`EvaluationFailed`, raised
inside and caught by :func:`compile_selector`'s matcher: evaluation never raises to its caller.
It propagates like Java's exception, so ``a > 5 OR b = 'x'`` with ``a = 'abc'`` fails as a whole
(the left side is evaluated first), while ``b = 'x' OR a > 5`` matches.

The rules, each as RocketMQ has them:

* A missing property is null.  ``=``: both null -> TRUE; only the left null -> null; only the
  right null -> FALSE (so ``'x' <> a`` matches a message without ``a`` and ``a <> 'x'`` does
  not); otherwise Java ``equals`` (same class, same value) -> TRUE, else the comparison below.
* ``>``, ``>=``, ``<``, ``<=``: null on either side -> null (the right side is not evaluated when
  the left is null); two strings are both read with ``Double.valueOf`` (failure: the message
  does not match); otherwise the comparison below.
* The comparison (``__compare`` with string conversion on): values of different classes are
  converted: Integer -> Long -> Double between numbers; a string against a number is read with
  that number's ``valueOf`` (Integer, Long or Double), against a Boolean with
  ``Boolean.valueOf`` (only ``true`` in any case is TRUE); Boolean against a string fails
  (RocketMQ casts the Boolean to String); other mixes compare as "less" (-1).
* NOT, AND, OR: three-valued; AND is FALSE as soon as one side is FALSE, OR TRUE as soon as one
  side is TRUE, null otherwise if a side is null.  ``[NOT] IN``: null for null; the list test
  otherwise.  A property used as a condition: null -> null, anything but a Boolean -> FALSE, so
  a bare property (a string) never matches.  Unary minus of anything but a number is null.

Number parsing follows Java: ``Integer.valueOf`` / ``Long.valueOf`` take an optional sign and
decimal digits (any Unicode digit, as ``Character.digit``) within range; ``Double.valueOf``
trims characters <= space and takes Java's floating literal (``NaN``, ``Infinity``, ``1e3``,
``1.5f``, ``0x1p3``).  Doubles compare as ``Double.compareTo``: NaN equals NaN and is above
everything, -0.0 is below 0.0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping

from broker.filter.expression import (
    And,
    BooleanCast,
    Compare,
    Constant,
    Equal,
    Expr,
    In,
    Int32,
    JavaValue,
    Negate,
    Not,
    Op,
    Or,
    Property,
    is_number,
)

Properties = Mapping[str, str]
Evaluator = Callable[[Properties], JavaValue]

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1


class EvaluationFailed(Exception):
    """A Java exception in RocketMQ's evaluation: the message does not match."""


# --- Java's valueOf ---------------------------------------------------------------------------

_JAVA_INTEGER = re.compile(r"[+-]?\d+")
_JAVA_DOUBLE = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)"
)
_JAVA_HEX_DOUBLE = re.compile(
    r"([+-]?)0[xX]((?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?"
)


def _integral(s: str, lo: int, hi: int) -> int:
    if _JAVA_INTEGER.fullmatch(s) is None:
        raise EvaluationFailed(f"For input string: {s!r}")
    v = int(s)
    if not lo <= v <= hi:
        raise EvaluationFailed(f"For input string: {s!r} (out of range)")
    return v


def integer_value_of(s: str) -> Int32:
    return Int32(_integral(s, INT_MIN, INT_MAX))


def long_value_of(s: str) -> int:
    return _integral(s, LONG_MIN, LONG_MAX)


def double_value_of(s: str) -> float:
    t = s.strip("".join(chr(c) for c in range(33)))  # String.trim
    if _JAVA_DOUBLE.fullmatch(t):
        if t.endswith("NaN"):
            return math.nan
        if t.endswith("Infinity"):
            return -math.inf if t.startswith("-") else math.inf
        return float(t.rstrip("fFdD"))
    m = _JAVA_HEX_DOUBLE.fullmatch(t)
    if m:
        try:
            v = float.fromhex("0x" + m.group(2))
        except OverflowError:
            v = math.inf
        return -v if m.group(1) == "-" else v
    raise EvaluationFailed(f"For input string: {s!r}")


def boolean_value_of(s: str) -> bool:
    return s.lower() == "true" if len(s) == 4 else False


# --- Java's compareTo with RocketMQ's conversions --------------------------------------------


def _sign(a: float | int, b: float | int) -> int:
    return (a > b) - (a < b)


def double_compare(a: float, b: float) -> int:
    """``Double.compare``: NaN equals NaN and is above everything; -0.0 < 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    a_nan, b_nan = a != a, b != b
    if a_nan or b_nan:
        return int(a_nan) - int(b_nan)
    if a == 0.0 and b == 0.0:
        return int(math.copysign(1, a) > 0) - int(math.copysign(1, b) > 0)
    return 0


def java_equals(lv: JavaValue, rv: JavaValue) -> bool:
    """``lv.equals(rv)``: the same class and value (``Double.equals`` compares bits)."""
    if type(lv) is not type(rv):
        return False
    if type(lv) is float:
        assert type(rv) is float
        return double_compare(lv, rv) == 0
    return lv == rv


# ``ComparisonExpression.__compare``'s conversions of mixed classes: (class of lv, class of rv)
# -> which side is converted and how; any other mix compares as -1 (Boolean against String throws).
# The converters are typed by their string case; int and float also take the numbers.
_LEFT, _RIGHT = 0, 1
_CONVERSIONS: dict[tuple[type, type], tuple[int, Callable[[str], JavaValue]]] = {
    (Int32, int): (_LEFT, int),
    (Int32, float): (_LEFT, float),
    (Int32, str): (_RIGHT, integer_value_of),
    (int, Int32): (_RIGHT, int),
    (int, float): (_LEFT, float),
    (int, str): (_RIGHT, long_value_of),
    (float, Int32): (_RIGHT, float),
    (float, int): (_RIGHT, float),
    (float, str): (_RIGHT, double_value_of),
    (str, bool): (_LEFT, boolean_value_of),
    (str, Int32): (_LEFT, integer_value_of),
    (str, int): (_LEFT, long_value_of),
    (str, float): (_LEFT, double_value_of),
}


def java_compare(lv: JavaValue, rv: JavaValue) -> int:
    """``ComparisonExpression.__compare(lv, rv, true)``: converts mixed classes, then compareTo."""
    lc, rc = type(lv), type(rv)
    if lc is not rc:
        conversion = _CONVERSIONS.get((lc, rc))
        if conversion is None:
            if lc is bool and rc is str:
                raise EvaluationFailed("ClassCastException: Boolean cannot be cast to String")
            return -1
        side, convert = conversion
        if side == _LEFT:
            lv = convert(lv)  # type: ignore[arg-type]
        else:
            rv = convert(rv)  # type: ignore[arg-type]
    if type(lv) is float:
        return double_compare(lv, rv)  # type: ignore[arg-type]
    if type(lv) is str:
        # only ever asked "equal or not" (strings never reach <, > unconverted)
        return 0 if lv == rv else (1 if lv > rv else -1)  # type: ignore[operator]
    return _sign(lv, rv)  # type: ignore[arg-type]


_AS_BOOLEAN: dict[Op, Callable[[int], bool]] = {
    Op.GT: lambda c: c > 0,
    Op.GE: lambda c: c >= 0,
    Op.LT: lambda c: c < 0,
    Op.LE: lambda c: c <= 0,
}


def _negate(v: JavaValue) -> JavaValue:
    if type(v) is Int32:
        n = -int(v)
        return Int32((n - INT_MIN) % 2**32 + INT_MIN)  # Java int overflow wraps
    if type(v) is int:
        return (-v - LONG_MIN) % 2**64 + LONG_MIN
    if type(v) is float:
        return -v
    return None


# --- compiling the tree to closures -----------------------------------------------------------


def compile_expression(e: Expr) -> Evaluator:
    """A function of the properties giving ``e``'s value; may raise :class:`EvaluationFailed`."""
    if isinstance(e, Constant):
        value = e.value
        return lambda props: value
    if isinstance(e, Property):
        name = e.name
        return lambda props: props.get(name)
    if isinstance(e, Negate):
        operand = compile_expression(e.operand)

        def negate(props: Properties) -> JavaValue:
            v = operand(props)
            return _negate(v) if is_number(v) else None

        return negate
    if isinstance(e, Not):
        operand = compile_expression(e.operand)

        def not_(props: Properties) -> JavaValue:
            v = operand(props)
            return None if v is None else not v

        return not_
    if isinstance(e, BooleanCast):
        operand = compile_expression(e.operand)

        def cast(props: Properties) -> JavaValue:
            v = operand(props)
            if v is None:
                return None
            return v if type(v) is bool else False

        return cast
    if isinstance(e, In):
        name, values, negated = e.property.name, e.values, e.negated

        def in_(props: Properties) -> JavaValue:
            v = props.get(name)
            if type(v) is not str:
                return None
            return (v in values) != negated

        return in_
    if isinstance(e, Equal):
        left, right = compile_expression(e.left), compile_expression(e.right)

        def equal(props: Properties) -> JavaValue:
            lv, rv = left(props), right(props)
            if lv is None or rv is None:
                if lv is None and rv is None:
                    return True
                return None if lv is None else False
            if java_equals(lv, rv):
                return True
            return java_compare(lv, rv) == 0

        return equal
    if isinstance(e, Compare):
        left, right = compile_expression(e.left), compile_expression(e.right)
        as_boolean = _AS_BOOLEAN[e.op]

        def compare(props: Properties) -> JavaValue:
            lv = left(props)
            if lv is None:
                return None
            rv = right(props)
            if rv is None:
                return None
            if type(lv) is str and type(rv) is str:
                return as_boolean(double_compare(double_value_of(lv), double_value_of(rv)))
            return as_boolean(java_compare(lv, rv))

        return compare
    if isinstance(e, And | Or):
        left, right = compile_expression(e.left), compile_expression(e.right)
        # FALSE decides an AND, TRUE an OR, whatever the other side is (even null)
        decisive = isinstance(e, Or)

        def junction(props: Properties) -> JavaValue:
            lv = left(props)
            if lv is decisive:
                return decisive
            rv = right(props)
            if rv is decisive:
                return decisive
            if lv is None or rv is None:
                return None
            return not decisive

        return junction
    raise TypeError(f"not an expression: {e!r}")


def compile_selector(e: Expr) -> Callable[[Properties], bool]:
    """The matcher RocketMQ's filter applies: True only for a TRUE result; never raises."""
    evaluate = compile_expression(e)

    def matches(props: Properties) -> bool:
        try:
            return evaluate(props) is True
        except (EvaluationFailed, ValueError, OverflowError, RecursionError):
            return False

    return matches
