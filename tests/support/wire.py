"""For tests that speak the wire to a broker process themselves: :func:`send_v2` builds a plain
SEND_MESSAGE_V2, :func:`wait_serving` waits for a broker process to serve."""

from __future__ import annotations

import subprocess

import trio

from common.remoting.client import RemotingClient
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand


def send_v2(
    topic: str, queue_id: int, body: bytes, *, group: str = "pg", queues: int = 4
) -> RemotingCommand:
    """A SEND_MESSAGE_V2 of ``body`` to one queue of ``topic``, with no properties, as a
    producer of ``group`` sends it (the topic is created with ``queues`` queues if missing)."""
    return RemotingCommand.request(
        RequestCode.SEND_MESSAGE_V2,
        {"a": group, "b": topic, "c": "TBW102", "d": queues, "e": queue_id}
        | {"f": 0, "g": 0, "h": 0, "i": ""},
        body,
    )


async def wait_serving(
    client: RemotingClient,
    addr: str,
    proc: subprocess.Popen[bytes] | None = None,
    *,
    timeout: float = 30.0,
) -> None:
    """Until the broker at ``addr`` answers (GET_BROKER_RUNTIME_INFO: it serves once its store
    recovered); a ``proc`` that exits meanwhile fails the wait at once."""
    with trio.fail_after(timeout):
        while True:
            assert proc is None or proc.poll() is None, "the broker exited while starting"
            try:
                r = await client.invoke(
                    addr,
                    RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}),
                    timeout=1.0,
                )
                if r.code == ResponseCode.SUCCESS:
                    return
            except Exception:
                client.close_channel(addr)
            await trio.sleep(0.05)
