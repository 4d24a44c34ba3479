"""What a consumer subscribes to: tags or a SQL92 expression (RocketMQ ``MessageSelector``).

``MessageSelector.by_tag("paid || refunded")`` is the classic tag expression (``*`` for all; the
broker compares tag hash codes and the client checks the tags again), and a plain string
passed where a selector is expected means the same.  ``MessageSelector.by_sql("amount > 100
AND TAGS = 'paid'")`` is evaluated by the broker over each message's properties (TAGS among
them); the broker must run with ``enablePropertyFilter=true``.  A consumer with a SQL92
subscription asks a broker of the topic at start (CHECK_CLIENT_CONFIG, as RocketMQ's clients
do), so a broker that refuses it, or an expression it cannot parse, fails the start with the
broker's reason rather than every pull later.  The grammar: docs/sql92.md.
"""

from __future__ import annotations

import time

import attrs

from common.model import SubscriptionData
from common.string_hash import java_string_hash
from rmq.errors import ClientError

TAG = "TAG"
SQL92 = "SQL92"


def parse_tag_expression(expression: str | None) -> frozenset[str] | None:
    """'*' (or empty) -> None (everything); 'A || B' -> {'A', 'B'} (FilterAPI)."""
    if expression is None or expression.strip() in ("", "*"):
        return None
    tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
    if not tags:
        raise ClientError(f"bad tag expression {expression!r}")
    return tags


@attrs.frozen
class MessageSelector:
    expression_type: str
    expression: str

    @classmethod
    def by_sql(cls, sql: str) -> MessageSelector:
        """Messages whose properties satisfy ``sql`` (evaluated by the broker)."""
        if not sql or not sql.strip():
            raise ClientError("a SQL92 selector needs an expression")
        return cls(SQL92, sql)

    @classmethod
    def by_tag(cls, tag: str = "*") -> MessageSelector:
        """Messages with one of the tags of ``tag`` (``'A || B'``; ``*`` for every message)."""
        parse_tag_expression(tag)
        return cls(TAG, "*" if not tag or not tag.strip() else tag.strip())

    @classmethod
    def of(cls, selector: str | MessageSelector) -> MessageSelector:
        """A selector as given, or a tag expression given as a string."""
        if isinstance(selector, MessageSelector):
            return selector
        if not isinstance(selector, str):
            raise ClientError(
                f"a subscription is a tag expression or a MessageSelector, not {selector!r}"
            )
        return cls.by_tag(selector)

    @property
    def is_sql(self) -> bool:
        return self.expression_type == SQL92

    def tags(self) -> frozenset[str] | None:
        """The tags a TAG selector wants (None: all, or a SQL92 selector: the broker decides)."""
        return None if self.is_sql else parse_tag_expression(self.expression)

    def subscription(self, topic: str) -> SubscriptionData:
        """FilterAPI.build: tags split on '||' with their hash codes; SQL92 as it is."""
        version = int(time.time() * 1000)
        if self.is_sql:
            return SubscriptionData(
                topic, self.expression, subVersion=version, expressionType=SQL92
            )
        tags = self.tags()
        if tags is None:
            return SubscriptionData(topic, "*", subVersion=version)
        ordered = sorted(tags)
        return SubscriptionData(
            topic,
            self.expression,
            tagsSet=ordered,
            codeSet=[java_string_hash(t) for t in ordered],
            subVersion=version,
        )
