"""mqadmin's operations on the wire, as a 4.9 Java admin client sends them.

Each request is a raw RemotingCommand with the Java request header's field names
(``UpdateBrokerConfig`` has only a body, ``GetProducerConnectionListRequestHeader.producerGroup``,
...) against a broker on an ephemeral port; answers are checked field by field in the shapes
the Java tools parse (``ProducerConnection``, ``ProducerTableInfo``, ...).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.config import BrokerConfig
from broker.configuration import merge_properties, plan_update
from broker.service import BrokerHandle, run_broker
from broker.store import MessageStoreConfig, run_memory_store
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(30)

Call = Callable[..., Awaitable[RemotingCommand]]


@asynccontextmanager
async def broker(tmp_path: Path, **kw: Any) -> AsyncIterator[tuple[BrokerHandle, Call]]:
    config = BrokerConfig(
        listen_port=0, store=MessageStoreConfig(store_path_root_dir=tmp_path / "store"), **kw
    )
    async with trio.open_nursery() as n, open_remoting_client() as c:
        b: BrokerHandle = await n.start(
            lambda task_status: run_broker(
                config, store_factory=run_memory_store, task_status=task_status
            )
        )

        async def call(code: int, ext: dict[str, Any] | None = None, body: bytes = b"") -> Any:
            return await c.invoke(b.addr, RemotingCommand.request(code, ext, body))

        yield b, call
        n.cancel_scope.cancel()


def props(text: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.decode().splitlines() if "=" in line)


# --- broker config --------------------------------------------------------------------------


async def test_update_broker_config_live_key_persists_and_bumps_version(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("# ours\nbrokerName=broker-a\nlongPollingEnable=true\n")
    async with broker(tmp_path, broker_config_path=str(conf)) as (b, call):
        before = await call(RequestCode.GET_BROKER_CONFIG)
        v0 = json.loads(before.ext_fields["version"])
        assert props(before.body_bytes())["longPollingEnable"] == "true"

        r = await call(
            RequestCode.UPDATE_BROKER_CONFIG,
            None,
            b"longPollingEnable=false\nshortPollingTimeMills=500\n",
        )
        assert (r.code, r.remark) == (ResponseCode.SUCCESS, None)
        after = await call(RequestCode.GET_BROKER_CONFIG)
        v1 = json.loads(after.ext_fields["version"])
        assert v1["counter"] == v0["counter"] + 1
        p = props(after.body_bytes())
        assert p["longPollingEnable"] == "false" and p["shortPollingTime"] == "0.5"
        # the live config is what the pull path reads
        assert b.controller.config.long_polling_enable is False
        # the file keeps its comment and order; the changed line is replaced in place
        assert conf.read_text() == (
            "# ours\nbrokerName=broker-a\nlongPollingEnable=false\nshortPollingTimeMills=500\n"
        )


async def test_broker_permission_update_is_live_and_re_registers(tmp_path: Path) -> None:
    async with broker(tmp_path) as (b, call):
        version = b.controller.topic_config_manager.data_version
        r = await call(RequestCode.UPDATE_BROKER_CONFIG, None, b"brokerPermission=4")
        assert r.code == ResponseCode.SUCCESS
        assert b.controller.config.broker_permission == 4
        assert b.controller.topic_config_manager.data_version.counter == version.counter + 1
        # a read-only broker refuses sends with NO_PERMISSION, as RocketMQ's wipeWritePerm
        send = {"a": "pg", "b": "T", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 0, "h": 0}
        r = await call(RequestCode.SEND_MESSAGE_V2, send, b"x")
        assert r.code == ResponseCode.NO_PERMISSION
        # written to the default path: <storePathRootDir>/config/broker.properties
        assert (tmp_path / "store/config/broker.properties").read_text() == "brokerPermission=4\n"


async def test_restart_only_key_is_written_and_named_in_the_remark(tmp_path: Path) -> None:
    async with broker(tmp_path) as (b, call):
        r = await call(RequestCode.UPDATE_BROKER_CONFIG, None, b"maxMessageSize=1024")
        assert r.code == ResponseCode.SUCCESS
        assert "takes effect after a restart: maxMessageSize" in (r.remark or "")
        assert b.controller.config.store.max_message_size == 4 * 1024 * 1024
        assert "maxMessageSize=1024" in (tmp_path / "store/config/broker.properties").read_text()


@pytest.mark.parametrize(
    ("body", "remark"),
    [
        (b"noSuchKey=1", "unknown broker config key noSuchKey"),
        (b"longPollingEnable=maybe", "bad value for longPollingEnable"),
        (b"brokerPermission=six", "bad value for brokerPermission"),
        (b"storePathRootDir=/tmp/evil", "storePathRootDir cannot be changed"),
        (b"\xff\xfe=1", "not UTF-8"),
        (b"".join(b"k%d=1\n" % i for i in range(600)), "too many properties"),
    ],
)
async def test_update_broker_config_refusals_change_nothing(
    tmp_path: Path, body: bytes, remark: str
) -> None:
    async with broker(tmp_path) as (b, call):
        before = b.controller.config
        # a good key next to the bad one is not applied either
        r = await call(RequestCode.UPDATE_BROKER_CONFIG, None, b"traceOn=false\n" + body)
        assert r.code == ResponseCode.SYSTEM_ERROR and remark in (r.remark or "")
        assert b.controller.config is before
        assert not (tmp_path / "store/config/broker.properties").exists()
        assert (await call(RequestCode.GET_BROKER_CONFIG)).code == ResponseCode.SUCCESS


async def test_update_broker_config_empty_body_is_a_no_op(tmp_path: Path) -> None:
    async with broker(tmp_path) as (_b, call):
        assert (await call(RequestCode.UPDATE_BROKER_CONFIG)).code == ResponseCode.SUCCESS
        r = await call(RequestCode.UPDATE_BROKER_CONFIG, None, b"# only a comment\n")
        assert r.code == ResponseCode.SYSTEM_ERROR and "holds no property" in (r.remark or "")


def test_merge_properties_replaces_last_and_appends() -> None:
    text = "a=1\n# a=9\nb : 2\na=3\n"
    assert merge_properties(text, {"a": "5", "c": "x"}) == "a=1\n# a=9\nb : 2\na=5\nc=x\n"
    assert merge_properties("", {"k": "v"}) == "k=v\n"


def test_plan_update_sorts_live_and_restart_keys() -> None:
    plan = plan_update(BrokerConfig(), "traceOn=false\nlistenPort=1234\n")
    assert plan.live == ("traceOn",) and plan.restart == ("listenPort",)
    assert plan.config.trace_on is False and plan.config.listen_port == 10911


# --- producers ------------------------------------------------------------------------------


def heartbeat(client_id: str, *producer_groups: str) -> bytes:
    return json.dumps(
        {
            "clientID": client_id,
            "producerDataSet": [{"groupName": g} for g in producer_groups],
            "consumerDataSet": [],
        }
    ).encode()


async def test_producer_connection_list_and_all_producer_info(tmp_path: Path) -> None:
    async with broker(tmp_path) as (_b, call):
        r = await call(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "PG"})
        assert r.code == ResponseCode.SYSTEM_ERROR
        assert r.remark == "the producer group[PG] not exist"
        r = await call(RequestCode.HEART_BEAT, None, heartbeat("10.0.0.1@p1", "PG", "PG2"))
        assert r.code == ResponseCode.SUCCESS

        r = await call(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "PG"})
        assert r.code == ResponseCode.SUCCESS
        (conn,) = json.loads(r.body_bytes())["connectionSet"]
        assert conn["clientId"] == "10.0.0.1@p1" and conn["clientAddr"].startswith("127.0.0.1:")
        assert (conn["language"], conn["version"]) == ("JAVA", 407)

        r = await call(RequestCode.GET_ALL_PRODUCER_INFO, {})
        data = json.loads(r.body_bytes())["data"]
        assert sorted(data) == ["PG", "PG2"]
        (info,) = data["PG"]
        assert info["clientId"] == "10.0.0.1@p1" and info["remoteIP"] == conn["clientAddr"]
        assert abs(info["lastUpdateTimestamp"] / 1000 - time.time()) < 60

        r = await call(RequestCode.GET_PRODUCER_CONNECTION_LIST, {})
        assert r.code == ResponseCode.SYSTEM_ERROR and "producerGroup" in (r.remark or "")
