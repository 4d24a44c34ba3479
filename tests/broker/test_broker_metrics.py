"""A broker's metrics port, scraped over HTTP as Prometheus does (broker/metrics_exporter.py).

The broker runs in process (file store, real TCP); requests go on the wire as the Java client
sends them (SEND_MESSAGE_V2, SEND_BATCH_MESSAGE, PULL_MESSAGE, UPDATE_CONSUMER_OFFSET), and the
figures are read back from the exposition text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from broker.broker_metrics import BrokerMetrics, message_type
from broker.service import BrokerHandle, run_broker
from common.batch_body import encode_batch_body
from common.message import decode_records
from common.message_properties import encode_properties
from common.mq_map import parse_mq_map
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from tests.broker.test_broker_service import Env, broker_config
from tests.conftest import free_port_block

pytestmark = pytest.mark.timeout(60)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(port: int) -> Samples:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        raw = b""
        while chunk := await stream.receive_some(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    out: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    assert len(found) == 1, (name, labels, found)
    return found[0]


@pytest.fixture
async def env(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Env]:
    port = free_port_block(10)
    config = broker_config(tmp_path, metrics_prom_exporter_port=port)
    handle: BrokerHandle = await nursery.start(run_broker, config)
    async with open_remoting_client() as client:
        yield Env(handle, client)


def test_message_type_follows_the_properties():
    assert message_type("") == "normal"
    assert message_type(encode_properties({"TAGS": "a", "DELAY": "3"})) == "delay"
    assert message_type(encode_properties({"TIMER_DELIVER_MS": "1"})) == "delay"
    assert message_type(encode_properties({"TRAN_MSG": "true", "PGROUP": "p"})) == "transaction"
    assert message_type(encode_properties({"__SHARDINGKEY": "k"})) == "fifo"
    assert message_type(encode_properties({"KEYS": "DELAY"})) == "normal"


def test_counting_is_per_put_not_per_message():
    m = BrokerMetrics()
    m.on_put("T", "", 100, 100 * 2000)
    row = m.puts[("T", "normal")]
    assert row[0] == 100 and row[1] == 200_000
    assert sum(row[2:-1]) == 1  # one size observation for the batch: its mean, 2000 B
    assert row[3] == 1


async def test_in_out_lag_inflight_ready_as_the_wire_sees_them(env: Env) -> None:
    port = env.broker.metrics.port if env.broker.metrics else 0
    for i in range(3):
        assert (await env.send("MT", b"m%d" % i, queue_id=0, v2=True)).code == 0
    body = encode_batch_body([(0, b"b%d" % i, {"UNIQ_KEY": f"B{i}"}) for i in range(4)])
    ext = {"a": "pg", "b": "MT", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 0, "h": 0}
    ext.update({"i": encode_properties({"WAIT": "true"}), "m": True})
    assert (await env.call(RequestCode.SEND_BATCH_MESSAGE, ext, body)).code == 0
    delayed = await env.send("MT", b"later", queue_id=1, props={"DELAY": "1"}, v2=True)
    assert delayed.code == 0

    # the group pulls 5 of queue 0's 7 and commits 2
    pulled = await env.pull("MT", 0, 0, group="G", max_nums=5)
    assert pulled.code == ResponseCode.SUCCESS
    commit = RemotingCommand.request(
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": "G", "topic": "MT", "queueId": 0, "commitOffset": 2},
    )
    assert (await env.client.invoke(env.addr, commit, timeout=5)).code == 0
    # the consumer gives up on the first one: CONSUMER_SEND_MSG_BACK with delay level -1 (DLQ)
    first = decode_records(pulled.body_bytes())[0]
    back = RemotingCommand.request(
        RequestCode.CONSUMER_SEND_MSG_BACK,
        {"group": "G", "offset": first.commit_log_offset, "delayLevel": -1, "originTopic": "MT"},
    )
    assert (await env.client.invoke(env.addr, back, timeout=5)).code == 0

    s = await scrape(port)
    common = {"cluster": "DefaultCluster", "node_type": "broker", "node_id": "broker-a"}
    assert value(s, "rocketmq_messages_in_total", topic="MT", message_type="normal", **common) == 7
    assert value(s, "rocketmq_message_size_count", topic="MT", message_type="normal") == 4
    assert value(s, "rocketmq_messages_in_total", topic="MT", message_type="delay") == 1
    out = {"topic": "MT", "consumer_group": "G", "is_retry": "false"}
    assert value(s, "rocketmq_messages_out_total", **out) == 5
    assert value(s, "rocketmq_throughput_out_total", **out) > 5 * 20
    # lag as GET_CONSUME_STATS counts it: queue 0 has 7, the group committed 2; the other
    # queues of MT have no committed offset (0) and queue 1 holds nothing yet (the delayed
    # message waits in SCHEDULE_TOPIC_XXXX)
    stats = await env.call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "G", "topic": "MT"})
    assert stats.code == 0
    _, queues = parse_mq_map(stats.body_bytes(), "offsetTable")
    progress_lag = sum(max(q["brokerOffset"] - q["consumerOffset"], 0) for _, q in queues)
    lag = value(s, "rocketmq_consumer_lag_messages", topic="MT", consumer_group="G")
    assert lag == progress_lag == 5
    assert value(s, "rocketmq_consumer_inflight_messages", topic="MT", consumer_group="G") == 3
    assert value(s, "rocketmq_consumer_ready_messages", topic="MT", consumer_group="G") == 2
    assert value(s, "rocketmq_consumer_lag_latency", topic="MT", consumer_group="G") >= 0
    assert value(s, "rocketmq_send_to_dlq_messages_total", topic="MT", consumer_group="G") == 1
    send = {"request_code": "send_message_v2", "response_code": "success"}
    assert value(s, "rocketmq_rpc_latency_count", protocol_type="remoting", **send) == 4
    assert value(s, "rocketmq_rpc_latency_count", request_code="send_batch_message") == 1
    assert value(s, "rocketmq_topic_number", **common) >= 1
    assert value(s, "rocketmq_storage_size") > 0
    assert value(s, "rocketmq_storage_put_refused", reason="disk_full") == 0
    assert 0 <= value(s, "rocketmq_storage_disk_used_ratio") <= 1
    assert value(s, "rocketmq_server_connections") >= 1
    assert value(s, "process_resident_memory_bytes") > 0


async def test_off_by_default(tmp_path: Path, nursery: trio.Nursery) -> None:
    handle: BrokerHandle = await nursery.start(run_broker, broker_config(tmp_path))
    assert handle.metrics is None
    assert handle.controller.metrics is None
