"""``send_header``: SEND_MESSAGE_V2's one-letter fields under their long names, the short ones
kept, a SEND_MESSAGE header as it came; ``plain_send_v2``: the same values in one step, or
nothing where the general reading refuses the header or it is a batch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.processor.send_header import (
    V2_NAMES,
    header_bool,
    header_int,
    plain_send_v2,
    send_header,
)
from common.errors import RequestError
from common.remoting.codes import RequestCode
from common.remoting.command import RemotingCommand, stringify_fields
from rmq.client_api import ClientAPI


@pytest.mark.timeout(10)
def test_v2_fields_get_their_long_names() -> None:
    ext = {"a": "pg", "b": "T", "e": "3", "i": "K\x01V", "z": "other", "topic": "shadowed"}
    for code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        h = send_header(RemotingCommand(code=int(code), ext_fields=dict(ext)))
        expected = dict(ext)
        expected.update({V2_NAMES[k]: v for k, v in ext.items() if k in V2_NAMES})
        assert h == expected
        assert h["topic"] == "T" and h["queueId"] == "3" and h["b"] == "T"
    # any code: short names without a long topic are a V2 header
    h = send_header(RemotingCommand(code=int(RequestCode.SEND_MESSAGE), ext_fields={"b": "T"}))
    assert h == {"b": "T", "topic": "T"}
    v1 = {"topic": "T", "queueId": "1"}
    assert send_header(RemotingCommand(code=int(RequestCode.SEND_MESSAGE), ext_fields=v1)) is v1


# each field of a V2 send, absent or as the values the general reading treats differently
_VALUES: dict[str, tuple[str | None, ...]] = {
    "b": (None, "", "T"),
    "e": (None, "", "3", "-1", " 7", "2147483648", "x"),
    "i": (None, "", "K\x01V"),
    "h": (None, "", "5", "-2147483649", "1.5"),
    "f": (None, "", "0", "2147483647"),
    "g": (None, "", "1764412345678", "9223372036854775808", "-9223372036854775808"),
    "j": (None, "", "2", "nope"),
    "m": (None, "false", "TRUE", "1"),
}
# a long name a V2 header may carry instead of (or beside) its short one
_LONG = {"e": "queueId", "i": "properties", "h": "flag", "f": "sysFlag", "j": "reconsumeTimes"}


def _general(req: RemotingCommand) -> tuple[object, ...] | str:
    """What the general reading stores the send with, or why it refuses it."""
    h = send_header(req)
    try:
        topic = h.get("topic")
        if not topic:
            return "no topic"
        queue_id = header_int(h, "queueId")
        if header_bool(h, "batch"):
            return "batch"
        return (
            topic,
            queue_id,
            h.get("properties") or "",
            header_int(h, "flag", 0),
            header_int(h, "sysFlag", 0),
            header_int(h, "bornTimestamp", 0, long=True),
            header_int(h, "reconsumeTimes", 0),
        )
    except RequestError as exc:
        return exc.remark


def _headers() -> Iterator[dict[str, str]]:
    base = {"a": "pg", "b": "T", "e": "1", "i": "K\x01V", "h": "0", "f": "0", "g": "1", "j": "0"}
    for key, values in _VALUES.items():
        for v in values:
            ext = dict(base)
            if v is None:
                ext.pop(key, None)
            else:
                ext[key] = v
            yield ext
            long = _LONG.get(key)
            if long is not None:
                for lv in ("9", "bad", ""):
                    yield {**ext, long: lv}


@pytest.mark.timeout(10)
def test_plain_send_v2_reads_what_the_general_reading_does() -> None:
    seen_plain = seen_general = 0
    for ext in _headers():
        req = RemotingCommand(code=int(RequestCode.SEND_MESSAGE_V2), ext_fields=ext)
        plain = plain_send_v2(req)
        general = _general(req)
        if plain is None:
            seen_general += 1
            # what it leaves is what the general reading refuses, a batch, or a header without
            # one of the fields a producer sends (the general reading has a default, or takes
            # the long name)
            usual = all(ext.get(k) for k in "beihfgj")
            assert isinstance(general, str) or not usual, (ext, general)
        else:
            seen_plain += 1
            assert plain == general, ext
    assert seen_plain > 20 and seen_general > 10


@pytest.mark.timeout(10)
def test_the_producers_header_takes_the_one_step_reading() -> None:
    header = stringify_fields(
        ClientAPI.send_header(
            group="pg", topic="T", queue_id=2, properties={"K": "V"}, born_timestamp=17
        )
    )
    req = RemotingCommand(code=int(RequestCode.SEND_MESSAGE_V2), ext_fields=header)
    assert plain_send_v2(req) == ("T", 2, "K\x01V", 0, 0, 17, 0)


@pytest.mark.timeout(10)
def test_plain_send_v2_leaves_other_codes() -> None:
    ext = {"b": "T", "e": "1"}
    for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_BATCH_MESSAGE):
        assert plain_send_v2(RemotingCommand(code=int(code), ext_fields=dict(ext))) is None
    full = {**ext, "i": "", "h": "0", "f": "0", "g": "0", "j": "0"}
    assert plain_send_v2(
        RemotingCommand(code=int(RequestCode.SEND_MESSAGE_V2), ext_fields=full)
    ) == ("T", 1, "", 0, 0, 0, 0)
