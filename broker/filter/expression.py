"""The parsed selector: RocketMQ's ``filter/expression`` classes as a tree of frozen values.

Values are Java's, with one Python type each: ``None`` (null), ``bool`` (Boolean), ``str``
(String), ``float`` (Double), ``int`` (Long) and :class:`Int32` (Integer).  RocketMQ keeps a
decimal literal that fits 32 bits as an Integer and a bigger one as a Long, and the difference
shows: ``a > 5`` reads the property with ``Integer.valueOf`` (so ``'5000000000'`` fails) where
``a > 5000000000`` uses ``Long.valueOf``.

A *boolean expression* (RocketMQ's ``BooleanExpression``) is one that may stand where AND, OR,
NOT and the whole selector want a condition: comparisons, IN, NOT, AND/OR and the constants
TRUE, FALSE and NULL.  A bare property is accepted there through a :class:`BooleanCast`; a
number, a string or a negation is not.
"""

from __future__ import annotations

import enum

import attrs


class Int32(int):
    """A Java Integer (an ``int`` is a Java Long)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Int32({int(self)})"

    def __str__(self) -> str:
        return str(int(self))


JavaValue = None | bool | str | float | int


@attrs.frozen
class Constant:
    """A literal; TRUE, FALSE and NULL are boolean constants (``BooleanConstantExpression``)."""

    value: JavaValue
    boolean: bool = False


@attrs.frozen
class Property:
    """A message property by name (``PropertyExpression``); TAGS is one like any other."""

    name: str


@attrs.frozen
class Negate:
    """Unary minus: numbers negate, null stays null, anything else is null."""

    operand: Expr


@attrs.frozen
class Not:
    operand: Expr


@attrs.frozen
class BooleanCast:
    """A property used as a condition: null -> null, Boolean -> itself, anything else FALSE."""

    operand: Expr


@attrs.frozen
class In:
    """``prop [NOT] IN ('a', ...)``: only string literals, only a property on the left."""

    property: Property
    values: frozenset[str]
    negated: bool


@attrs.frozen
class Equal:
    """``=`` (and IS NULL, as ``= NULL``; ``<>`` and IS NOT NULL are NOT of it)."""

    left: Expr
    right: Expr


class Op(enum.Enum):
    GT = ">"
    GE = ">="
    LT = "<"
    LE = "<="


@attrs.frozen
class Compare:
    """``>``, ``>=``, ``<``, ``<=`` (BETWEEN is two of them under AND, NOT BETWEEN under OR)."""

    op: Op
    left: Expr
    right: Expr


@attrs.frozen
class And:
    left: Expr
    right: Expr


@attrs.frozen
class Or:
    left: Expr
    right: Expr


Expr = Constant | Property | Negate | Not | BooleanCast | In | Equal | Compare | And | Or


def is_boolean(e: Expr) -> bool:
    """RocketMQ's ``instanceof BooleanExpression``."""
    if isinstance(e, Constant):
        return e.boolean
    return not isinstance(e, (Property, Negate))


def is_number(v: JavaValue) -> bool:
    """Java's ``instanceof Number`` (a Boolean is not one)."""
    return type(v) is Int32 or type(v) is int or type(v) is float
