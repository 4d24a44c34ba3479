"""SEND requests that one read delivers go to the file store as a group (``send_run``,
``append_message_group``): CommitLog order and queue offsets are arrival order, a bad request in
a run is answered alone, and a SYNC_MASTER answer still waits for its own replica ack."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.ha.service import HAService
from broker.processor.send import SendMessageProcessor
from broker.store import MessageStoreConfig, PutMessageStatus, run_message_store
from common.batch_body import encode_batch_body
from common.message import decode_records
from common.message_properties import encode_properties
from common.remoting.codec import encode
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.server import RequestDispatcher, handle_stream
from tests.support.replica import FakeHA
from tests.support.wire import read_answers

TOPIC = "RunTopic"


async def make_broker(nursery: trio.Nursery, tmp_path: Path, role: str) -> BrokerController:
    store_cfg = MessageStoreConfig(store_path_root_dir=tmp_path, max_message_size=512)
    cfg = BrokerConfig(listen_port=10911, store=store_cfg)
    store = await nursery.start(run_message_store, cfg.store)
    store.broker_role = role
    b = BrokerController(cfg, store)
    b.load()
    return b


def send(i: int, queue_id: int, body: bytes, *, batch: bool = False) -> bytes:
    ext: dict[str, object] = {
        "a": "pg",
        "b": TOPIC,
        "c": "TBW102",
        "d": 2,
        "e": queue_id,
        "f": 0,
        "g": 1700000000000,
        "h": 0,
        "i": encode_properties({"UNIQ_KEY": f"U{i:08d}", "WAIT": "true"}),
        "j": 0,
    }
    code = RequestCode.SEND_MESSAGE_V2
    if batch:
        ext["m"] = "true"
        code = RequestCode.SEND_BATCH_MESSAGE
        body = encode_batch_body((0, body + b"-%d" % k, {"UNIQ_KEY": f"B{i}-{k}"}) for k in (0, 1))
    cmd = RemotingCommand.request(code, ext, body)
    cmd.opaque = i + 1
    return encode(cmd)


async def serve(nursery: trio.Nursery, b: BrokerController) -> tuple[trio.abc.Stream, list[int]]:
    """A connection to the broker's SEND processor (in memory), and the sizes of the groups its
    store was given."""
    d = RequestDispatcher()
    SendMessageProcessor(b).register(d)
    groups: list[int] = []
    store: Any = b.store
    group = store.append_message_group

    def spy(msgs: list[Any]) -> Any:
        groups.append(len(msgs))
        return group(msgs)

    store.append_message_group = spy
    client, server = trio.testing.memory_stream_pair()
    nursery.start_soon(lambda: handle_stream(server, d))
    return client, groups


@pytest.mark.timeout(30)
async def test_a_run_keeps_arrival_order_and_answers_bad_requests_alone(
    autojump_clock: Any, tmp_path: Path
) -> None:
    async with trio.open_nursery() as n:
        b = await make_broker(n, tmp_path, "ASYNC_MASTER")
        client, groups = await serve(n, b)
        frames = [send(0, 0, b"first")]  # creates the topic (2 queues), answered alone
        bodies = {0: b"first"}
        for i in range(1, 13):
            body = b"m%02d" % i
            if i == 4:
                frames.append(send(i, 7, body))  # no queue 7: refused by msg_check
            elif i == 6:
                frames.append(send(i, 0, b"x" * 600))  # over maxMessageSize: refused
            elif i == 9:
                frames.append(send(i, 1, body, batch=True))  # a batch in the middle of a run
            else:
                frames.append(send(i, i % 2, body))
                bodies[i] = body
        with trio.fail_after(10):
            await client.send_all(frames[0])
            await read_answers(client, 1)
            await client.send_all(b"".join(frames[1:]))  # one read on the server side
            got = await read_answers(client, 12)
        await client.aclose()
        codes = {i: got[i + 1].code for i in range(1, 13)}
        assert codes[4] == ResponseCode.SYSTEM_ERROR and "queueId[7]" in (got[5].remark or "")
        assert codes[6] == ResponseCode.MESSAGE_ILLEGAL
        assert all(c == ResponseCode.SUCCESS for i, c in codes.items() if i not in (4, 6))
        # the plain sends went in groups: before the batch (1-8 less the refused), after it
        assert groups == [6, 3]
        # queue offsets in arrival order, per queue (the batch takes two in queue 1)
        offsets = {i: int(got[i + 1].ext_fields["queueOffset"]) for i in codes if i not in (4, 6)}
        assert offsets == {1: 0, 2: 1, 3: 1, 5: 2, 7: 3, 8: 2, 9: 4, 10: 3, 11: 6, 12: 4}
        # CommitLog order is arrival order
        cl = b.store.commit_log  # type: ignore[attr-defined]
        stored = [m.body for m in decode_records(bytes(cl.read(0, cl.max_offset)))]
        want = [bodies[i] for i in sorted(bodies) if i < 9] + [b"m09-0", b"m09-1"]
        want += [bodies[i] for i in sorted(bodies) if i > 9]
        assert stored == want
        n.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (PutMessageStatus.PUT_OK, ResponseCode.SUCCESS),
        (PutMessageStatus.FLUSH_SLAVE_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT),
    ],
)
@pytest.mark.timeout(30)
async def test_sync_master_answers_of_a_run_wait_for_their_replica(
    autojump_clock: Any, tmp_path: Path, status: PutMessageStatus, code: int
) -> None:
    async with trio.open_nursery() as n:
        b = await make_broker(n, tmp_path, "SYNC_MASTER")
        ha = FakeHA(status, n)
        b.ha = cast(HAService, ha)  # the send path calls watch_replica only
        client, groups = await serve(n, b)
        with trio.fail_after(10):
            await client.send_all(send(0, 0, b"first"))
            await read_answers(client, 1)
            t0 = trio.current_time()
            await client.send_all(b"".join(send(i, i % 2, b"m%02d" % i) for i in range(1, 7)))
            got = await read_answers(client, 6)
        # nothing was answered before the replica's decision, 3 s later
        assert trio.current_time() - t0 == 3
        assert groups == [6]
        assert {o: r.code for o, r in got.items()} == {o: code for o in range(2, 8)}
        # one watch per send, at the end of its own record
        cl = b.store.commit_log  # type: ignore[attr-defined]
        records = decode_records(bytes(cl.read(0, cl.max_offset)))
        ends = [m.commit_log_offset + m.store_size for m in records]
        assert ha.asked == ends
        await client.aclose()
        n.cancel_scope.cancel()
