"""The SQL92 selector's tokens and lexer (the TOKEN section of RocketMQ's ``SelectorParser.jj``).

Theory of operation
-------------------
The lexer is lazy, as JavaCC's token manager is: the parser asks for one token at a time and
peeks at most two ahead, so characters after the last token the grammar looked at are never
read.  RocketMQ's grammar does not require end of input after the expression, so ``a = 1 b`` is
accepted (the ``b`` is ignored) while ``a = 1 #`` is not: the ``#`` is the token the parser peeks
at to see whether the comparison goes on.  Matching that needs exactly this laziness.

Tokens, longest match first, keywords before identifiers of the same length:

* skipped: blanks `` \\t\\n\\r\\f``, ``-- ... <newline>`` (a line comment needs its newline: at the
  very end ``--`` is two minus signs), ``/* ... */``;
* keywords, any case: NOT AND OR BETWEEN IN TRUE FALSE NULL IS;
* ``DECIMAL``: ``0`` or ``[1-9][0-9]*`` with an optional ``l``/``L``; ``FLOAT``: ``5.5``, ``5.``,
  ``.5``, ``5E10`` with an optional exponent ``E[+-]digits`` (any case);
* ``STRING``: ``'...'`` where ``''`` stands for one quote (any character, newlines too);
* ``ID``: ``[A-Za-z_$][A-Za-z0-9_$]*`` (so a property named ``a.b`` or ``is`` cannot be named);
* operators ``= <> > >= < <= ( ) , + -``.

Anything else is a lexical error.  Positions are 1-based line and column (a tab counts one).
"""

from __future__ import annotations

import enum
import re

import attrs


class SelectorSyntaxError(ValueError):
    """The expression is not a selector RocketMQ's parser accepts; says where and why."""

    def __init__(self, message: str, line: int = 0, column: int = 0) -> None:
        where = f" at line {line}, column {column}" if line else ""
        super().__init__(f"{message}{where}")
        self.line = line
        self.column = column


class Kind(enum.Enum):
    EOF = "<EOF>"
    NOT = "NOT"
    AND = "AND"
    OR = "OR"
    BETWEEN = "BETWEEN"
    IN = "IN"
    TRUE = "TRUE"
    FALSE = "FALSE"
    NULL = "NULL"
    IS = "IS"
    DECIMAL = "<DECIMAL_LITERAL>"
    FLOAT = "<FLOATING_POINT_LITERAL>"
    STRING = "<STRING_LITERAL>"
    ID = "<ID>"
    EQ = "="
    NE = "<>"
    GT = ">"
    GE = ">="
    LT = "<"
    LE = "<="
    LPAREN = "("
    RPAREN = ")"
    COMMA = ","
    PLUS = "+"
    MINUS = "-"


KEYWORDS = {
    k.value: k
    for k in (
        Kind.NOT,
        Kind.AND,
        Kind.OR,
        Kind.BETWEEN,
        Kind.IN,
        Kind.TRUE,
        Kind.FALSE,
        Kind.NULL,
        Kind.IS,
    )
}


@attrs.frozen
class Token:
    kind: Kind
    image: str
    pos: int  # index of its first character (line and column only when an error is reported)


_SKIP = re.compile(r"(?:[ \t\n\r\f]+|--[^\n\r]*(?:\r\n|\n|\r)|/\*[^*]*\*+(?:[^*/][^*]*\*+)*/)+")
_EXP = r"[eE][+-]?[0-9]+"
_FLOAT = re.compile(rf"[0-9]+\.[0-9]*(?:{_EXP})?|\.[0-9]+(?:{_EXP})?|[0-9]+{_EXP}")
_DECIMAL = re.compile(r"0|[1-9][0-9]*[lL]?")
_STRING = re.compile(r"'(?:''|[^'])*'")
_ID = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_OPERATORS = (
    ("<>", Kind.NE),
    ("<=", Kind.LE),
    (">=", Kind.GE),
    ("=", Kind.EQ),
    ("<", Kind.LT),
    (">", Kind.GT),
    ("(", Kind.LPAREN),
    (")", Kind.RPAREN),
    (",", Kind.COMMA),
    ("+", Kind.PLUS),
    ("-", Kind.MINUS),
)


class Lexer:
    """Tokens of ``text`` on demand: :meth:`peek` looks ahead, :meth:`next` consumes."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._pos = 0  # where the next unread token starts (after skipped text)
        self._ahead: list[Token] = []  # peeked, not consumed; lexed in order

    def position(self, pos: int) -> tuple[int, int]:
        """(line, column) of character ``pos``, 1-based; ``\\r\\n``, ``\\n`` and ``\\r`` end lines."""
        before = self.text[:pos]
        line = 1 + before.count("\n") + before.count("\r") - before.count("\r\n")
        start = max(before.rfind("\n"), before.rfind("\r")) + 1
        return line, pos - start + 1

    def peek(self, k: int = 1) -> Token:
        while len(self._ahead) < k:
            self._ahead.append(self._lex())
        return self._ahead[k - 1]

    def next(self) -> Token:
        tok = self.peek()
        self._ahead.pop(0)
        return tok

    def _lex(self) -> Token:
        text = self.text
        m = _SKIP.match(text, self._pos)
        if m:
            self._pos = m.end()
        pos = self._pos
        if pos >= len(text):
            return Token(Kind.EOF, "", pos)
        best: tuple[int, Kind] | None = None
        for regex, kind in ((_FLOAT, Kind.FLOAT), (_DECIMAL, Kind.DECIMAL), (_STRING, Kind.STRING)):
            m = regex.match(text, pos)
            if m and (best is None or m.end() > best[0]):
                best = (m.end(), kind)
        m = _ID.match(text, pos)
        if m and (best is None or m.end() > best[0]):
            word = m.group()
            best = (m.end(), KEYWORDS.get(word.upper(), Kind.ID))
        if best is None:
            for op, kind in _OPERATORS:
                if text.startswith(op, pos):
                    best = (pos + len(op), kind)
                    break
        if best is None:
            line, col = self.position(pos)
            raise SelectorSyntaxError(f"Lexical error: unexpected {text[pos]!r}", line, col)
        end, kind = best
        self._pos = end
        return Token(kind, text[pos:end], pos)
