"""Timer messages over the wire: as RocketMQ 5's Java client sends them (raw SEND_MESSAGE_V2
with TIMER_DELIVER_MS in header ``i``), and through our client's ``Message(deliver_at=...)``,
``Message(delay=...)`` and ``rmq produce --deliver-at / --delay-sec``; a consumer pulls them."""

from __future__ import annotations

import datetime
import sys
import time
import uuid
from typing import TYPE_CHECKING

import pytest
import trio
import typer

from cli.messages.commands import _deliver_at_ms
from cli.messages.produce import MessageTemplate, produce
from common import serde
from common.message_properties import encode_properties
from common.model import MessageQueue
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.topics import TIMER_TOPIC
from rmq import Message, Producer, PullConsumer, PullStatus
from rmq.errors import InvalidMessageError, RmqError

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster

pytestmark = pytest.mark.timeout(60)


def java5_send(topic: str, body: bytes, props: dict[str, str]) -> RemotingCommand:
    """SEND_MESSAGE_V2 as RocketMQ 5's DefaultMQProducer sends a message after
    ``msg.setDeliverTimeMs(t)``: TIMER_DELIVER_MS among the properties, WAIT and UNIQ_KEY."""
    uniq = uuid.uuid4().hex.upper()
    fields = {
        "a": "PG5",
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": "1",
        "f": "0",
        "g": "1700000000000",
        "h": "0",
        "i": encode_properties({**props, "WAIT": "true", "UNIQ_KEY": uniq}),
        "j": "0",
        "k": "false",
        "m": "false",
        "n": "broker-a",
    }
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, fields, body)


async def pull_all(c: PullConsumer, topic: str, qid: int) -> list[bytes]:
    r = await c.pull(MessageQueue(topic, "broker-a", qid), 0, 32)
    return [m.body for m in r.messages] if r.status is PullStatus.FOUND else []


async def test_java5_deliver_ms_is_pulled_at_its_time(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    c = memory_cluster
    await c.create_topic("T5", 4)
    timers = c.broker().controller.timer_service
    at = timers.clock_ms() + 20_000
    async with open_remoting_client(network=c.network) as client:
        r = await client.invoke(
            c.addr(), java5_send("T5", b"hello", {"TIMER_DELIVER_MS": str(at), "TAGS": "a"})
        )
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert r.ext_fields["queueId"] == "1"  # the queue asked for, as RocketMQ 5 answers
        far = timers.clock_ms() + 4 * 24 * 3600 * 1000
        r = await client.invoke(c.addr(), java5_send("T5", b"x", {"TIMER_DELIVER_MS": str(far)}))
        assert r.code == ResponseCode.MESSAGE_ILLEGAL
        assert r.remark is not None and r.remark.startswith("timer message illegal")
        r = await client.invoke(c.addr(), java5_send(TIMER_TOPIC, b"x", {}))
        assert r.code == ResponseCode.NO_PERMISSION  # the timer topic is the broker's own
    async with PullConsumer("CG5", c.namesrv, network=c.network) as consumer:
        await trio.sleep((at - timers.clock_ms()) / 1000 - 0.05)
        assert await pull_all(consumer, "T5", 1) == []
        await trio.sleep(1.1)
        assert await pull_all(consumer, "T5", 1) == [b"hello"]


async def test_our_client_deliver_at_and_delay(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    c = memory_cluster
    await c.create_topic("T6", 1)
    timers = c.broker().controller.timer_service
    t0 = timers.clock_ms()
    async with Producer("PG6", c.namesrv, network=c.network) as p:
        await p.send(Message("T6", b"at", deliver_at=t0 + 8000))
        await p.send(Message("T6", b"in", delay=4.0))
        with pytest.raises(RmqError, match="timer message illegal"):
            await p.send(Message("T6", b"never", delay=3 * 24 * 3600 + 60))
        with pytest.raises(InvalidMessageError):
            await p.send_batch([Message("T6", b"b", delay=1.0)])
        with pytest.raises(InvalidMessageError):
            Message("T6", b"x", delay=1.0, delay_level=2).validate()
    async with PullConsumer("CG6", c.namesrv, network=c.network) as consumer:
        await trio.sleep(3.5)
        assert await pull_all(consumer, "T6", 0) == []
        await trio.sleep(1.6)
        assert await pull_all(consumer, "T6", 0) == [b"in"]
        await trio.sleep(4)
        assert await pull_all(consumer, "T6", 0) == [b"in", b"at"]


async def test_cli_produce_delay_sec(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    c = memory_cluster
    await c.create_topic("T7", 1)
    async with open_remoting_client(network=c.network) as remoting:
        stats = await produce(
            c.namesrv,
            MessageTemplate("T7", delay=5.0),
            group="pg",
            bodies=(b"a", b"b"),
            handle_signals=False,
            remoting=remoting,
        )
    assert stats.sent == 2
    [rec1, rec2] = c.messages(TIMER_TOPIC, 0)
    assert rec1.properties["REAL_TOPIC"] == "T7" and rec1.properties["TIMER_DELAY_MS"] == "5000"
    assert c.messages("T7", 0) == []
    await trio.sleep(6.1)
    assert [m.body for m in c.messages("T7", 0)] == [b"a", b"b"]


def test_deliver_at_option_parses_epoch_ms_and_iso() -> None:
    assert _deliver_at_ms("1700000000000") == 1_700_000_000_000
    assert _deliver_at_ms("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert _deliver_at_ms(None) is None
    with pytest.raises(typer.BadParameter):
        _deliver_at_ms("tomorrow")
    aware = datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)
    assert Message("T", b"x", deliver_at=aware).deliver_at == 1_700_000_000_000


async def test_timer_service_runs_on_the_master_not_the_slave(
    memory_cluster: InProcessCluster, autojump_clock: trio.abc.Clock
) -> None:
    c = memory_cluster
    slave = await c.start_broker("broker-a-s", broker_id=1, store={"broker_role": "SLAVE"})
    await trio.sleep(0.5)
    assert c.broker().controller.timer_service.running
    assert not slave.controller.timer_service.running
    async with open_remoting_client(network=c.network) as client:
        r = await client.invoke(
            c.addr(), RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {})
        )
    table = serde.loads(r.body_bytes())["table"]
    assert table["timerCongestNum"] == "0" and table["timerOffsetBehind"] == "0"


async def test_rmq_produce_deliver_at_and_delay_sec_end_to_end(
    tcp_cluster: InProcessCluster,
) -> None:
    # the command itself, as a process, against a broker on TCP, on the real clock
    c = tcp_cluster
    await c.create_topic("T8", 1)
    at = int(time.time() * 1000) + 3000
    rmq = [sys.executable, "-m", "cli.main", "-n", c.namesrv, "produce", "-t", "T8"]
    for extra in (["--deliver-at", str(at), "at"], ["--delay-sec", "1.5", "in"]):
        done = await trio.run_process([*rmq, *extra], capture_stdout=True, capture_stderr=True)
        assert done.returncode == 0, done.stderr
    done = await trio.run_process(
        [*rmq, "--delay-sec", "1", "--transaction", "commit", "x"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode != 0 and b"cannot have a delivery time" in done.stderr
    # "at" is not there before its time (three processes may take the 3 s on a loaded machine:
    # then it may be; its store time is checked below either way)
    looked_at = time.time() * 1000
    early = [m.body for m in c.messages("T8", 0) if m.body == b"at"]
    assert not early or looked_at >= at
    # both come, each never before its time: a slot fires up to one precision (1 s) after the
    # asked time plus the service's latency (broker/timer/__init__.py), so the wait is polled
    with trio.fail_after(20):
        while True:
            got = c.messages("T8", 0)
            if sorted(m.body for m in got) == [b"at", b"in"]:
                break
            await trio.sleep(0.1)
    for m in got:
        if m.body == b"at":
            assert m.store_timestamp >= at
        else:
            assert m.store_timestamp >= m.born_timestamp + 1500
