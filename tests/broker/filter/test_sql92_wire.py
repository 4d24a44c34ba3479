"""SQL92 subscriptions on the wire, spoken as RocketMQ's Java client speaks them.

Raw CHECK_CLIENT_CONFIG (``MQClientAPIImpl.checkClientInBroker``: body CheckClientRequestBody),
HEART_BEAT with a SQL92 SubscriptionData and PULL_MESSAGE with ``expressionType`` SQL92 and
``subVersion`` (``PullAPIWrapper.pullKernelImpl``), against ``run_broker`` with the memory and the
file store, and a slave serving replicated records.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.service import run_broker
from broker.store import run_memory_store
from common.message import MessageExtBrokerInner, decode_records
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from tests.broker.test_broker_service import Env, broker_config
from tests.support.slave_broker import slave_holding

SUB_VERSION = 1_700_000_000_123
NOT_SUPPORTED = "The broker does not support consumer to filter message by SQL92"


def sql92_sub(topic: str, expression: str) -> dict[str, Any]:
    # what the Java client's FilterAPI.build makes for MessageSelector.bySql
    return {
        "classFilterMode": False,
        "codeSet": [],
        "expressionType": "SQL92",
        "subString": expression,
        "subVersion": SUB_VERSION,
        "tagsSet": [],
        "topic": topic,
    }


def check_client_body(group: str, topic: str, expression: str) -> bytes:
    return json.dumps(
        {"clientId": "10.0.0.1@1", "group": group, "subscriptionData": sql92_sub(topic, expression)}
    ).encode()


def heartbeat_body(group: str, topic: str, expression: str) -> bytes:
    return json.dumps(
        {
            "clientID": "10.0.0.1@1",
            "consumerDataSet": [
                {
                    "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                    "consumeType": "CONSUME_PASSIVELY",
                    "groupName": group,
                    "messageModel": "CLUSTERING",
                    "subscriptionDataSet": [sql92_sub(topic, expression)],
                    "unitMode": False,
                }
            ],
            "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}],
        }
    ).encode()


def pull(
    topic: str,
    offset: int,
    expression: str | None,
    *,
    group: str = "cg",
    sys_flag: int = 0x4,  # SUBSCRIPTION (a pull / lite-pull consumer)
    suspend_ms: int = 0,
) -> RemotingCommand:
    ext: dict[str, Any] = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": 0,
        "queueOffset": offset,
        "maxMsgNums": 32,
        "sysFlag": sys_flag,
        "commitOffset": 0,
        "suspendTimeoutMillis": suspend_ms,
        "subVersion": SUB_VERSION,
        "expressionType": "SQL92",
    }
    if expression is not None:
        ext["subscription"] = expression
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, ext)


async def start_env(
    nursery: trio.Nursery, tmp_path: Path, store: str, **kw: Any
) -> AsyncIterator[Env]:
    factory = run_memory_store if store == "memory" else None
    handle = await nursery.start(
        lambda task_status: run_broker(
            broker_config(tmp_path, **kw), store_factory=factory, task_status=task_status
        )
    )
    async with open_remoting_client() as client:
        yield Env(handle, client)


@pytest.fixture(params=["memory", "file"])
async def on(
    request: pytest.FixtureRequest, tmp_path: Path, nursery: trio.Nursery
) -> AsyncIterator[Env]:
    async for env in start_env(nursery, tmp_path, request.param, enable_property_filter=True):
        yield env


@pytest.fixture
async def off(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Env]:
    async for env in start_env(nursery, tmp_path, "memory"):
        yield env


async def send_orders(env: Env, topic: str) -> None:
    for i, (tags, amount) in enumerate(
        [("paid", "50"), ("paid", "250"), ("refunded", "300"), ("paid", "abc"), (None, "999")]
    ):
        props = {"amount": amount, "region": "eu" if i % 2 else "us"}
        r = await env.send(topic, f"m{i}".encode(), tags=tags, props=props)
        assert r.code == 0, r.remark


def bodies(r: RemotingCommand) -> list[bytes]:
    return [m.body for m in decode_records(r.body_bytes())] if r.code == 0 else []


async def call(env: Env, cmd: RemotingCommand) -> RemotingCommand:
    return await env.client.invoke(env.addr, cmd, timeout=20.0)


# --- enablePropertyFilter off (RocketMQ's default) -------------------------------------------


async def test_off_check_client_config_refuses_sql92_and_takes_tags(off: Env) -> None:
    r = await off.call(RequestCode.CHECK_CLIENT_CONFIG, None, check_client_body("g", "T", "a > 1"))
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, NOT_SUPPORTED)
    tag = json.dumps(
        {"clientId": "c", "group": "g", "subscriptionData": {"topic": "T", "subString": "A"}}
    ).encode()
    r = await off.call(RequestCode.CHECK_CLIENT_CONFIG, None, tag)
    assert r.code == ResponseCode.SUCCESS
    r = await off.call(RequestCode.CHECK_CLIENT_CONFIG, None, b"")
    assert r.code == ResponseCode.SUCCESS  # nothing to check, as RocketMQ


async def test_off_pulls_are_refused_with_the_same_answer(off: Env) -> None:
    await send_orders(off, "OffT")
    r = await call(off, pull("OffT", 0, "amount > 100"))
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, NOT_SUPPORTED)
    r = await call(off, pull("OffT", 0, "amount >"))  # not even parsed, as RocketMQ
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, NOT_SUPPORTED)
    # a heartbeat is accepted, as RocketMQ accepts it (it also carries the client's other
    # groups); the group's pulls without the SUBSCRIPTION flag are refused like the others
    r = await off.call(RequestCode.HEART_BEAT, None, heartbeat_body("pushg", "OffT", "a > 1"))
    assert r.code == ResponseCode.SUCCESS
    r = await call(off, pull("OffT", 0, None, group="pushg", sys_flag=0x2))
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, NOT_SUPPORTED)


# --- enablePropertyFilter on ------------------------------------------------------------------


async def test_on_check_client_config_compiles_the_expression(on: Env) -> None:
    good = check_client_body("g", "T", "TAGS = 'paid' AND amount > 100")
    r = await on.call(RequestCode.CHECK_CLIENT_CONFIG, None, good)
    assert r.code == ResponseCode.SUCCESS, r.remark
    r = await on.call(
        RequestCode.CHECK_CLIENT_CONFIG, None, check_client_body("g", "T", "amount > 'x'")
    )
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert "line 1, column 8" in (r.remark or "")
    r = await on.call(RequestCode.CHECK_CLIENT_CONFIG, None, check_client_body("g", "T", "a = ("))
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert "line 1, column 6" in (r.remark or "") and "<EOF>" in (r.remark or "")


async def test_on_pull_with_the_expression_returns_only_matches(on: Env) -> None:
    await send_orders(on, "Orders")
    r = await call(on, pull("Orders", 0, "TAGS = 'paid' AND amount > 100"))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert bodies(r) == [b"m1"]
    assert r.ext_fields["nextBeginOffset"] == "5"
    r = await call(on, pull("Orders", 0, "region = 'eu' OR amount BETWEEN 290 AND 1000"))
    assert bodies(r) == [b"m1", b"m2", b"m3", b"m4"]
    r = await call(on, pull("Orders", 0, "TAGS IS NULL"))
    assert bodies(r) == [b"m4"]
    # nothing matched in what the pull scanned: 20, with the offset moved past it
    r = await call(on, pull("Orders", 0, "amount > 100000"))
    assert r.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert r.ext_fields["nextBeginOffset"] == "5"
    r = await call(on, pull("Orders", 5, "amount > 1"))
    assert r.code == ResponseCode.PULL_NOT_FOUND


async def test_on_a_bad_expression_in_a_pull_is_refused(on: Env) -> None:
    await send_orders(on, "BadT")
    r = await call(on, pull("BadT", 0, "amount >"))
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert "line 1, column 9" in (r.remark or "")
    r = await call(on, pull("BadT", 0, ""))
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED


async def test_on_push_pull_uses_the_heartbeat_subscription(on: Env) -> None:
    await send_orders(on, "PushT")
    r = await on.call(RequestCode.HEART_BEAT, None, heartbeat_body("pg2", "PushT", "amount < 100"))
    assert r.code == 0
    r = await call(on, pull("PushT", 0, None, group="pg2", sys_flag=0x2))
    assert bodies(r) == [b"m0"]
    # a heartbeat whose expression does not compile: the pull says so (RocketMQ's 27)
    r = await on.call(RequestCode.HEART_BEAT, None, heartbeat_body("pg3", "PushT", "amount <"))
    assert r.code == 0
    r = await call(on, pull("PushT", 0, None, group="pg3", sys_flag=0x2))
    assert r.code == ResponseCode.FILTER_DATA_NOT_EXIST
    assert (
        r.remark == "The broker's consumer filter data is not exist!Your expression may be wrong!"
    )


async def test_on_long_poll_answers_only_matching_arrivals(on: Env) -> None:
    await on.send("LPS", b"old", props={"k": "no"})
    got: list[RemotingCommand] = []

    async def poll(offset: int) -> None:
        got.append(await call(on, pull("LPS", offset, "k = 'yes'", sys_flag=0x6, suspend_ms=15000)))

    # nothing past offset 1: the pull parks; a non-matching arrival wakes it and the second
    # pass answers 20 past it (the Java client pulls again at once)
    async with trio.open_nursery() as n:
        n.start_soon(poll, 1)
        await trio.sleep(0.3)
        assert on.broker.controller.pull_hold.waiting_count("LPS", 0) == 1
        await on.send("LPS", b"miss", props={"k": "no"})
    assert got[-1].code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert got[-1].ext_fields["nextBeginOffset"] == "2"
    async with trio.open_nursery() as n:
        n.start_soon(poll, 2)
        await trio.sleep(0.3)
        await on.send("LPS", b"hit", props={"k": "yes"})
    assert got[-1].code == ResponseCode.SUCCESS
    assert bodies(got[-1]) == [b"hit"]


async def test_on_a_slave_filters_replicated_records(tmp_path: Path) -> None:
    written = [
        MessageExtBrokerInner(topic="Rep", queue_id=0, body=body, properties={"c": colour})
        for body, colour in [(b"r", "red"), (b"g", "green"), (b"r2", "red")]
    ]
    async with slave_holding(tmp_path, written, enable_property_filter=True) as (b, c):
        r = await c.invoke(b.addr, pull("Rep", 0, "c = 'red'"))
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert bodies(r) == [b"r", b"r2"]


async def test_expressions_are_cached_with_a_bound(on: Env) -> None:
    await send_orders(on, "Many")
    cache = on.broker.controller.consumer_filter_manager
    cache.max_entries = 8
    for i in range(40):
        r = await call(on, pull("Many", 0, f"amount > {i}"))
        assert r.code == ResponseCode.SUCCESS
    assert len(cache) == 8
