"""RocketMQ's SQL92 selector grammar (``filter/.../parser/SelectorParser.jj`` in apache/rocketmq 4.9).

Theory of operation
-------------------
A recursive-descent parser with the grammar's levels, loosest first::

    selector   := or                          (must be a boolean expression, see below)
    or         := and ( OR and )*
    and        := equality ( AND equality )*
    equality   := comparison ( = comparison | <> comparison | IS NULL | IS NOT NULL )*
    comparison := unary ( (> | >= | < | <=) unary | [NOT] BETWEEN unary AND unary
                        | [NOT] IN ( 'str' (, 'str')* ) )*
    unary      := + unary | - unary | NOT unary | primary
    primary    := literal | property | ( or )

So NOT binds tighter than a comparison: ``NOT a = 'x'`` is ``(NOT a) = 'x'``, which RocketMQ
accepts and which never matches; write ``NOT (a = 'x')``.  There is no LIKE, no arithmetic
beyond unary minus, and no end-of-input check: like JavaCC's parser, parsing stops where the
expression ends, so ``a = 1 b`` is ``a = 1`` (see ``broker/filter/tokens.py`` for what is lexed).

The construction checks RocketMQ's factory methods make are made here too, with the position
of the operator: ``=``/``<>`` refuse a NULL literal and ``TRUE = <non-boolean literal>``;
``<``, ``>``, BETWEEN refuse a non-numeric literal and a boolean expression on either side;
BETWEEN with two literal bounds wants low <= high; IN wants a property on its left; AND, OR,
NOT and the whole selector want a boolean expression (a property is cast).  A decimal literal
must fit a Java long; a floating literal must be finite and at least ``Double.MIN_VALUE`` (so
``0.0`` is refused, as in RocketMQ; write ``0``).  Negated literals are not literals to these
checks (``a BETWEEN 10 AND -5`` is accepted and matches nothing), as in RocketMQ.

Ours: nesting is limited to ``MAX_DEPTH`` levels of the tree (RocketMQ's limit is the Java
stack); deeper input is refused like any other bad expression.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from broker.filter.evaluation import EvaluationFailed, java_compare
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
    is_boolean,
    is_number,
)
from broker.filter.tokens import Kind, Lexer, SelectorSyntaxError, Token

MAX_DEPTH = 100

NULL = Constant(None, boolean=True)
_COMPARISONS = {Kind.GT: Op.GT, Kind.GE: Op.GE, Kind.LT: Op.LT, Kind.LE: Op.LE}
_EQUALITY_OPS = {Kind.EQ, Kind.NE, Kind.IS}
_COMPARISON_OPS = {*_COMPARISONS, Kind.BETWEEN, Kind.IN, Kind.NOT}
_LITERALS = {Kind.TRUE, Kind.FALSE, Kind.NULL, Kind.DECIMAL, Kind.FLOAT, Kind.STRING}
_DOUBLE_MIN_VALUE = 5e-324


def parse_selector(text: str) -> Expr:
    """The expression tree of ``text``; :class:`SelectorSyntaxError` if RocketMQ refuses it."""
    p = _Parser(text)
    try:
        start = p.lx.peek()
        tree = p.as_boolean(p.or_expression(), start)
    except RecursionError:  # MAX_DEPTH keeps well below the limit; this is a safety net
        raise SelectorSyntaxError(f"Expression nests deeper than {MAX_DEPTH} levels") from None
    if _depth(tree) > MAX_DEPTH:
        raise SelectorSyntaxError(f"Expression nests deeper than {MAX_DEPTH} levels")
    return tree


def _children(e: Expr) -> Iterator[Expr]:
    if isinstance(e, (Negate, Not, BooleanCast)):
        yield e.operand
    elif isinstance(e, In):
        yield e.property
    elif isinstance(e, (Equal, Compare, And, Or)):
        yield e.left
        yield e.right


def _depth(root: Expr) -> int:
    deepest = 0
    stack = [(root, 1)]
    while stack:
        e, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((c, d + 1) for c in _children(e))
    return deepest


def _describe(tok: Token) -> str:
    if tok.kind is Kind.EOF:
        return "<EOF>"
    image = tok.image if len(tok.image) <= 40 else tok.image[:37] + "..."
    return f'"{image}"'


class _Parser:
    def __init__(self, text: str) -> None:
        self.lx = Lexer(text)
        self.depth = 0  # nesting of unary(): parentheses, NOT, minus
        self.operators = 0  # binary operators so far: each may deepen the tree by one level

    # --- tokens ---------------------------------------------------------------------------

    def fail(self, tok: Token, expected: str) -> SelectorSyntaxError:
        return SelectorSyntaxError(
            f"Encountered {_describe(tok)}, was expecting {expected}", *self.lx.position(tok.pos)
        )

    def expect(self, kind: Kind) -> Token:
        tok = self.lx.next()
        if tok.kind is not kind:
            raise self.fail(tok, f'"{kind.value}"' if kind is not Kind.STRING else "a string")
        return tok

    def invalid(self, tok: Token, why: str) -> SelectorSyntaxError:
        return SelectorSyntaxError(f"{why} (near {_describe(tok)})", *self.lx.position(tok.pos))

    def deepen(self, tok: Token) -> None:
        """A chain of operators longer than MAX_DEPTH nests deeper than that: refused early,
        before a long input is parsed to the end (the tree's depth is checked at the end)."""
        self.operators += 1
        if self.operators > 4 * MAX_DEPTH:
            raise self.invalid(tok, f"Expression nests deeper than {MAX_DEPTH} levels")

    # --- the grammar ----------------------------------------------------------------------

    def or_expression(self) -> Expr:
        return self.boolean_chain(Kind.OR, self.and_expression, Or)

    def and_expression(self) -> Expr:
        return self.boolean_chain(Kind.AND, self.equality_expression, And)

    def boolean_chain(
        self, kind: Kind, operand: Callable[[], Expr], node: Callable[[Expr, Expr], Expr]
    ) -> Expr:
        """``operand (kind operand)*``, left-associative, each operand cast to a boolean."""
        start = self.lx.peek()
        left = operand()
        while self.lx.peek().kind is kind:
            self.deepen(self.lx.next())
            right_start = self.lx.peek()
            right = operand()
            left = node(self.as_boolean(left, start), self.as_boolean(right, right_start))
        return left

    def equality_expression(self) -> Expr:
        left = self.comparison_expression()
        while True:
            tok = self.lx.peek()
            if tok.kind in _EQUALITY_OPS:
                self.deepen(tok)
            if tok.kind is Kind.EQ or tok.kind is Kind.NE:
                self.lx.next()
                eq = self.create_equal(left, self.comparison_expression(), tok)
                left = eq if tok.kind is Kind.EQ else Not(eq)
            elif tok.kind is Kind.IS:
                if self.lx.peek(2).kind is Kind.NULL:
                    self.lx.next()
                    self.lx.next()
                    left = Equal(left, NULL)
                else:
                    self.lx.next()
                    not_tok = self.lx.next()
                    if not_tok.kind is not Kind.NOT:
                        raise self.fail(not_tok, '"NULL" or "NOT NULL" after "IS"')
                    self.expect(Kind.NULL)
                    left = Not(Equal(left, NULL))
            else:
                return left

    def comparison_expression(self) -> Expr:
        left = self.unary_expression()
        while True:
            tok = self.lx.peek()
            if tok.kind in _COMPARISON_OPS:
                self.deepen(tok)
            op = _COMPARISONS.get(tok.kind)
            if op is not None:
                self.lx.next()
                left = self.create_compare(op, left, self.unary_expression(), tok)
            elif tok.kind is Kind.BETWEEN:
                self.lx.next()
                low = self.unary_expression()
                self.expect(Kind.AND)
                high = self.unary_expression()
                left = self.create_between(left, low, high, tok)
            elif tok.kind is Kind.IN:
                self.lx.next()
                left = self.create_in(left, self.string_list(), False, tok)
            elif tok.kind is Kind.NOT:
                after = self.lx.peek(2).kind
                if after is Kind.BETWEEN:
                    self.lx.next()
                    self.lx.next()
                    low = self.unary_expression()
                    self.expect(Kind.AND)
                    high = self.unary_expression()
                    left = Or(
                        self.create_compare(Op.LT, left, low, tok),
                        self.create_compare(Op.GT, left, high, tok),
                    )
                elif after is Kind.IN:
                    self.lx.next()
                    self.lx.next()
                    left = self.create_in(left, self.string_list(), True, tok)
                else:
                    raise self.fail(tok, '"BETWEEN" or "IN" after "NOT"')
            else:
                return left

    def string_list(self) -> list[str]:
        self.expect(Kind.LPAREN)
        values = [_string(self.expect(Kind.STRING))]
        while self.lx.peek().kind is Kind.COMMA:
            self.lx.next()
            values.append(_string(self.expect(Kind.STRING)))
        self.expect(Kind.RPAREN)
        return values

    def unary_expression(self) -> Expr:
        tok = self.lx.peek()
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise self.invalid(tok, f"Expression nests deeper than {MAX_DEPTH} levels")
            if tok.kind is Kind.PLUS:
                self.lx.next()
                return self.unary_expression()
            if tok.kind is Kind.MINUS:
                self.lx.next()
                return Negate(self.unary_expression())
            if tok.kind is Kind.NOT:
                self.lx.next()
                start = self.lx.peek()
                return Not(self.as_boolean(self.unary_expression(), start))
            return self.primary_expression()
        finally:
            self.depth -= 1

    def primary_expression(self) -> Expr:
        tok = self.lx.next()
        kind = tok.kind
        if kind in _LITERALS:
            return self.literal(tok)
        if kind is Kind.ID:
            return Property(tok.image)
        if kind is Kind.LPAREN:
            inner = self.or_expression()
            self.expect(Kind.RPAREN)
            return inner
        raise self.fail(tok, 'a literal, a property, "(", "NOT", "+" or "-"')

    def literal(self, tok: Token) -> Constant:
        kind = tok.kind
        if kind is Kind.TRUE:
            return Constant(True, boolean=True)
        if kind is Kind.FALSE:
            return Constant(False, boolean=True)
        if kind is Kind.NULL:
            return NULL
        if kind is Kind.STRING:
            return Constant(_string(tok))
        if kind is Kind.DECIMAL:
            digits = tok.image.rstrip("lL")
            v = int(digits) if len(digits) <= 19 else 2**63
            if v > 2**63 - 1:
                raise self.invalid(tok, "Decimal literal out of the long range")
            return Constant(Int32(v) if v <= 2**31 - 1 else v)
        f = float(tok.image)
        if f == float("inf"):
            raise self.invalid(tok, "Floating literal is greater than Double.MAX_VALUE")
        if f < _DOUBLE_MIN_VALUE:
            raise self.invalid(tok, "Floating literal is less than Double.MIN_VALUE")
        return Constant(f)

    # --- RocketMQ's construction checks ---------------------------------------------------

    def as_boolean(self, e: Expr, start: Token) -> Expr:
        if is_boolean(e):
            return e
        if isinstance(e, Property):
            return BooleanCast(e)
        raise self.invalid(start, "Expression will not result in a boolean value")

    def create_equal(self, left: Expr, right: Expr, tok: Token) -> Expr:
        for side in (left, right):
            if isinstance(side, Constant) and side.value is None:
                raise self.invalid(tok, "NULL cannot be compared with '=' or '<>' (use IS NULL)")
        if (
            isinstance(left, Constant)
            and isinstance(right, Constant)
            and left.boolean
            and not right.boolean
        ):
            raise self.invalid(tok, "A boolean literal cannot be compared with a non-boolean one")
        return Equal(left, right)

    def check_less_than_operand(self, e: Expr, tok: Token) -> None:
        if isinstance(e, Constant):
            if not is_number(e.value):
                raise self.invalid(tok, "Only numbers can be compared with <, <=, >, >=, BETWEEN")
        elif is_boolean(e):
            raise self.invalid(tok, "A condition cannot be compared with <, <=, >, >=, BETWEEN")

    def create_compare(self, op: Op, left: Expr, right: Expr, tok: Token) -> Expr:
        self.check_less_than_operand(left, tok)
        self.check_less_than_operand(right, tok)
        return Compare(op, left, right)

    def create_between(self, value: Expr, low: Expr, high: Expr, tok: Token) -> Expr:
        if isinstance(low, Constant) and isinstance(high, Constant):
            lv, hv = low.value, high.value
            if lv is None or hv is None:
                raise self.invalid(tok, "Illegal values of BETWEEN: values can not be NULL")
            try:
                order = java_compare(hv, lv)
            except EvaluationFailed:
                order = -1
            if order < 0:
                raise self.invalid(
                    tok, f"Illegal values of BETWEEN: low ({lv!s}) must be <= high ({hv!s})"
                )
        return And(
            self.create_compare(Op.GE, value, low, tok),
            self.create_compare(Op.LE, value, high, tok),
        )

    def create_in(self, left: Expr, values: list[str], negated: bool, tok: Token) -> Expr:
        if not isinstance(left, Property):
            raise self.invalid(tok, "Expected a property on the left of IN")
        return In(left, frozenset(values), negated)


def _string(tok: Token) -> str:
    return tok.image[1:-1].replace("''", "'")
