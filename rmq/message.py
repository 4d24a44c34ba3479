"""What a producer sends: `Message`, and the client-side unique id (`UNIQ_KEY`).

Theory of operation: a `Message` is a plain user value (topic, body, tags, keys, user properties,
delay level). Nothing about it is wire-specific until `wire_properties` turns it into the property
map RocketMQ stores (`common/message/MessageConst.java`): TAGS, KEYS (space-joined), DELAY, WAIT and
the user's own keys. The producer adds UNIQ_KEY right before sending, so a re-sent or retried
message keeps the id it got on its first attempt only if the caller put one there.

`UniqueIdGenerator` is `common/message/MessageClientIDSetter.java`: 32 upper-case hex characters = a
10-byte fixed prefix (IPv4 address, 2-byte pid, 4-byte per-process "class loader hash") and a 6-byte
suffix (milliseconds since the start of the current month as a signed int, and a 2-byte wrapping
counter). Brokers only store and index it; real clients show it as `msgId`.

The send path runs once per message, so it is kept cheap: `Message` converts its fields when
it is made (not on every later assignment: the producer normalises body and keys again when it
sends), topic checks are cached per topic name, `wire_properties_string` builds header `i`
directly in the common case (no user properties), and the UNIQ_KEY suffix is two hex
formats of plain integers.
"""

from __future__ import annotations

import datetime
import functools
import itertools
import os
import random
import socket
import struct
import time
from collections.abc import Iterable

import attrs

from rmq.errors import InvalidMessageError

# Property keys (MessageConst.java). Kept local so `rmq` stays importable without the store codec.
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
# RocketMQ 5 timers: deliver at an absolute epoch ms, or after a delay from the broker's now
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"

# Keys a user may not set through `properties=`: the client or the broker owns them.
RESERVED_PROPERTIES = frozenset(
    {
        PROPERTY_TAGS,
        PROPERTY_KEYS,
        PROPERTY_DELAY_TIME_LEVEL,
        PROPERTY_WAIT_STORE_MSG_OK,
        "TRAN_MSG",
        "PGROUP",
        "MIN_OFFSET",
        "MAX_OFFSET",
        "BUYER_ID",
        "ORIGIN_MESSAGE_ID",
        "TRANSFER_FLAG",
        "CORRECTION_FLAG",
        "MQ2_FLAG",
        "RECONSUME_TIME",
        "MSG_REGION",
        "TRACE_ON",
        "MAX_RECONSUME_TIMES",
        "CONSUME_START_TIME",
        "REAL_TOPIC",
        "REAL_QID",
        "RETRY_TOPIC",
        "CLUSTER",
    }
)

MAX_DELAY_LEVEL = 18  # "1s 5s ... 2h": the broker's default messageDelayLevel has 18 levels
MAX_PROPERTIES_BYTES = 32767  # the record stores the properties length as a short


def _body_bytes(body: bytes | bytearray | memoryview | str) -> bytes:
    if body.__class__ is bytes:
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return bytes(body)


def _keys_str(keys: str | Iterable[str] | None) -> str | None:
    if keys is None:
        return None
    if isinstance(keys, str):
        return keys or None
    joined = " ".join(k for k in keys if k)
    return joined or None


def _properties_dict(properties: dict[str, str] | None) -> dict[str, str]:
    return dict(properties) if properties else {}


def _epoch_ms(at: datetime.datetime | int | None) -> int | None:
    """A deliver time as epoch ms: an int is taken as epoch ms already; a naive datetime is
    local time, as ``datetime.timestamp`` reads it."""
    if at is None or isinstance(at, int):
        return at
    return int(at.timestamp() * 1000)


@functools.lru_cache(maxsize=1024)
def _topic_problem(topic: str) -> str | None:
    """Why no broker would take `topic` (None: fine). Cached: a producer sends to few topics."""
    if not topic:
        return "topic is empty"
    if len(topic) > 127:
        return f"topic is longer than 127 characters: {topic[:40]}..."
    if not all(c.isascii() and (c.isalnum() or c in "%|_-") for c in topic):
        return f"topic {topic!r} has characters outside [%|a-zA-Z0-9_-]"
    return None


@functools.lru_cache(maxsize=1024)
def _tags_part(tags: str | None) -> str:
    """``TAGS\\x01<tags>\\x02`` of header `i` ("" without tags); cached: tags repeat."""
    if not tags:
        return ""
    if "\x01" in tags or "\x02" in tags:
        raise InvalidMessageError("tags contain \\x01 or \\x02")
    return f"TAGS\x01{tags}\x02"


def _wire_tail(delay_level: int, wait_store_ok: bool) -> str:
    """DELAY and WAIT of header `i`, then the UNIQ_KEY name: the value is appended last."""
    delay = f"DELAY\x01{delay_level}\x02" if delay_level > 0 else ""
    return f"{delay}WAIT\x01{'true' if wait_store_ok else 'false'}\x02UNIQ_KEY\x01"


_WIRE_TAILS = {(d, w): _wire_tail(d, w) for d in range(MAX_DELAY_LEVEL + 1) for w in (True, False)}


# Fields are converted when a Message is made; a later assignment is stored as given (no
# per-field __setattr__ hook: it made every construction ~3x slower) and the producer
# normalises body and keys again when it sends.
@attrs.define(eq=True, on_setattr=attrs.setters.NO_OP)
class Message:
    """A message to send. `body` may be bytes or str (UTF-8); `keys` a str or a list of str."""

    topic: str
    body: bytes = attrs.field(converter=_body_bytes)
    tags: str | None = None
    keys: str | None = attrs.field(default=None, converter=_keys_str)
    properties: dict[str, str] = attrs.field(default=None, converter=_properties_dict)
    delay_level: int = 0
    flag: int = 0
    # WAIT=true asks the broker to answer only after the store is done (RocketMQ default).
    wait_store_ok: bool = True
    # RocketMQ 5 timer message (a 5.x broker, or trio-rmq's): delivered at this time (epoch ms,
    # or a datetime) or after `delay` seconds, to the second, up to the broker's
    # timerMaxDelaySec (3 days by default); sent as TIMER_DELIVER_MS / TIMER_DELAY_MS
    deliver_at: int | None = attrs.field(default=None, converter=_epoch_ms)
    delay: float | None = None

    def validate(self) -> None:
        """Raise InvalidMessageError for what no broker would accept.

        The broker's checks are ``AbstractSendMessageProcessor.msgCheck`` and
        ``DefaultMessageStore.checkMessage`` in RocketMQ 4.9.
        """
        problem = _topic_problem(self.topic)
        if problem is not None:
            raise InvalidMessageError(problem)
        if not self.body:
            raise InvalidMessageError("message body is empty")
        if not 0 <= self.delay_level <= MAX_DELAY_LEVEL:
            raise InvalidMessageError(f"delay_level must be 0..{MAX_DELAY_LEVEL}")
        timed = (self.deliver_at is not None) + (self.delay is not None) + (self.delay_level > 0)
        if timed > 1:
            raise InvalidMessageError("set at most one of deliver_at, delay and delay_level")
        if self.delay is not None and self.delay < 0:
            raise InvalidMessageError("delay must not be negative")
        for key, value in self.properties.items():
            if key in RESERVED_PROPERTIES:
                raise InvalidMessageError(f"property {key!r} is reserved")
            for part in (key, value):
                if "\x01" in part or "\x02" in part:
                    raise InvalidMessageError(f"property {key!r} contains \\x01 or \\x02")

    def wire_properties(self) -> dict[str, str]:
        """The property map sent in header `i` (without UNIQ_KEY unless the user set one)."""
        props = dict(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        if self.keys:
            props[PROPERTY_KEYS] = self.keys
        if self.delay_level > 0:
            props[PROPERTY_DELAY_TIME_LEVEL] = str(self.delay_level)
        if self.deliver_at is not None:
            props[PROPERTY_TIMER_DELIVER_MS] = str(self.deliver_at)
        if self.delay is not None:
            props[PROPERTY_TIMER_DELAY_MS] = str(round(self.delay * 1000))
        props[PROPERTY_WAIT_STORE_MSG_OK] = "true" if self.wait_store_ok else "false"
        return props

    def wire_properties_string(self, uniq_key: str) -> tuple[str, str]:
        """(header `i`, UNIQ_KEY): `wire_properties()` plus UNIQ_KEY=`uniq_key` unless the user
        set one, encoded as ``k\\x01v\\x02...`` (`common.message.encode_properties`).

        Call `validate()` first. Tags or keys holding a separator raise InvalidMessageError.
        """
        if not self.properties and self.deliver_at is None and self.delay is None:
            # the common case, without a dict: same keys in the same order as below
            keys = self.keys
            if keys:
                if keys.__class__ is not str:
                    keys = _keys_str(keys) or ""
                if "\x01" in keys or "\x02" in keys:
                    raise InvalidMessageError("keys contain \\x01 or \\x02")
                keys = f"KEYS\x01{keys}\x02" if keys else ""
            tail = _WIRE_TAILS.get((self.delay_level, self.wait_store_ok))
            if tail is None:
                tail = _wire_tail(self.delay_level, self.wait_store_ok)
            return f"{_tags_part(self.tags)}{keys or ''}{tail}{uniq_key}", uniq_key
        props = self.wire_properties()
        if props.get(PROPERTY_UNIQ_KEY):
            uniq_key = props[PROPERTY_UNIQ_KEY]
        else:
            props[PROPERTY_UNIQ_KEY] = uniq_key
        parts = [f"{k}\x01{v}" for k, v in props.items() if v is not None]
        s = "\x02".join(parts)
        # one C-level scan each: exactly one \x01 per pair and \x02 only between pairs
        if s.count("\x01") != len(parts) or s.count("\x02") != len(parts) - 1:
            raise InvalidMessageError("tags, keys or a property contain \\x01 or \\x02")
        return s, uniq_key


# The size limit counts the CommitLog record, not the body. A broker refuses a put whose
# records exceed maxMessageSize (4 MiB by default) with MESSAGE_ILLEGAL (code 13): RocketMQ's
# CommitLog compares calMsgLength (the whole record) with it, and for a batch the sum of the
# records. Java's client checks only the body, so a body just under 4 MiB passes it and is
# refused by the broker. Ours computes the record the broker will write:
#   91 fixed bytes (IPv4 born and store hosts) + body + topic + stored properties,
# where the stored properties are those sent in header `i` without WAIT (the broker keeps it in
# memory only) and with CLUSTER=<the broker's cluster name> added.
RECORD_FIXED_BYTES = 91
_CLUSTER_NAME = "CLUSTER\x01"


def stored_record_size(topic: str, body_len: int, wire_props: str, cluster: str) -> int:
    """Bytes of the CommitLog record a broker of `cluster` writes for one message sent to
    `topic` with a body of `body_len` bytes and header `i` = `wire_props`."""
    n = len(wire_props) if wire_props.isascii() else len(wire_props.encode("utf-8"))
    wait = _wait_segment(wire_props)
    if wait:
        n -= wait + (1 if n > wait else 0)  # the pair and one separator, if any
    tail = len(_CLUSTER_NAME) + len(cluster.encode("utf-8"))
    props = n + 1 + tail if n else tail
    top = len(topic) if topic.isascii() else len(topic.encode("utf-8"))
    return RECORD_FIXED_BYTES + body_len + top + props


def record_size_bound(topic: str, body_len: int, wire_props: str) -> int:
    """A bound, never below `stored_record_size(topic, body_len, wire_props, "")`, from the
    lengths alone: at most 4 UTF-8 bytes a character, WAIT only ever left out, CLUSTER's key
    and separators 9. A message under it needs no exact size (the send path, issue 28)."""
    return (
        RECORD_FIXED_BYTES + body_len + 4 * (len(topic) + len(wire_props)) + len(_CLUSTER_NAME) + 1
    )


def stored_batch_record_size(
    topic: str, body_len: int, wire_props: str, batch_props: str, cluster: str
) -> int:
    """Bytes of the CommitLog record a broker of `cluster` writes for one message of a batch
    sent with header `i` = `batch_props`: the message's own properties as sent, a separator
    unless they end with one, then the batch's with CLUSTER added (Java's
    MessageExtBatchEncoder; nothing is removed, WAIT included)."""
    own = len(wire_props.encode("utf-8"))
    batch = len(batch_props.encode("utf-8"))
    tail = len(_CLUSTER_NAME) + len(cluster.encode("utf-8"))
    batch = batch + 1 + tail if batch else tail
    sep = 1 if own and not wire_props.endswith("\x02") else 0
    top = len(topic.encode("utf-8"))
    return RECORD_FIXED_BYTES + body_len + top + own + sep + batch


def _wait_segment(props: str) -> int:
    """Length in bytes of the `WAIT\x01<value>` pair of `props`, 0 when there is none."""
    if props.startswith("WAIT\x01"):
        start = 0
    else:
        start = props.find("\x02WAIT\x01") + 1
        if start == 0:
            return 0
    end = props.find("\x02", start)
    return (len(props) if end < 0 else end) - start


def check_record_size(size: int, limit: int, what: str = "message") -> None:
    """Raise InvalidMessageError when a record (or a batch's records) of `size` bytes is more
    than a broker with maxMessageSize = `limit` stores."""
    if size > limit:
        raise InvalidMessageError(
            f"{what} too large: the broker would store {size} bytes (body, topic and "
            f"properties), which exceeds its maxMessageSize {limit}"
        )


# TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODYLEN of one message of a batch body
# (MessageDecoder.encodeMessage)
_BATCH_HEAD = struct.Struct(">iiiii")
_PROPS_LEN = struct.Struct(">h")


def encode_batch_body(items: Iterable[tuple[int, bytes, str]]) -> bytes:
    """SEND_BATCH_MESSAGE body of (flag, body, header-`i` properties string) per message.

    Byte for byte `common.message.encode_batch_body` given the decoded properties, without
    the dict round trip (the producer has the properties as a string already). MAGICCODE and
    BODYCRC are 0: the broker does not read them.
    """
    parts: list[bytes] = []
    add = parts.extend
    head, props_len = _BATCH_HEAD.pack, _PROPS_LEN.pack
    for flag, body, props in items:
        props_b = props.encode("utf-8")
        n = len(props_b)
        if n > MAX_PROPERTIES_BYTES:
            raise InvalidMessageError(
                f"batch message properties are {n} bytes, max {MAX_PROPERTIES_BYTES}"
            )
        add((head(20 + len(body) + 2 + n, 0, 0, flag, len(body)), body, props_len(n), props_b))
    return b"".join(parts)


def _local_ipv4() -> bytes:
    """The address the Java client would pick; loopback when the host has no routable one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            # connect() on UDP sends nothing; it only asks the kernel for a source address.
            s.connect(("10.255.255.255", 1))
            return socket.inet_aton(s.getsockname()[0])
    except OSError:
        return socket.inet_aton("127.0.0.1")


def _month_start_ms(now_ms: int) -> int:
    now = datetime.datetime.fromtimestamp(now_ms / 1000)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return int(start.timestamp() * 1000)


@attrs.define(eq=False)
class UniqueIdGenerator:
    """MessageClientIDSetter: one per process is enough (the counter makes ids unique)."""

    ip: bytes = attrs.field(factory=_local_ipv4)
    pid: int = attrs.field(factory=os.getpid)
    # Java uses the class loader's identity hash; any per-process random int plays that role.
    loader_hash: int = attrs.field(factory=lambda: random.getrandbits(31))
    # (month_start_ms, next_month_start_ms): ids carry ms since month start, as a signed int.
    _window: tuple[int, int] = attrs.field(default=(0, 0), init=False)
    # counter wraps at 2**16 like the Java short; it only disambiguates ids of one millisecond.
    _counter: itertools.count = attrs.field(factory=itertools.count, init=False)
    # hex of ip + pid + loader_hash: the same for every id of this generator
    _prefix: str = attrs.field(default="", init=False)

    def __attrs_post_init__(self) -> None:
        self._prefix = (
            (self.ip + struct.pack(">hi", _signed16(self.pid), self.loader_hash)).hex().upper()
        )

    def _month_start(self, now_ms: int) -> int:
        start, end = self._window
        if not start <= now_ms < end:
            start = _month_start_ms(now_ms)
            end = _month_start_ms(start + 32 * 86_400_000)
            self._window = (start, end)
        return start

    def create(self, now_ms: int | None = None) -> str:
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        elapsed = now_ms - self._month_start(now_ms)
        # upper-case hex of the signed int and short, i.e. of their low 32 and 16 bits
        return f"{self._prefix}{elapsed & 0xFFFFFFFF:08X}{next(self._counter) & 0xFFFF:04X}"

    def create_many(self, n: int, now_ms: int | None = None) -> list[str]:
        """`n` ids of one millisecond, as `n` calls of `create` within it would give."""
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        head = f"{self._prefix}{(now_ms - self._month_start(now_ms)) & 0xFFFFFFFF:08X}"
        counter = self._counter
        return [f"{head}{next(counter) & 0xFFFF:04X}" for _ in range(n)]


def _signed16(n: int) -> int:
    n &= 0xFFFF
    return n - 0x10000 if n >= 0x8000 else n


@attrs.frozen
class UniqueIdInfo:
    """What an IPv4 UNIQ_KEY tells (MessageClientIDSetter.getIPStrFromID / ...NearlyTime...)."""

    ip: str
    pid: int
    ms_since_month_start: int
    counter: int


def parse_unique_id(uid: str) -> UniqueIdInfo:
    raw = bytes.fromhex(uid)
    if len(raw) != 16:
        raise ValueError(f"not an IPv4 UNIQ_KEY: {uid!r}")
    pid, _hash, ms, counter = struct.unpack(">HiiH", raw[4:])
    return UniqueIdInfo(socket.inet_ntoa(raw[:4]), pid, ms, counter)


_default_generator: UniqueIdGenerator | None = None


def default_generator() -> UniqueIdGenerator:
    """The process-wide generator (made on first use: it asks the kernel for an address)."""
    global _default_generator
    if _default_generator is None:
        _default_generator = UniqueIdGenerator()
    return _default_generator


def create_unique_id() -> str:
    """A fresh UNIQ_KEY from the process-wide generator."""
    return default_generator().create()
