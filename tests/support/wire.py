"""For tests that speak the wire to a broker process themselves: :func:`send_v2` builds a plain
SEND_MESSAGE_V2, :func:`topic_fields` an UPDATE_AND_CREATE_TOPIC header, :func:`wait_serving` waits for a broker process to serve
(:func:`wait_node_serving` for one started as a ``tests.conftest.Node``), :func:`read_answers`
reads answers off a raw stream by opaque; :func:`command_fields` compares decoded commands."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from common.remoting.client import RemotingClient
from common.remoting.codec import FrameDecoder
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand

if TYPE_CHECKING:
    from tests.conftest import Node


def command_fields(cmd: RemotingCommand) -> tuple[Any, ...]:
    """Every field of ``cmd`` with its type, for comparing two commands (RemotingCommand
    compares by identity; a bool is an int that compares equal to one)."""
    values = (
        cmd.code,
        cmd.language,
        cmd.version,
        cmd.opaque,
        cmd.flag,
        cmd.remark,
        cmd.ext_fields,
        cmd.body,
        cmd.serialize_type,
    )
    return tuple((type(v), v) for v in values)


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


def topic_fields(topic: str, **extra: object) -> dict[str, object]:
    """The UPDATE_AND_CREATE_TOPIC header mqadmin sends for ``topic``: 2 read and 2 write
    queues, read-write; ``extra`` adds or overrides fields (``attributes``, ``perm``...)."""
    return {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": 2,
        "writeQueueNums": 2,
        "perm": 6,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0,
        "order": False,
        **extra,
    }


async def wait_serving(
    client: RemotingClient,
    addr: str,
    proc: subprocess.Popen[bytes] | None = None,
    *,
    timeout: float = 30.0,
    exited: Callable[[], str] = lambda: "the broker exited while starting",
) -> None:
    """Until the broker at ``addr`` answers (GET_BROKER_RUNTIME_INFO: it serves once its store
    recovered); a ``proc`` that exits meanwhile fails the wait at once, saying ``exited()``."""
    with trio.fail_after(timeout):
        while True:
            assert proc is None or proc.poll() is None, exited()
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


async def wait_node_serving(client: RemotingClient, node: Node, *, timeout: float = 30.0) -> None:
    """`wait_serving` for a broker ``Node``: when it exits, the failure shows its log's tail."""
    await wait_serving(
        client,
        node.addr,
        node.proc,
        timeout=timeout,
        exited=lambda: f"{node.name} exited:\n{node.log_tail()}",
    )


async def read_answers(stream: trio.abc.Stream, count: int) -> dict[int, RemotingCommand]:
    """``count`` frames read off ``stream``, by opaque (a raw client's view of its answers)."""
    decoder = FrameDecoder()
    got: dict[int, RemotingCommand] = {}
    while len(got) < count:
        data = await stream.receive_some(65536)
        assert data, "EOF"
        for cmd in decoder.feed(data):
            got[cmd.opaque] = cmd
    return got
