"""Reading one queue of a broker back, record by record, as the chaos harness's checker does.

Plain PULLs from offset 0 with no suspend and no commit: what a broker holds, not what a
consumer group would be handed, with every record's body CRC checked.
"""

from __future__ import annotations

from collections.abc import Collection

from common.message import MessageExt, decode_records
from common.remoting.client import RemotingClient
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand


async def pull_queue(
    client: RemotingClient,
    addr: str,
    topic: str,
    queue_id: int,
    *,
    group: str = "check",
    ends: Collection[int] | None = None,
    skip: Collection[int] = (),
    start: int = 0,
) -> list[MessageExt]:
    """Every record of one queue from offset 0 on, by plain PULLs (no suspend, no commit):
    how a test or the chaos harness reads back what a broker holds.

    By default any answer but SUCCESS ends the read quietly.  With ``ends``, the read may end
    only on one of those codes: any other, or a SUCCESS whose nextBeginOffset does not move on,
    fails it (AssertionError).  An answer with a code in ``skip`` (PULL_RETRY_IMMEDIATELY: the
    records there were removed under the read) moves the read on to its nextBeginOffset.  ``start``: the first queue offset read (a queue's
    min offset, once retention moved it)."""
    out: list[MessageExt] = []
    offset = start
    while True:
        r = await client.invoke(
            addr,
            RemotingCommand.request(
                RequestCode.PULL_MESSAGE,
                {"consumerGroup": group, "topic": topic, "queueId": queue_id}
                | {"queueOffset": offset, "maxMsgNums": 32, "sysFlag": 4, "commitOffset": 0}
                | {"suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0},
            ),
            timeout=10,
        )
        if r.code == ResponseCode.SUCCESS:
            out.extend(decode_records(r.body_bytes(), check_crc=True))
        elif r.code not in skip:
            if ends is not None and r.code not in ends:
                raise AssertionError(f"pull at {offset} answered {r.code}: {r.remark}")
            return out
        nxt = int(r.ext_fields["nextBeginOffset"])
        if nxt <= offset:
            if ends is not None and r.code == ResponseCode.SUCCESS:
                raise AssertionError(f"pull at {offset} found records but moved on to {nxt}")
            return out
        offset = nxt
