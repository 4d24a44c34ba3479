"""The SQL92 filter a pull applies to the records it reads (RocketMQ ``ExpressionMessageFilter``).

RocketMQ filters a SQL92 subscription in two steps: at the ConsumeQueue (only with the bloom
filter bit maps of ``CommitLogDispatcherCalcBitMap``, an optimisation we do not have, so every
unit passes) and on the CommitLog record, by evaluating the expression over the record's
properties (``isMatchedByCommitLog``).  We do the second step on every record a pull reads; a
record whose properties cannot be decoded does not match.  TAGS is an ordinary property there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from common.message import RecordDecodeError, record_properties


@attrs.frozen
class SqlMessageFilter:
    expression: str
    # properties -> matched; never raises (evaluation.compile_selector)
    matcher: Callable[[Mapping[str, str]], bool]

    def is_matched_by_consume_queue(self, tags_code: int | None) -> bool:
        return True

    def is_matched_by_commit_log(self, record: bytes | memoryview) -> bool:
        try:
            props = record_properties(record)
        except RecordDecodeError:
            return False
        return self.matcher(props)
