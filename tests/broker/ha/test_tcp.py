"""Real TCP on loopback: run_broker master + run_broker slave(s) with file stores replicate."""

from __future__ import annotations

import os

import attrs
import pytest
import trio

from broker.config import BrokerConfig
from broker.service import run_broker
from broker.store import MessageStoreConfig
from common.message import MessageExtBrokerInner

SEG = 1024 * 1024
N = 10_000


def broker_config(root, *, role="ASYNC_MASTER", broker_id=0, master_ha=None):
    return BrokerConfig(
        listen_port=0,
        broker_id=broker_id,
        store=MessageStoreConfig(
            store_path_root_dir=str(root),
            mapped_file_size_commit_log=SEG,
            broker_role=role,
            ha_master_address=master_ha,
        ),
    )


def message(i):
    return MessageExtBrokerInner(
        topic=f"HaTopic{i % 2}",
        queue_id=i % 4,
        body=(b"%06d" % i) * (20 + i % 40),
        properties={"KEYS": f"k{i}", "UNIQ_KEY": f"U{i:08d}"},
        born_timestamp=1_700_000_000_000 + i,
        born_host=("10.0.0.1", 1234),
        store_host=("127.0.0.1", 10911),
    )


async def wait_caught_up(slave_store, master_store, timeout=60.0):
    with trio.fail_after(timeout):
        while slave_store.get_max_phy_offset() < master_store.get_max_phy_offset():  # noqa: ASYNC110
            await trio.sleep(0.02)
    await slave_store.wait_dispatched()


def commit_log_files(root):
    d = root / "commitlog"
    return {name: (d / name).read_bytes() for name in sorted(os.listdir(d))}


def same_pulls(master_store, slave_store):
    for t in ("HaTopic0", "HaTopic1"):
        for q in range(4):
            mmax = master_store.get_max_offset_in_queue(t, q)
            assert slave_store.get_max_offset_in_queue(t, q) == mmax
            for off in range(0, mmax, 500):
                mr = master_store.get_message("g", t, q, off, 32)
                sr = slave_store.get_message("g", t, q, off, 32)
                assert sr.status == mr.status
                assert sr.next_begin_offset == mr.next_begin_offset
                assert [bytes(b) for b in sr.buffers] == [bytes(b) for b in mr.buffers]


@pytest.mark.slow
async def test_master_and_slave_over_tcp_replicate_byte_identical(tmp_path):
    mroot, sroot, lroot = tmp_path / "master", tmp_path / "slave", tmp_path / "late"
    async with trio.open_nursery() as n:
        master = await n.start(run_broker, broker_config(mroot, role="SYNC_MASTER"))
        assert master.ha_port and master.ha_port != master.port
        ha_addr = f"127.0.0.1:{master.ha_port}"
        slave_scope = trio.CancelScope()

        async def run_slave(root, scope, task_status=trio.TASK_STATUS_IGNORED):
            with scope:
                cfg = broker_config(root, role="SLAVE", broker_id=1, master_ha=ha_addr)
                await run_broker(cfg, task_status=task_status)

        slave = await n.start(run_slave, sroot, slave_scope)
        ha = master.controller.ha
        with trio.fail_after(10):
            while ha.watermark.connections < 1:  # noqa: ASYNC110
                await trio.sleep(0.01)
        mstore, sstore = master.store, slave.store
        ends = []
        for i in range(N):
            r = await mstore.put_message(message(i))
            assert r.ok, r
            ends.append(r.append.wrote_offset + r.append.wrote_bytes)
            if i % 1000 == 999:
                # a SYNC_MASTER send path wait on every 1000th message
                assert (await ha.wait_for_replica(ends[-1])).name == "PUT_OK"
        assert mstore.get_max_phy_offset() > 3 * SEG
        await wait_caught_up(sstore, mstore)
        same_pulls(mstore, sstore)
        info = ha.slaves()
        assert len(info) == 1 and info[0].ack_offset == mstore.get_max_phy_offset()
        assert ha.push2slave_max_offset == mstore.get_max_phy_offset()
        rt = ha.runtime_info()
        assert rt["haConnectionCount"] == "1" and rt["haSlave0LagBytes"] == "0"
        assert slave.controller.ha.runtime_info()["haClientConnected"] == "true"

        # a second slave started from an empty store begins at the master's last file
        late_scope = trio.CancelScope()
        late = await n.start(run_slave, lroot, late_scope)
        await wait_caught_up(late.store, mstore)
        last_file_start = mstore.get_max_phy_offset() // SEG * SEG
        assert late.store.get_min_phy_offset() == last_file_start
        late_scope.cancel()
        slave_scope.cancel()
        n.cancel_scope.cancel()
    # after a clean stop every file is flushed: the slave's CommitLog is the master's
    mfiles, sfiles, lfiles = (
        commit_log_files(mroot),
        commit_log_files(sroot),
        commit_log_files(lroot),
    )
    assert list(sfiles) == list(mfiles)
    for name in mfiles:
        assert sfiles[name] == mfiles[name], name
    assert list(lfiles) == [f"{last_file_start:020d}"]
    assert lfiles[f"{last_file_start:020d}"] == mfiles[f"{last_file_start:020d}"]


@pytest.mark.slow
async def test_slave_learns_master_from_nameserver_and_follows_a_restart(tmp_path):
    from common.model import TopicConfig
    from namesrv.config import NamesrvConfig
    from namesrv.service import run_namesrv

    mroot, sroot = tmp_path / "master", tmp_path / "slave"
    async with trio.open_nursery() as n:
        ns = await n.start(
            run_namesrv, NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kv.json"))
        )
        fast = dict(namesrv_addr=ns.addr, register_name_server_period=0.3)

        def cfg(root, **kw):
            base = broker_config(root, **{k: kw.pop(k) for k in ("role", "broker_id") if k in kw})
            return attrs.evolve(base, **fast, **kw)

        stopped: dict[str, trio.Event] = {}

        async def run_in(scope, config, task_status=trio.TASK_STATUS_IGNORED):
            done = stopped[str(config.store.store_path_root_dir)] = trio.Event()
            try:
                with scope:
                    await run_broker(config, task_status=task_status)
            finally:
                done.set()

        m_scope = trio.CancelScope()
        master = await n.start(run_in, m_scope, cfg(mroot, role="SYNC_MASTER"))
        slave = await n.start(
            run_in,
            trio.CancelScope(),
            cfg(
                sroot,
                role="SLAVE",
                broker_id=1,
                slave_sync_interval=0.5,
                slave_sync_initial_delay=0.1,
            ),
        )
        for i in range(100):
            assert (await master.store.put_message(message(i))).ok
        await wait_caught_up(slave.store, master.store)
        client = slave.controller.ha.client
        assert client.master_addr == f"127.0.0.1:{master.ha_port}"
        # metadata sync finds the master through the same registration answer
        master.controller.topic_config_manager.update_topic_config(TopicConfig("Synced", 2, 2))
        with trio.fail_after(10):
            while "Synced" not in slave.controller.topic_config_manager.table:  # noqa: ASYNC110
                await trio.sleep(0.05)

        # the master restarts on another port with the same store: the slave follows
        old_ha = master.ha_port
        m_scope.cancel()
        with trio.fail_after(10):
            # the old master has let go of its store (unregistered, flushed, unlocked)
            await stopped[str(mroot)].wait()
            while client.connected:  # noqa: ASYNC110
                await trio.sleep(0.05)
        master = await n.start(run_in, trio.CancelScope(), cfg(mroot, role="SYNC_MASTER"))
        assert master.ha_port != old_ha
        for i in range(100, 200):
            assert (await master.store.put_message(message(i))).ok
        await wait_caught_up(slave.store, master.store, timeout=30)
        assert client.master_addr == f"127.0.0.1:{master.ha_port}"
        same_pulls(master.store, slave.store)
        n.cancel_scope.cancel()
