"""grpcServerPort unset: RocketMQ 5's default 8081 is served when free; brokers of one host
started from 4.x broker.conf files (none names the port) keep starting when it is taken."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest
import trio

from broker import config as broker_config
from broker.config import BrokerConfig
from broker.service import BrokerHandle, address_in_use, run_broker
from broker.store import MessageStoreConfig
from broker.store.memory_store import run_memory_store
from cli.chaos.port_blocks import free_port_block

pytestmark = pytest.mark.timeout(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_listen_port() -> int:
    """A listen port whose block (VIP -2, HA +1) is free: the broker binds all three."""
    return free_port_block(10) + 2


async def start_broker(nursery: trio.Nursery, tmp_path: Path, **kw: object) -> BrokerHandle:
    """A broker on fixed loopback ports, as a broker.conf names them (listenPort set)."""
    config = BrokerConfig(
        listen_port=free_listen_port(),
        listen_host="127.0.0.1",
        store=MessageStoreConfig(store_path_root_dir=str(tmp_path)),
        **kw,  # type: ignore[arg-type]
    )
    handle: BrokerHandle = await nursery.start(
        lambda task_status: run_broker(
            config, store_factory=run_memory_store, task_status=task_status
        )
    )
    return handle


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> object:
    """The default gRPC port moved to one a listener of the test holds."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    monkeypatch.setattr(broker_config, "DEFAULT_GRPC_PORT", holder.getsockname()[1])
    yield holder
    holder.close()


async def test_a_taken_default_port_leaves_the_broker_serving_without_grpc(
    tmp_path: Path, taken: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="broker.service"):
        async with trio.open_nursery() as nursery:
            handle = await start_broker(nursery, tmp_path)
            assert handle.grpc_port is None
            nursery.cancel_scope.cancel()
    said = [r.getMessage() for r in caplog.records if "gRPC endpoint not served" in r.message]
    assert len(said) == 1 and "grpcServerPort" in said[0]


async def test_a_free_default_port_is_served(tmp_path: Path, taken: socket.socket) -> None:
    port = free_port()
    broker_config.DEFAULT_GRPC_PORT = port  # monkeypatched: undone after the test
    async with trio.open_nursery() as nursery:
        handle = await start_broker(nursery, tmp_path)
        assert handle.grpc_port == port
        nursery.cancel_scope.cancel()


async def test_a_taken_port_set_by_the_operator_stops_the_broker(
    tmp_path: Path, taken: socket.socket
) -> None:
    port = taken.getsockname()[1]
    with pytest.raises(BaseException) as raised:  # its leaves are checked below
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, tmp_path, grpc_server_port=port)
            nursery.cancel_scope.cancel()
    assert address_in_use(raised.value)
