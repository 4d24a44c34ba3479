"""Broker liveness through the real scan task and the real dispatcher, on Trio's clock.

Expiry runs `scan_not_active_broker_task` under autojump_clock (no sockets: the clock may jump
freely). Connection close runs the real RequestDispatcher/Channel over a memory stream pair, so
"dropped at once" is checked deterministically.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
import trio.testing

from common.model import DataVersion
from common.remoting.codec import FrameDecoder, encode
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.server import RequestDispatcher, handle_stream
from namesrv.config import NamesrvConfig
from namesrv.kvconfig import KVConfigManager
from namesrv.processor import NamesrvProcessor
from namesrv.routeinfo import RouteInfoManager, TopicQueueConfig
from namesrv.service import scan_not_active_broker_task


class FakeChannel:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _processor(tmp_path: Path, **cfg: Any) -> NamesrvProcessor:
    config = NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kv.json"), **cfg)
    routes = RouteInfoManager(
        now=trio.current_time, broker_channel_expired_time=config.broker_channel_expired_time
    )
    return NamesrvProcessor(
        routes=routes, kv=KVConfigManager.load(config.kv_config_path), config=config
    )


def _register(p: NamesrvProcessor, addr: str, bid: int, chan: FakeChannel) -> None:
    p.routes.register_broker(
        "DefaultCluster",
        addr,
        "broker-a",
        bid,
        addr + "1",
        DataVersion(1, 1),
        {"T": TopicQueueConfig("T", 4, 4)},
        [],
        chan,
    )


async def test_scan_task_expires_silent_broker_after_120s(tmp_path, autojump_clock, nursery):
    p = _processor(tmp_path)
    master_chan, slave_chan = FakeChannel(), FakeChannel()
    start = trio.current_time()
    _register(p, "m:1", 0, master_chan)
    _register(p, "s:1", 1, slave_chan)
    nursery.start_soon(scan_not_active_broker_task, p)

    async def slave_keeps_registering():
        while True:
            await trio.sleep(30)
            _register(p, "s:1", 1, slave_chan)

    nursery.start_soon(slave_keeps_registering)
    # Scans run at +5, +15, ..., +125: the master (silent since +0) is past 120 s at +125.
    await trio.sleep_until(start + 124)
    assert p.routes.live_broker_addrs() == ["m:1", "s:1"]
    await trio.sleep_until(start + 126)
    assert p.routes.live_broker_addrs() == ["s:1"]
    assert master_chan.closed and not slave_chan.closed
    route = p.routes.pickup_topic_route_data("T")
    assert route is not None and route.broker_datas[0].broker_addrs == {1: "s:1"}
    nursery.cancel_scope.cancel()


async def test_scan_interval_and_expiry_are_configurable(tmp_path, autojump_clock, nursery):
    p = _processor(tmp_path, scan_not_active_broker_interval=1.0, broker_channel_expired_time=3.0)
    chan = FakeChannel()
    start = trio.current_time()
    _register(p, "m:1", 0, chan)
    nursery.start_soon(scan_not_active_broker_task, p)
    await trio.sleep_until(start + 2.5)
    assert p.routes.live_broker_addrs() == ["m:1"]
    await trio.sleep_until(start + 4.5)
    assert p.routes.live_broker_addrs() == []
    assert p.routes.pickup_topic_route_data("T") is None
    nursery.cancel_scope.cancel()


async def test_expired_channel_stays_open_while_another_broker_uses_it(
    tmp_path, autojump_clock, nursery
):
    p = _processor(tmp_path, scan_not_active_broker_interval=1.0, broker_channel_expired_time=3.0)
    shared = FakeChannel()
    start = trio.current_time()
    _register(p, "m:1", 0, shared)
    await trio.sleep(2)
    _register(p, "s:1", 1, shared)
    nursery.start_soon(scan_not_active_broker_task, p)
    await trio.sleep_until(start + 4.5)
    assert p.routes.live_broker_addrs() == ["s:1"]
    assert not shared.closed
    nursery.cancel_scope.cancel()


class MemoryConnection:
    """The client end of a memory stream served by the real Channel/dispatcher."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.opaque = 0
        self.pending: list[RemotingCommand] = []

    async def invoke(self, cmd: RemotingCommand) -> RemotingCommand:
        self.opaque += 1
        cmd.opaque = self.opaque
        await self.stream.send_all(encode(cmd))
        while not self.pending:
            data = await self.stream.receive_some()
            assert data, "server closed the connection"
            self.pending.extend(self.decoder.feed(data))
        resp = self.pending.pop(0)
        assert resp.is_response and resp.opaque == cmd.opaque
        return resp


def _register_cmd(addr: str, bid: int) -> RemotingCommand:
    body = json.dumps(
        {
            "topicConfigSerializeWrapper": {
                "dataVersion": {"timestamp": 1, "counter": 1},
                "topicConfigTable": {
                    "T": {"topicName": "T", "readQueueNums": 4, "writeQueueNums": 4}
                },
            }
        }
    ).encode()
    ext = {
        "brokerName": "broker-a",
        "brokerAddr": addr,
        "clusterName": "DefaultCluster",
        "haServerAddr": addr + "1",
        "brokerId": bid,
    }
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, ext, body)


async def test_connection_close_drops_its_brokers_at_once(tmp_path, nursery):
    p = _processor(tmp_path)
    dispatcher = RequestDispatcher()
    p.register(dispatcher)
    conns = []
    for _ in range(2):
        client_end, server_end = trio.testing.memory_stream_pair()
        nursery.start_soon(handle_stream, server_end, dispatcher)
        conns.append((MemoryConnection(client_end), client_end))
    (master, master_stream), (slave, _slave_stream) = conns
    assert (await master.invoke(_register_cmd("m:1", 0))).code == ResponseCode.SUCCESS
    r = await slave.invoke(_register_cmd("s:1", 1))
    assert r.ext_fields["masterAddr"] == "m:1"

    await master_stream.aclose()
    await trio.testing.wait_all_tasks_blocked()
    # No clock advanced: the close alone removed the master, the slave stays.
    assert p.routes.live_broker_addrs() == ["s:1"]
    route = await slave.invoke(
        RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    )
    assert json.loads(route.body_bytes())["brokerDatas"][0]["brokerAddrs"] == {"1": "s:1"}
    nursery.cancel_scope.cancel()


async def test_expiry_closes_the_real_connection(tmp_path, autojump_clock, nursery):
    p = _processor(tmp_path)
    dispatcher = RequestDispatcher()
    p.register(dispatcher)
    client_end, server_end = trio.testing.memory_stream_pair()
    nursery.start_soon(handle_stream, server_end, dispatcher)
    nursery.start_soon(scan_not_active_broker_task, p)
    conn = MemoryConnection(client_end)
    start = trio.current_time()
    assert (await conn.invoke(_register_cmd("m:1", 0))).code == ResponseCode.SUCCESS
    # Silent broker: at the first scan past 120 s the namesrv drops it and hangs up on it.
    with trio.fail_after(200):
        assert await client_end.receive_some() == b""
    assert 120 < trio.current_time() - start <= 130
    assert p.routes.live_broker_addrs() == []
    nursery.cancel_scope.cancel()
