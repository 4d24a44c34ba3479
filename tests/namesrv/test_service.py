"""run_namesrv over real TCP on port 0, driven by a real RemotingClient."""

from __future__ import annotations

import json
import zlib

import pytest
import trio

from common.model import ClusterInfo, TopicRouteData
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.serde import from_json
from namesrv.config import NamesrvConfig
from namesrv.kvconfig import KVConfigError
from namesrv.service import run_namesrv

# ------------------------------------------------------------------ over TCP


def _register_cmd(
    addr: str, bid: int, topics: dict[str, int], version: tuple[int, int] = (1, 1)
) -> RemotingCommand:
    table = {
        t: {"topicName": t, "readQueueNums": n, "writeQueueNums": n, "perm": 6}
        for t, n in topics.items()
    }
    body = json.dumps(
        {
            "filterServerList": [],
            "topicConfigSerializeWrapper": {
                "dataVersion": {"timestamp": version[0], "counter": version[1]},
                "topicConfigTable": table,
            },
        }
    ).encode()
    return RemotingCommand.request(
        RequestCode.REGISTER_BROKER,
        {
            "brokerName": "broker-a",
            "brokerAddr": addr,
            "clusterName": "DefaultCluster",
            "haServerAddr": addr + "1",
            "brokerId": bid,
            "compressed": False,
            "bodyCrc32": zlib.crc32(body) & 0x7FFFFFFF,
        },
        body,
    )


async def test_over_tcp_register_route_errors_and_close(tmp_path, nursery):
    cfg = NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kv.json"))
    ns = await nursery.start(run_namesrv, cfg)
    assert ns.port > 0
    addr = f"127.0.0.1:{ns.port}"
    async with open_remoting_client() as reader:
        async with open_remoting_client() as broker:
            r = await broker.invoke(addr, _register_cmd("127.0.0.1:10911", 0, {"TopicTest": 4}))
            assert r.code == ResponseCode.SUCCESS
            r = await broker.invoke(addr, _register_cmd("127.0.0.1:20911", 1, {}))
            assert r.ext_fields["masterAddr"] == "127.0.0.1:10911"

            route = await reader.invoke(
                addr,
                RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}),
            )
            assert route.code == ResponseCode.SUCCESS
            data = json.loads(route.body_bytes())
            assert data["brokerDatas"][0]["brokerAddrs"] == {
                "0": "127.0.0.1:10911",
                "1": "127.0.0.1:20911",
            }
            assert data["queueDatas"][0]["topicSynFlag"] == 0
            # and clients read it back through the shared models
            typed = from_json(route.body_bytes(), TopicRouteData)
            assert typed.brokerDatas[0].brokerAddrs == {0: "127.0.0.1:10911", 1: "127.0.0.1:20911"}
            assert typed.queueDatas[0].writeQueueNums == 4
            r = await reader.invoke(
                addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
            )
            info = from_json(r.body_bytes(), ClusterInfo)
            assert info.clusterAddrTable == {"DefaultCluster": ["broker-a"]}
            assert info.brokerAddrTable["broker-a"].brokerAddrs[0] == "127.0.0.1:10911"

            r = await reader.invoke(addr, RemotingCommand.request(9999))
            assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            r = await reader.invoke(
                addr, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC)
            )
            assert (r.code, r.remark) == (
                ResponseCode.SYSTEM_ERROR,
                "the custom field topic is null",
            )
            r = await reader.invoke(
                addr, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Nope"})
            )
            assert r.code == ResponseCode.TOPIC_NOT_EXIST
        # The broker's connection is gone: both addresses it registered leave at once.
        # The close is noticed inside the server's connection task; nothing to wait on from
        # here but the tables themselves, so poll (bounded).
        with trio.fail_after(5):
            while ns.routes.live_broker_addrs():  # noqa: ASYNC110
                await trio.sleep(0.01)
        r = await reader.invoke(
            addr,
            RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}),
        )
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
        # The reader's own connection (which registered nothing) is unaffected.
        r = await reader.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        assert json.loads(r.body_bytes()) == {"brokerAddrTable": {}, "clusterAddrTable": {}}
    nursery.cancel_scope.cancel()


async def test_kv_survives_namesrv_restart(tmp_path):
    cfg = NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "ns" / "kvConfig.json"))
    put = RemotingCommand.request(
        RequestCode.PUT_KV_CONFIG,
        {"namespace": "ORDER_TOPIC_CONFIG", "key": "T", "value": "broker-a:4"},
    )
    get = {"namespace": "ORDER_TOPIC_CONFIG", "key": "T"}
    for round_ in range(2):
        async with trio.open_nursery() as nursery:
            ns = await nursery.start(run_namesrv, cfg)
            async with open_remoting_client() as client:
                addr = f"127.0.0.1:{ns.port}"
                if round_ == 0:
                    assert (await client.invoke(addr, put)).code == ResponseCode.SUCCESS
                r = await client.invoke(
                    addr, RemotingCommand.request(RequestCode.GET_KV_CONFIG, get)
                )
                assert (r.code, r.ext_fields.get("value")) == (ResponseCode.SUCCESS, "broker-a:4")
            nursery.cancel_scope.cancel()


async def test_corrupt_kv_file_stops_startup(tmp_path, nursery):
    content = "{broken"
    path = tmp_path / "kvConfig.json"
    path.write_text(content)
    with pytest.raises(KVConfigError, match="cannot parse"):
        await nursery.start(run_namesrv, NamesrvConfig(listen_port=0, kv_config_path=str(path)))
    assert path.read_text() == content  # not overwritten
