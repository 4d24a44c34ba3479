"""``send_header``: SEND_MESSAGE_V2's one-letter fields under their long names, the short ones
kept, a SEND_MESSAGE header as it came."""

from __future__ import annotations

import pytest

from broker.processor.send_header import V2_NAMES, send_header
from common.remoting.codes import RequestCode
from common.remoting.command import RemotingCommand


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
