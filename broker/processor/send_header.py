"""The SEND header (RocketMQ ``SendMessageRequestHeader`` / ``SendMessageRequestHeaderV2``).

SEND_MESSAGE carries long names (``topic``, ``queueId``...); SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE
carry the one-letter names ``a``..``n``
(``common/protocol/header/SendMessageRequestHeaderV2.java``).  :func:`send_header` gives both under
the long names, and :func:`header_int` / :func:`header_bool` read a field with the errors Java's
header decoding answers (SYSTEM_ERROR, "the custom field <x> is null").
"""

from __future__ import annotations

from common.errors import RequestError
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand

# SendMessageRequestHeaderV2 one-letter names -> SendMessageRequestHeader names
V2_NAMES = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
    "n": "bname",
}


# read once per send: plain ints (a member of an IntEnum class costs an attribute lookup on the
# enum class each time) and the name pairs as a tuple
_V2_CODES = frozenset(
    int(c)
    for c in (
        RequestCode.SEND_MESSAGE_V2,
        RequestCode.SEND_BATCH_MESSAGE,
        RequestCode.SEND_REPLY_MESSAGE_V2,
    )
)
_V2_ITEMS = tuple(V2_NAMES.items())
_ABSENT = object()


def send_header(req: RemotingCommand) -> dict[str, str]:
    """The request's header under the long (SendMessageRequestHeader) names."""
    ext = req.ext_fields
    if req.code in _V2_CODES or ("b" in ext and "topic" not in ext):
        out = dict(ext)
        get = ext.get
        for short, name in _V2_ITEMS:
            v = get(short, _ABSENT)
            if v is not _ABSENT:
                out[name] = v  # type: ignore[assignment]  # (a str: it came from ext)
        return out
    return ext


# the Java header fields' ranges (int, long): RocketMQ's header decoding refuses the rest
_INT32 = 1 << 31
_INT64 = 1 << 63


def header_int(
    h: dict[str, str], name: str, default: int | None = None, *, long: bool = False
) -> int:
    """The field as an int (a Java int, or a long with ``long``); ``default`` when it is absent
    or empty (an error without one).  A value out of its Java range is refused like one that is
    not a number: RocketMQ's header decoding fails on both, and it would not fit the record."""
    v = h.get(name)
    if v is None or v == "":
        if default is None:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"the custom field <{name}> is null")
        return default
    try:
        n = int(v)
    except ValueError:
        n = None
    bound = _INT64 if long else _INT32
    if n is None or not -bound <= n < bound:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR,
            f"the custom field <{name}> is not a Java {'long' if long else 'int'}: {v[:40]!r}",
        )
    return n


def header_bool(h: dict[str, str], name: str) -> bool:
    v = h.get(name)
    return v is not None and v.lower() in ("true", "1")


_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)

# What plain_send_v2 gives: topic, queueId, properties, flag, sysFlag, bornTimestamp,
# reconsumeTimes
PlainSend = tuple[str, int, str, int, int, int, int]


def plain_send_v2(req: RemotingCommand) -> PlainSend | None:
    """The fields a single (not batch) SEND_MESSAGE_V2 is stored with, read from its one-letter
    names in one step, when each of them is there and well-formed (what Java's producer and ours
    send); None for anything else.

    Every send comes through here (issue 28): the general reading, ``send_header``'s dict under
    the long names then one ``header_int`` per field, is ~2 us of a send's ~25 on the master.
    When this gives a tuple, the general reading gives the same values and raises nothing; when
    it gives None, the general reading runs and answers what it answers, in its own order (a
    field left out, or named by its long name, takes its default or that value there).
    """
    if req.code != _SEND_V2:
        return None
    get = req.ext_fields.get
    topic = get("b")
    queue_id = get("e")
    props = get("i")
    flag = get("h")
    sys_flag = get("f")
    born = get("g")
    reconsume = get("j")
    batch = get("m")
    if (
        not topic
        or props is None
        or queue_id is None
        or flag is None
        or sys_flag is None
        or born is None
        or reconsume is None
        or (batch is not None and batch.lower() in ("true", "1"))
    ):
        return None
    try:
        q, f, s, g, j = int(queue_id), int(flag), int(sys_flag), int(born), int(reconsume)
    except ValueError:
        return None  # (an empty field too: the general reading's default)
    if not (
        -_INT32 <= q < _INT32
        and -_INT32 <= f < _INT32
        and -_INT32 <= s < _INT32
        and -_INT64 <= g < _INT64
        and -_INT32 <= j < _INT32
    ):
        return None
    return (topic, q, props, f, s, g, j)


__all__ = [
    "V2_NAMES",
    "PlainSend",
    "header_bool",
    "header_int",
    "plain_send_v2",
    "send_header",
]
