"""HAService: runtime info per slave, master address from registration answers."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import trio
import trio.testing

from broker.ha.protocol import encode_report
from broker.ha.service import HAService, configured_master_address
from broker.ha.slave import HAClient
from broker.registrar import RegisterResult
from broker.store import MessageStoreConfig

if TYPE_CHECKING:
    from broker.store.api import MessageStore


async def test_per_slave_lag_in_bytes_and_time(open_store, mk, autojump_clock):
    async with open_store("m") as m:
        svc = HAService(m, m.config)
        for _ in range(3):
            assert (await m.put_message(mk(body=b"a" * 100))).ok
        end = m.get_max_phy_offset()
        a, b = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as n:
            n.start_soon(svc.master.serve_slave, a, "10.0.0.2:5555")
            await b.send_all(encode_report(end))
            await trio.sleep(1.0)
            (s,) = svc.slaves()
            assert (s.addr, s.ack_offset, s.lag_bytes, s.lag_seconds) == (
                "10.0.0.2:5555",
                end,
                0,
                0,
            )
            assert (await m.put_message(mk(body=b"b" * 100))).ok
            await trio.sleep(2.5)
            (s,) = svc.slaves()
            assert s.lag_bytes == m.get_max_phy_offset() - end
            assert s.lag_seconds == 3.5  # since the slave last held everything
            info = svc.runtime_info()
            assert info["push2SlaveMaxOffset"] == str(end)
            assert info["haConnectionCount"] == "1"
            assert info["haSlave0Addr"] == "10.0.0.2:5555"
            assert info["haSlave0LagBytes"] == str(s.lag_bytes)
            assert info["haSlave0LagMillis"] == "3500"
            assert "haMasterAddress" not in info  # a master has no HA client
            n.cancel_scope.cancel()
        assert svc.slaves() == [] and svc.runtime_info()["haConnectionCount"] == "0"


# the address tests never reach the store
NO_STORE = cast("MessageStore", None)


def client_of(svc: HAService) -> HAClient:
    assert svc.client is not None, "a slave's HAService has a client"
    return svc.client


def test_master_address_from_registration_answers(tmp_path):
    cfg = MessageStoreConfig(str(tmp_path), broker_role="SLAVE")
    svc = HAService(store=NO_STORE, config=cfg, is_slave=True)
    assert client_of(svc).master_addr is None
    svc.on_register_result(RegisterResult("ns:9876", "127.0.0.1:10911", "127.0.0.1:10912"))
    assert client_of(svc).master_addr == "127.0.0.1:10912"
    # an answer without a master (master gone from the nameserver) keeps the last address
    svc.on_register_result(RegisterResult("ns:9876", None, None))
    assert client_of(svc).master_addr == "127.0.0.1:10912"
    svc.on_register_result(RegisterResult("ns:9876", "127.0.0.1:20911", "127.0.0.1:20912"))
    assert client_of(svc).master_addr == "127.0.0.1:20912"


def test_configured_master_address_needs_six_characters(tmp_path):
    def addr(v):
        return configured_master_address(MessageStoreConfig(str(tmp_path), ha_master_address=v))

    assert addr(None) is None
    assert addr("a:1") is None
    assert addr(" 10.0.0.1:10912 ") == "10.0.0.1:10912"
    svc = HAService(
        NO_STORE,
        MessageStoreConfig(str(tmp_path), broker_role="SLAVE", ha_master_address="h:10912"),
        is_slave=True,
    )
    assert client_of(svc).master_addr == "h:10912"
    assert HAService(NO_STORE, MessageStoreConfig(str(tmp_path))).client is None
