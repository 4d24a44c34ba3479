"""NamesrvProcessor handlers driven in-process through a fake dispatcher (no sockets).

The fake dispatcher answers a RequestError the way serve_remoting does (its code and remark), so
these tests see exactly the responses a client would.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import attrs
import pytest

from common.errors import RequestError
from common.model import DataVersion
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.server import RequestDispatcher
from namesrv.config import NamesrvConfig, parse_properties
from namesrv.kvconfig import KVConfigManager
from namesrv.processor import NamesrvProcessor
from namesrv.register_body import encode_compressed_register_body
from namesrv.routeinfo import RouteInfoManager, TopicQueueConfig


@attrs.define
class FakeClock:
    t: float = 0.0

    def __call__(self) -> float:
        return self.t


class FakeChannel:
    def __init__(self, remote_addr: str = "127.0.0.1:50000") -> None:
        self.remote_addr = remote_addr
        self.closed = False
        self.attrs: dict = {}

    def close(self) -> None:
        self.closed = True


@attrs.define
class FakeDispatcher:
    """What NamesrvProcessor.register uses of a RequestDispatcher, and a way to call it."""

    # code -> the processor's handler (async or inline)
    handlers: dict[int, Callable[..., Any]] = attrs.Factory(dict)
    close_listeners: list[Callable[[FakeChannel], None]] = attrs.Factory(list)

    def register(self, code: int, handler: Callable[..., Any], *, inline: bool = False) -> None:
        self.handlers[int(code)] = handler

    def add_close_listener(self, fn: Callable[[FakeChannel], None]) -> None:
        self.close_listeners.append(fn)

    async def call(self, cmd: RemotingCommand, channel: FakeChannel) -> RemotingCommand:
        handler = self.handlers.get(cmd.code)
        if handler is None:
            return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "not supported")
        try:
            answer = handler(cmd, channel)
            return answer if isinstance(answer, RemotingCommand) else await answer
        except RequestError as exc:
            return cmd.response(exc.code, exc.remark)

    def close(self, channel: FakeChannel) -> None:
        for fn in self.close_listeners:
            fn(channel)


@attrs.define
class Namesrv:
    processor: NamesrvProcessor
    dispatcher: FakeDispatcher
    clock: FakeClock
    channel: FakeChannel = attrs.Factory(FakeChannel)

    async def __call__(self, code, ext=None, body=b"", *, channel=None, version=None):
        cmd = RemotingCommand.request(code, ext or {}, body)
        if version is not None:
            cmd.version = version
        return await self.dispatcher.call(cmd, channel or self.channel)

    async def register(
        self,
        addr="127.0.0.1:10911",
        name="broker-a",
        bid=0,
        ha=None,
        cluster="DefaultCluster",
        topics=None,
        version=(1, 1),
        channel=None,
        extra=None,
    ):
        body = register_body(topics if topics is not None else {"TopicTest": 4}, version)
        ext = {
            "brokerName": name,
            "brokerAddr": addr,
            "clusterName": cluster,
            "haServerAddr": ha or addr.replace("10911", "10912"),
            "brokerId": bid,
            "compressed": False,
            "bodyCrc32": crc(body),
        }
        ext.update(extra or {})
        return await self(RequestCode.REGISTER_BROKER, ext, body, channel=channel)

    async def route(self, topic):
        return await self(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})


def crc(body: bytes) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF  # UtilAll.crc32


def register_body(topics: dict[str, int], version: tuple[int, int] = (1, 1)) -> bytes:
    table = {
        t: {
            "order": False,
            "perm": 6,
            "readQueueNums": n,
            "topicFilterType": "SINGLE_TAG",
            "topicName": t,
            "topicSysFlag": 0,
            "writeQueueNums": n,
        }
        for t, n in topics.items()
    }
    return json.dumps(
        {
            "filterServerList": [],
            "topicConfigSerializeWrapper": {
                "dataVersion": {"counter": version[1], "timestamp": version[0]},
                "topicConfigTable": table,
            },
        }
    ).encode()


@pytest.fixture
def ns(tmp_path: Path) -> Namesrv:
    clock = FakeClock()
    cfg = NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kvConfig.json"))
    processor = NamesrvProcessor(
        routes=RouteInfoManager(now=clock), kv=KVConfigManager.load(cfg.kv_config_path), config=cfg
    )
    dispatcher = FakeDispatcher()
    # the fake has all the processor uses of a dispatcher (register, add_close_listener)
    processor.register(cast(RequestDispatcher, dispatcher))
    return Namesrv(processor, dispatcher, clock)


async def test_register_master_and_slave_then_route(ns):
    r = await ns.register()
    assert r.code == ResponseCode.SUCCESS and r.is_response
    assert "masterAddr" not in r.ext_fields and "haServerAddr" not in r.ext_fields
    assert r.body_bytes() == b""  # no ORDER_TOPIC_CONFIG entries
    r = await ns.register(addr="127.0.0.2:10911", bid=1)
    assert r.ext_fields["masterAddr"] == "127.0.0.1:10911"
    assert r.ext_fields["haServerAddr"] == "127.0.0.1:10912"

    route = await ns.route("TopicTest")
    assert route.code == ResponseCode.SUCCESS
    text = route.body_bytes().decode()
    assert '"brokerAddrs":{"0":"127.0.0.1:10911","1":"127.0.0.2:10911"}' in text  # strict JSON
    data = json.loads(text)
    assert data["queueDatas"] == [
        {
            "brokerName": "broker-a",
            "perm": 6,
            "readQueueNums": 4,
            "topicSynFlag": 0,
            "topicSysFlag": 0,
            "writeQueueNums": 4,
        }
    ]
    assert data["brokerDatas"][0]["cluster"] == "DefaultCluster"
    assert data["filterServerTable"] == {}
    assert "orderTopicConf" not in data


async def test_unknown_topic_is_17_with_remark(ns):
    r = await ns.route("NoSuchTopic")
    assert r.code == ResponseCode.TOPIC_NOT_EXIST
    assert r.remark == "No topic route info in name server for the topic: NoSuchTopic"


@pytest.mark.parametrize(
    ("code", "ext", "missing"),
    [
        (RequestCode.GET_ROUTEINFO_BY_TOPIC, {}, "topic"),
        (RequestCode.REGISTER_BROKER, {"brokerName": "b", "clusterName": "c"}, "brokerAddr"),
        (RequestCode.PUT_KV_CONFIG, {"namespace": "n", "key": "k"}, "value"),
        (RequestCode.GET_KVLIST_BY_NAMESPACE, {}, "namespace"),
        (RequestCode.WIPE_WRITE_PERM_OF_BROKER, {}, "brokerName"),
        (
            RequestCode.UNREGISTER_BROKER,
            {"brokerName": "b", "brokerAddr": "a", "clusterName": "c"},
            "brokerId",
        ),
        (RequestCode.GET_TOPICS_BY_CLUSTER, {}, "cluster"),
        (RequestCode.DELETE_TOPIC_IN_NAMESRV, {}, "topic"),
    ],
)
async def test_missing_required_field_is_1_with_remark(ns, code, ext, missing):
    r = await ns(code, ext)
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert r.remark == f"the custom field {missing} is null"


async def test_ill_typed_broker_id_is_an_error(ns):
    r = await ns.register(extra={"brokerId": "zero"})
    assert r.code == ResponseCode.SYSTEM_ERROR and "brokerId" in r.remark
    assert (await ns.route("TopicTest")).code == ResponseCode.TOPIC_NOT_EXIST


async def test_crc_mismatch_and_accepted_forms(ns):
    body = register_body({"T": 1})
    base = {
        "brokerName": "b",
        "brokerAddr": "1.1.1.1:1",
        "clusterName": "c",
        "haServerAddr": "1.1.1.1:2",
        "brokerId": 0,
    }
    r = await ns(RequestCode.REGISTER_BROKER, {**base, "bodyCrc32": crc(body) ^ 1}, body)
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "crc32 not match")
    assert (await ns.route("T")).code == ResponseCode.TOPIC_NOT_EXIST
    full = zlib.crc32(body)
    signed = full - (1 << 32) if full >= 1 << 31 else full
    for value in (crc(body), signed, 0):
        r = await ns(RequestCode.REGISTER_BROKER, {**base, "bodyCrc32": value}, body)
        assert r.code == ResponseCode.SUCCESS, value
    assert (await ns.route("T")).code == ResponseCode.SUCCESS


async def test_compressed_register(ns):
    body = encode_compressed_register_body(DataVersion(5, 1), [TopicQueueConfig("Zipped", 2, 3, 6)])
    ext = {
        "brokerName": "b",
        "brokerAddr": "1.1.1.1:1",
        "clusterName": "c",
        "haServerAddr": "1.1.1.1:2",
        "brokerId": 0,
        "compressed": True,
        "bodyCrc32": crc(body),
    }
    r = await ns(RequestCode.REGISTER_BROKER, ext, body)
    assert r.code == ResponseCode.SUCCESS
    qd = json.loads((await ns.route("Zipped")).body_bytes())["queueDatas"][0]
    assert (qd["readQueueNums"], qd["writeQueueNums"]) == (2, 3)


async def test_undecodable_register_body_is_1_and_tables_untouched(ns):
    ext = {
        "brokerName": "b",
        "brokerAddr": "1.1.1.1:1",
        "clusterName": "c",
        "haServerAddr": "1.1.1.1:2",
        "brokerId": 0,
    }
    r = await ns(RequestCode.REGISTER_BROKER, ext, b"\x00" * 100)
    assert r.code == ResponseCode.SYSTEM_ERROR and r.remark.startswith("Failed to decode")
    r = await ns(RequestCode.REGISTER_BROKER, {**ext, "compressed": "true"}, b"junk")
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert ns.processor.routes.live_broker_addrs() == []


async def test_kv_config_codes(ns, tmp_path):
    kv = {"namespace": "ns1", "key": "k"}
    r = await ns(RequestCode.GET_KV_CONFIG, kv)
    assert (r.code, r.remark) == (
        ResponseCode.QUERY_NOT_FOUND,
        "No config item, Namespace: ns1 Key: k",
    )
    r = await ns(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ns1"})
    assert (r.code, r.remark) == (ResponseCode.QUERY_NOT_FOUND, "No config item, Namespace: ns1")
    assert (await ns(RequestCode.PUT_KV_CONFIG, {**kv, "value": "v"})).code == ResponseCode.SUCCESS
    r = await ns(RequestCode.GET_KV_CONFIG, kv)
    assert (r.code, r.ext_fields["value"]) == (ResponseCode.SUCCESS, "v")
    r = await ns(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ns1"})
    assert json.loads(r.body_bytes()) == {"table": {"k": "v"}}
    assert json.loads((tmp_path / "kvConfig.json").read_text()) == {
        "configTable": {"ns1": {"k": "v"}}
    }
    assert (await ns(RequestCode.DELETE_KV_CONFIG, kv)).code == ResponseCode.SUCCESS
    assert (await ns(RequestCode.GET_KV_CONFIG, kv)).code == ResponseCode.QUERY_NOT_FOUND


async def test_kv_persist_failure_is_reported(ns, tmp_path):
    (tmp_path / "blocker").write_text("")
    ns.processor.kv = KVConfigManager(str(tmp_path / "blocker" / "kv.json"))
    r = await ns(RequestCode.PUT_KV_CONFIG, {"namespace": "n", "key": "k", "value": "v"})
    assert r.code == ResponseCode.SYSTEM_ERROR and "persist kv config failed" in r.remark


async def test_order_topic_conf_to_brokers_and_routes(ns):
    await ns(
        RequestCode.PUT_KV_CONFIG,
        {"namespace": "ORDER_TOPIC_CONFIG", "key": "TopicTest", "value": "broker-a:4"},
    )
    r = await ns.register()
    assert json.loads(r.body_bytes()) == {"table": {"TopicTest": "broker-a:4"}}
    assert "orderTopicConf" not in json.loads((await ns.route("TopicTest")).body_bytes())
    r = await ns(RequestCode.UPDATE_NAMESRV_CONFIG, body=b"orderMessageEnable=true\n")
    assert r.code == ResponseCode.SUCCESS
    data = json.loads((await ns.route("TopicTest")).body_bytes())
    assert data["orderTopicConf"] == "broker-a:4"


async def test_query_data_version_changed_and_heartbeat(ns):
    await ns.register(version=(100, 1))
    ext = {
        "brokerName": "broker-a",
        "brokerAddr": "127.0.0.1:10911",
        "clusterName": "DefaultCluster",
        "brokerId": 0,
    }
    ns.clock.t = 100.0
    r = await ns(RequestCode.QUERY_DATA_VERSION, ext, b'{"counter":1,"timestamp":100}')
    assert r.ext_fields["changed"] == "false"
    assert json.loads(r.body_bytes()) == {"counter": 1, "timestamp": 100}
    live = ns.processor.routes.broker_live_info("127.0.0.1:10911")
    assert live.last_update_timestamp == 100.0  # refreshed: it was a heartbeat
    ns.clock.t = 150.0
    r = await ns(RequestCode.QUERY_DATA_VERSION, ext, b'{"counter":2,"timestamp":100}')
    assert r.ext_fields["changed"] == "true"
    assert live.last_update_timestamp == 100.0  # changed: the broker must re-register
    r = await ns(RequestCode.QUERY_DATA_VERSION, {**ext, "brokerAddr": "9.9.9.9:1"}, b"{}")
    assert r.ext_fields["changed"] == "true" and r.body_bytes() == b""
    r = await ns(RequestCode.QUERY_DATA_VERSION, ext, b"{broken")
    assert r.code == ResponseCode.SYSTEM_ERROR


async def test_wipe_and_add_write_perm(ns):
    await ns.register(topics={"A": 4, "B": 4})
    r = await ns(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
    assert r.ext_fields["wipeTopicCount"] == "2"
    assert json.loads((await ns.route("A")).body_bytes())["queueDatas"][0]["perm"] == 4
    r = await ns(RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
    assert r.ext_fields["addTopicCount"] == "2"
    assert json.loads((await ns.route("A")).body_bytes())["queueDatas"][0]["perm"] == 6


async def test_delete_topic_and_topic_lists(ns):
    await ns.register(topics={"A": 4, "B": 4})
    await ns.register(addr="127.0.0.3:10911", name="broker-b", cluster="C2", topics={"A": 2})
    r = await ns(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    assert json.loads(r.body_bytes()) == {"topicList": ["A", "B"]}
    r = await ns(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "C2"})
    assert json.loads(r.body_bytes()) == {"topicList": ["A"]}
    r = await ns(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS)
    assert json.loads(r.body_bytes()) == {
        "topicList": ["C2", "broker-b", "DefaultCluster", "broker-a"],
        "brokerAddr": "127.0.0.1:10911",
    }
    for code in (
        RequestCode.GET_UNIT_TOPIC_LIST,
        RequestCode.GET_HAS_UNIT_SUB_TOPIC_LIST,
        RequestCode.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST,
    ):
        assert json.loads((await ns(code)).body_bytes()) == {"topicList": []}
    r = await ns(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "A", "clusterName": "C2"})
    assert r.code == ResponseCode.SUCCESS
    names = [q["brokerName"] for q in json.loads((await ns.route("A")).body_bytes())["queueDatas"]]
    assert names == ["broker-a"]
    await ns(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "A"})
    assert (await ns.route("A")).code == ResponseCode.TOPIC_NOT_EXIST


async def test_cluster_info(ns):
    await ns.register()
    await ns.register(addr="127.0.0.2:10911", bid=1)
    r = await ns(RequestCode.GET_BROKER_CLUSTER_INFO)
    assert json.loads(r.body_bytes()) == {
        "brokerAddrTable": {
            "broker-a": {
                "brokerAddrs": {"0": "127.0.0.1:10911", "1": "127.0.0.2:10911"},
                "brokerName": "broker-a",
                "cluster": "DefaultCluster",
            }
        },
        "clusterAddrTable": {"DefaultCluster": ["broker-a"]},
    }


async def test_unregister_broker(ns):
    await ns.register()
    ext = {
        "brokerName": "broker-a",
        "brokerAddr": "127.0.0.1:10911",
        "clusterName": "DefaultCluster",
        "brokerId": 0,
    }
    assert (await ns(RequestCode.UNREGISTER_BROKER, ext)).code == ResponseCode.SUCCESS
    assert (await ns.route("TopicTest")).code == ResponseCode.TOPIC_NOT_EXIST


async def test_channel_close_listener_drops_its_brokers(ns):
    a, b = FakeChannel("127.0.0.1:1"), FakeChannel("127.0.0.1:2")
    await ns.register(channel=a)
    await ns.register(addr="127.0.0.2:10911", bid=1, channel=b)
    ns.dispatcher.close(a)
    route = json.loads((await ns.route("TopicTest")).body_bytes())
    assert route["brokerDatas"][0]["brokerAddrs"] == {"1": "127.0.0.2:10911"}
    ns.dispatcher.close(b)
    assert (await ns.route("TopicTest")).code == ResponseCode.TOPIC_NOT_EXIST


async def test_get_and_update_config(ns):
    r = await ns(RequestCode.GET_NAMESRV_CONFIG)
    props = parse_properties(r.body_bytes().decode())
    assert props["brokerChannelExpiredTime"] == "120000"
    assert props["listenPort"] == "0"
    r = await ns(
        RequestCode.UPDATE_NAMESRV_CONFIG,
        body=b"brokerChannelExpiredTime=30000\nscanNotActiveBrokerInterval=2000\n",
    )
    assert r.code == ResponseCode.SUCCESS
    assert ns.processor.routes.broker_channel_expired_time == 30.0
    assert ns.processor.config.scan_not_active_broker_interval == 2.0
    r = await ns(RequestCode.UPDATE_NAMESRV_CONFIG, body=b"kvConfigPath=/tmp/evil\n")
    assert r.code == ResponseCode.NO_PERMISSION
    r = await ns(RequestCode.UPDATE_NAMESRV_CONFIG, body=b"listenPort=abc\n")
    assert r.code == ResponseCode.SYSTEM_ERROR
    r = await ns(RequestCode.UPDATE_NAMESRV_CONFIG, body=b"\xff\xfe")
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "string2Properties error")
    assert ns.processor.config.kv_config_path.endswith("kvConfig.json")


async def test_legacy_broker_version_registers_bare_wrapper(ns):
    wrapper = json.loads(register_body({"Old": 2}))["topicConfigSerializeWrapper"]
    ext = {
        "brokerName": "b",
        "brokerAddr": "1.1.1.1:1",
        "clusterName": "c",
        "haServerAddr": "1.1.1.1:2",
        "brokerId": 0,
    }
    r = await ns(RequestCode.REGISTER_BROKER, ext, json.dumps(wrapper).encode(), version=30)
    assert r.code == ResponseCode.SUCCESS
    assert (await ns.route("Old")).code == ResponseCode.SUCCESS
