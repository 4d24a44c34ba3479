"""Registration with nameservers: period, immediate re-registration, CRC, unregister."""

from __future__ import annotations

import contextlib
import zlib
from pathlib import Path

import trio
import trio.testing

from broker.config import BrokerConfig
from broker.registrar import BrokerRegistrar, RegisterResult
from broker.service import run_broker
from broker.store import MessageStoreConfig, run_memory_store
from common import serde
from common.model import RegisterBrokerBody
from common.remoting.channel import Channel
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.server import RequestDispatcher, handle_stream, serve_remoting


class FakeNamesrv:
    def __init__(self, *, master: str | None = None) -> None:
        self.calls: list[RemotingCommand] = []
        self.changed = trio.Event()
        self.dispatcher = RequestDispatcher()
        self.master = master
        self.dispatcher.register(RequestCode.REGISTER_BROKER, self.on_request)
        self.dispatcher.register(RequestCode.UNREGISTER_BROKER, self.on_request)

    async def on_request(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        self.calls.append(cmd)
        self.changed.set()
        self.changed = trio.Event()
        ext = {"masterAddr": self.master, "haServerAddr": "10.0.0.1:10912"} if self.master else None
        return cmd.response(ResponseCode.SUCCESS, None, ext)

    def codes(self) -> list[int]:
        return [c.code for c in self.calls]


async def test_registrar_period_wake_and_crc(autojump_clock: trio.abc.Clock) -> None:
    ns_a, ns_b = FakeNamesrv(), FakeNamesrv(master="10.0.0.1:10911")

    async with trio.open_nursery() as servers:

        async def connect(addr: str) -> trio.abc.Stream:
            if addr == "dead:1":
                raise OSError("connection refused")
            client_side, server_side = trio.testing.memory_stream_pair()
            ns = ns_a if addr == "a:1" else ns_b
            servers.start_soon(handle_stream, server_side, ns.dispatcher)
            return client_side

        body = b'{"topicConfigSerializeWrapper":{"topicConfigTable":{}},"filterServerList":[]}'
        async with open_remoting_client(connect=connect) as client:
            results: list[RegisterResult] = []
            reg = BrokerRegistrar(
                client,
                ["a:1", "dead:1", "b:1"],
                lambda: {
                    "brokerName": "bk",
                    "brokerAddr": "127.0.0.1:10911",
                    "clusterName": "C",
                    "haServerAddr": "127.0.0.1:10912",
                    "brokerId": "1",
                },
                lambda: body,
                on_result=results.append,
            )
            async with trio.open_nursery() as n:
                t0 = trio.current_time()
                await n.start(reg.run)
                assert ns_a.codes() == [RequestCode.REGISTER_BROKER]
                assert ns_b.codes() == [RequestCode.REGISTER_BROKER]
                first = ns_a.calls[0]
                assert first.ext_fields["bodyCrc32"] == str(zlib.crc32(body) & 0x7FFFFFFF)
                assert first.ext_fields["brokerId"] == "1"
                assert first.ext_fields["compressed"] == "false"
                assert first.body_bytes() == body
                assert reg.master_addr == "10.0.0.1:10911"
                assert reg.ha_master_addr == "10.0.0.1:10912"
                # periodic: the next round 30 s later
                await ns_a.changed.wait()
                assert trio.current_time() - t0 == 30.0
                # an immediate round on request
                t1 = trio.current_time()
                reg.request_register()
                await ns_a.changed.wait()
                assert trio.current_time() - t1 < 1.0
                assert len(ns_a.calls) == 3
                n.cancel_scope.cancel()
            await reg.unregister_all()
            assert ns_a.codes()[-1] == RequestCode.UNREGISTER_BROKER
            assert ns_a.calls[-1].ext_fields["brokerName"] == "bk"
        servers.cancel_scope.cancel()


async def test_run_broker_registers_on_start_topic_change_and_unregisters(
    tmp_path: Path,
) -> None:
    ns = FakeNamesrv()
    async with trio.open_nursery() as outer:
        h = await outer.start(serve_remoting, ns.dispatcher, "127.0.0.1", 0)
        cfg = BrokerConfig(
            listen_port=0,
            namesrv_addr=f"127.0.0.1:{h.port}",
            store=MessageStoreConfig(store_path_root_dir=tmp_path),
        )
        with trio.fail_after(10):
            async with trio.open_nursery() as n:
                broker = await n.start(
                    lambda task_status: run_broker(
                        cfg, store_factory=run_memory_store, task_status=task_status
                    )
                )
                assert ns.codes() == [RequestCode.REGISTER_BROKER]
                reg = ns.calls[0]
                assert reg.ext_fields["brokerAddr"] == f"127.0.0.1:{broker.port}"
                assert reg.ext_fields["haServerAddr"].startswith("127.0.0.1:")
                w = serde.from_json(reg.body_bytes(), RegisterBrokerBody)
                assert "TBW102" in w.topicConfigSerializeWrapper.topicConfigTable
                # creating a topic re-registers at once
                async with open_remoting_client() as client:
                    ext = {
                        "topic": "Created",
                        "defaultTopic": "TBW102",
                        "readQueueNums": 2,
                        "writeQueueNums": 2,
                        "perm": 6,
                        "topicFilterType": "SINGLE_TAG",
                    }
                    r = await client.invoke(
                        broker.addr,
                        RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, ext),
                    )
                    assert r.code == 0  # answered once topics.json is on disk

                def last_registered() -> dict:
                    last = serde.from_json(ns.calls[-1].body_bytes(), RegisterBrokerBody)
                    return last.topicConfigSerializeWrapper.topicConfigTable

                # the re-registration may come before or after that answer
                while "Created" not in last_registered():
                    await ns.changed.wait()
                n.cancel_scope.cancel()
        assert ns.codes()[-1] == RequestCode.UNREGISTER_BROKER
        outer.cancel_scope.cancel()
    # topics.json survived for the next start
    assert "Created" in (tmp_path / "config" / "topics.json").read_text()


async def test_failed_nameserver_is_retried_quickly_with_backoff(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A nameserver that is not up yet gets the registration soon after it starts listening
    (not a period later); retries back off to the period and leave healthy nameservers alone."""
    ns_up, ns_late = FakeNamesrv(), FakeNamesrv()
    attempts: list[float] = []  # trio times of connect attempts to the late nameserver
    late_from = 1.0  # the late nameserver listens from this trio time on

    async with trio.open_nursery() as servers:

        async def connect(addr: str) -> trio.abc.Stream:
            ns = ns_up
            if addr == "late:1":
                attempts.append(trio.current_time() - t0)
                if trio.current_time() - t0 < late_from:
                    raise OSError("connection refused")
                ns = ns_late
            client_side, server_side = trio.testing.memory_stream_pair()
            servers.start_soon(handle_stream, server_side, ns.dispatcher)
            return client_side

        async with open_remoting_client(connect=connect) as client:
            reg = BrokerRegistrar(
                client,
                ["up:1", "late:1"],
                lambda: {
                    "brokerName": "bk",
                    "brokerAddr": "127.0.0.1:10911",
                    "clusterName": "C",
                    "haServerAddr": "",
                    "brokerId": "0",
                },
                lambda: b"{}",
            )
            t0 = trio.current_time()
            async with trio.open_nursery() as n:
                await n.start(reg.run)
                assert ns_up.codes() == [RequestCode.REGISTER_BROKER]
                assert ns_late.codes() == []
                await ns_late.changed.wait()
                # refused at 0, 0.2, 0.6; registered at 1.4 (the first retry after 1.0)
                assert [round(t, 6) for t in attempts] == [0.0, 0.2, 0.6, 1.4]
                assert round(trio.current_time() - t0, 6) == 1.4
                # the healthy nameserver saw no extra round
                assert ns_up.codes() == [RequestCode.REGISTER_BROKER]
                # both back on the plain period: the next round at 30 s for both
                await ns_up.changed.wait()
                assert trio.current_time() - t0 == 30.0
                await trio.sleep(0.1)
                assert len(ns_late.calls) == 2
                n.cancel_scope.cancel()
        servers.cancel_scope.cancel()


async def test_retry_delay_doubles_up_to_the_period(autojump_clock: trio.abc.Clock) -> None:
    attempts: list[float] = []

    async def connect(addr: str) -> trio.abc.Stream:
        attempts.append(trio.current_time())
        raise OSError("connection refused")

    async with open_remoting_client(connect=connect) as client:
        reg = BrokerRegistrar(
            client,
            ["dead:1"],
            lambda: {
                "brokerName": "bk",
                "brokerAddr": "a:1",
                "clusterName": "C",
                "haServerAddr": "",
                "brokerId": "0",
            },
            lambda: b"{}",
            period=10.0,
        )
        with trio.move_on_after(60):
            await reg.run()
    gaps = [round(b - a, 6) for a, b in zip(attempts, attempts[1:], strict=False)]
    # retries at 0.2, 0.6, 1.4, 3.0, 6.2; the periodic round at 10 fails too and the backoff
    # reaches the period, so from then on one attempt per period
    assert gaps[:6] == [0.2, 0.4, 0.8, 1.6, 3.2, 3.8]
    assert set(gaps[6:]) == {10.0}
    assert len(attempts) == 11  # 0 .. 6.2, then 10, 20, ..., 50


@contextlib.asynccontextmanager
async def slave_registrar(ns, on_result):
    """A slave's (brokerId 1) registrar talking to ``ns`` over in-memory streams."""
    async with trio.open_nursery() as servers:

        async def connect(addr: str) -> trio.abc.Stream:
            client_side, server_side = trio.testing.memory_stream_pair()
            servers.start_soon(handle_stream, server_side, ns.dispatcher)
            return client_side

        async with open_remoting_client(connect=connect) as client:
            yield BrokerRegistrar(
                client,
                ["ns:1"],
                lambda: {
                    "brokerName": "bk",
                    "brokerAddr": "127.0.0.1:10921",
                    "clusterName": "C",
                    "haServerAddr": "",
                    "brokerId": "1",
                },
                lambda: b"{}",
                on_result=on_result,
            )
        servers.cancel_scope.cancel()


async def test_slave_asks_again_soon_until_the_nameserver_knows_its_master(
    autojump_clock: trio.abc.Clock,
) -> None:
    ns = FakeNamesrv()  # answers without masterAddr until the master "registers"
    learned: list[str | None] = []
    async with slave_registrar(ns, lambda r: learned.append(r.master_addr)) as reg:
        t0 = trio.current_time()
        async with trio.open_nursery() as n:
            await n.start(reg.run)
            assert reg.master_addr is None
            await trio.sleep(0.5)  # the master registers 0.5 s after the slave
            ns.master = "127.0.0.1:10911"
            await ns.changed.wait()
            await trio.testing.wait_all_tasks_blocked()  # the answer is processed
            # asked at 0, 0.2, 0.6: learned at the first answer after the master came
            assert round(trio.current_time() - t0, 6) == 0.6
            assert reg.master_addr == "127.0.0.1:10911"
            assert learned == [None, None, "127.0.0.1:10911"]
            # then only the plain period (30 s after the first round)
            await ns.changed.wait()
            assert round(trio.current_time() - t0, 6) == 30.0
            n.cancel_scope.cancel()


async def test_slave_whose_master_starts_late_keeps_asking_every_two_seconds(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A master that comes up 20 s after its slave (a loaded machine) is found within the cap,
    not after the doubling has grown to half a period."""
    ns = FakeNamesrv()
    asked: list[float] = []
    async with slave_registrar(ns, lambda r: asked.append(round(trio.current_time(), 6))) as reg:
        t0 = trio.current_time()
        async with trio.open_nursery() as n:
            await n.start(reg.run)
            await trio.sleep(20)
            ns.master = "127.0.0.1:10911"
            while reg.master_addr is None:
                await ns.changed.wait()
                await trio.testing.wait_all_tasks_blocked()
            assert trio.current_time() - t0 <= 22.0
            gaps = [round(b - a, 6) for a, b in zip(asked, asked[1:], strict=False)]
            assert gaps[:4] == [0.2, 0.4, 0.8, 1.6]
            assert set(gaps[4:]) == {2.0}
            n.cancel_scope.cancel()
