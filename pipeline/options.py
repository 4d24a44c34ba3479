"""Options of the "rocketmq" source: parsed and checked once, on the driver.

Theory of operation: Spark hands the data source a case-insensitive dict of strings. Before any
partition is planned, `parse_reader_options` turns it into a frozen, picklable `ReaderOptions`
(plain values only: it travels to the executors inside every InputPartition) or raises
`OptionError` whose message names the option at fault, so a typo fails the query on the driver
with one clear line instead of a stack of executor retries. Checks that need the cluster (an
unknown topic, a pattern matching nothing) happen in the reader, which also names the option.

Names and defaults follow Spark's Kafka connector where one exists (startingOffsets,
endingOffsets, maxOffsetsPerTrigger, failOnDataLoss): a batch read defaults to earliest..latest,
a stream starts at latest.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping

import attrs

from pipeline.errors import OptionError
from pipeline.source_offsets import OffsetSpec, parse_offset_spec
from rmq.errors import ClientError
from rmq.message_selector import parse_tag_expression

__all__ = ["DEFAULT_GROUP", "OptionError", "ReaderOptions", "parse_reader_options"]

# The subscription group the broker sees for pulls when no consumerGroup is given (the broker
# auto-creates subscription groups, as it does for mqadmin's TOOLS_CONSUMER).
DEFAULT_GROUP = "TRIO_RMQ_SPARK_READER"


# lower-case key -> the spelling users write (Spark lower-cases nothing, but its dict is
# case-insensitive, so we compare lower-case and report the documented spelling)
_KNOWN = {
    k.lower(): k
    for k in (
        "namesrv",
        "topic",
        "topicPattern",
        "startingOffsets",
        "endingOffsets",
        "startingTimestamp",
        "maxOffsetsPerTrigger",
        "failOnDataLoss",
        "tags",
        "readFromSlave",
        "consumerGroup",
        "timeout",
        "pullBatchSize",
        "maxOffsetsPerPartition",
        "path",  # load() with a path: ignored by this source
    )
}


@attrs.frozen
class ReaderOptions:
    namesrv: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    starting: OffsetSpec = "earliest"
    ending: OffsetSpec = "latest"
    starting_timestamp: int | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    tags: str = "*"
    read_from_slave: bool = False
    consumer_group: str | None = None
    timeout: float = 3.0
    # maxMsgNums of each PULL_MESSAGE; the broker caps it further (maxTransferCount*)
    pull_batch_size: int = 1024
    # a queue range longer than this becomes several Spark partitions
    max_offsets_per_partition: int = 200_000

    @property
    def pull_group(self) -> str:
        return self.consumer_group or DEFAULT_GROUP

    @property
    def tag_set(self) -> frozenset[str] | None:
        """None = every tag; else the exact tags to keep (client-side re-check)."""
        return parse_tag_expression(self.tags)


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in ("true", "false"):
        return value == "true"
    raise OptionError(f"option {name}: expected true or false, got {raw!r}")


def _int(opts: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option {name}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {name}: must be >= {minimum}, got {value}")
    return value


def parse_reader_options(options: Mapping[str, str], *, streaming: bool) -> ReaderOptions:
    """Validate Spark's options for a batch (`streaming=False`) or streaming read."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    for key in opts:
        if key not in _KNOWN:
            close = difflib.get_close_matches(key, list(_KNOWN), n=1)
            hint = f" (did you mean {_KNOWN[close[0]]}?)" if close else ""
            raise OptionError(f"unknown option {key!r} for the rocketmq source{hint}")

    namesrv = opts.get("namesrv", "").strip()
    if not namesrv:
        raise OptionError(
            'option namesrv is required: the nameserver address, e.g. .option("namesrv", '
            '"127.0.0.1:9876")'
        )
    for addr in namesrv.split(";"):
        host, sep, port = addr.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise OptionError(f"option namesrv: {addr!r} is not host:port")

    topic = opts.get("topic")
    pattern = opts.get("topicpattern")
    if topic is not None and pattern is not None:
        raise OptionError("options topic and topicPattern are exclusive: give one of them")
    if topic is None and pattern is None:
        raise OptionError("option topic (a name or comma list) or topicPattern is required")
    topics: tuple[str, ...] = ()
    if topic is not None:
        topics = tuple(dict.fromkeys(t.strip() for t in topic.split(",") if t.strip()))
        if not topics:
            raise OptionError("option topic is empty")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option topicPattern: bad regular expression: {exc}") from None

    starting = parse_offset_spec(
        opts.get("startingoffsets", "latest" if streaming else "earliest"), "startingOffsets"
    )
    if "endingoffsets" in opts and streaming:
        raise OptionError("option endingOffsets is for batch reads only (not readStream)")
    ending = parse_offset_spec(opts.get("endingoffsets", "latest"), "endingOffsets")
    if ending == "earliest":
        raise OptionError("option endingOffsets: earliest is not allowed (use latest or JSON)")
    if isinstance(ending, dict) and any(v == -2 for v in ending.values()):
        raise OptionError("option endingOffsets: -2 (earliest) is not allowed as an end")

    ts = _int(opts, "startingTimestamp", minimum=0)
    if ts is not None and "startingoffsets" in opts:
        raise OptionError("options startingOffsets and startingTimestamp are exclusive")

    tags = opts.get("tags", "*")
    try:
        parse_tag_expression(tags)
    except ClientError:
        raise OptionError(
            f"option tags: bad tag expression {tags!r} (use 'A || B' or '*')"
        ) from None

    timeout_raw = opts.get("timeout")
    timeout = 3.0
    if timeout_raw is not None:
        try:
            timeout = float(timeout_raw)
        except ValueError:
            raise OptionError(f"option timeout: expected seconds, got {timeout_raw!r}") from None
        if not timeout > 0:
            raise OptionError(f"option timeout: must be > 0, got {timeout_raw!r}")

    group = opts.get("consumergroup")
    if group is not None and not re.fullmatch(r"[%|a-zA-Z0-9_-]{1,255}", group):
        raise OptionError(f"option consumerGroup: {group!r} is not a valid group name")

    return ReaderOptions(
        namesrv=namesrv,
        topics=topics,
        topic_pattern=pattern,
        starting=starting,
        ending=ending,
        starting_timestamp=ts,
        max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", minimum=1),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        tags=tags,
        read_from_slave=_bool(opts, "readFromSlave", False),
        consumer_group=group,
        timeout=timeout,
        pull_batch_size=_int(opts, "pullBatchSize", minimum=1) or 1024,
        max_offsets_per_partition=_int(opts, "maxOffsetsPerPartition", minimum=1) or 200_000,
    )
