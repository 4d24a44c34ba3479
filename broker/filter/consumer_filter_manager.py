"""The compiled SQL92 filters the broker's pulls use (RocketMQ ``ConsumerFilterManager``), bounded.

RocketMQ compiles a group's expression when its heartbeat registers the subscription (and on
every pull that carries the expression), caching parses by text (``SelectorParser``'s cache of
100) and keeping one ``ConsumerFilterData`` per (topic, group).  Here the compiled filter of an
expression text is the only state: the (topic, group) a pull names leads to the subscription the
group's heartbeat registered, whose text leads to the filter.  The cache is an LRU bounded in
entries and in the total length of the texts it keeps, so clients sending ever new (or huge)
expressions cost parse time, never unbounded memory; a refused expression is cached too, so a
client repeating a bad one is not re-parsed on every pull.
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

from broker.filter.evaluation import compile_selector
from broker.filter.message_filter import SqlMessageFilter
from broker.filter.selector_parser import parse_selector
from broker.filter.tokens import SelectorSyntaxError

SQL92 = "SQL92"


def is_tag_type(expression_type: str | None) -> bool:
    """``ExpressionType.isTagType``: no type, empty, or TAG."""
    return not expression_type or expression_type.upper() == "TAG"


def compile_filter(expression: str) -> SqlMessageFilter:
    """Parse and compile; SelectorSyntaxError when RocketMQ would refuse the expression."""
    return SqlMessageFilter(expression, compile_selector(parse_selector(expression)))


@attrs.define(eq=False)
class ConsumerFilterManager:
    max_entries: int = 1024
    max_chars: int = 1 << 20
    # expression text -> its filter or why it was refused; least recently used first; the
    # texts' total length is `_chars` <= max_chars (an entry longer than that is not kept)
    _cache: OrderedDict[str, SqlMessageFilter | SelectorSyntaxError] = attrs.field(
        factory=OrderedDict, init=False
    )
    _chars: int = attrs.field(default=0, init=False)

    def __len__(self) -> int:
        return len(self._cache)

    def get(self, expression_type: str | None, expression: str) -> SqlMessageFilter:
        """The filter of ``expression``; SelectorSyntaxError when it is refused (also for an
        expression type other than SQL92, which RocketMQ's FilterFactory does not know)."""
        if expression_type != SQL92:
            raise SelectorSyntaxError(f"Unknown expression type {expression_type!r}")
        if not expression:
            raise SelectorSyntaxError(f"Expression can't be null! {expression_type}")
        found = self._cache.get(expression)
        if found is None:
            try:
                found = compile_filter(expression)
            except SelectorSyntaxError as exc:
                found = exc
            self._remember(expression, found)
        else:
            self._cache.move_to_end(expression)
        if isinstance(found, SelectorSyntaxError):
            raise found
        return found

    def _remember(self, expression: str, value: SqlMessageFilter | SelectorSyntaxError) -> None:
        if len(expression) > self.max_chars:
            return
        self._cache[expression] = value
        self._chars += len(expression)
        while len(self._cache) > self.max_entries or self._chars > self.max_chars:
            old, _ = self._cache.popitem(last=False)
            self._chars -= len(old)
