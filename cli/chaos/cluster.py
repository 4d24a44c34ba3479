"""The chaos harness's cluster: real server processes, every replication link through a proxy.

Modes: ``sync`` (SYNC_MASTER + slave), ``async`` (ASYNC_MASTER + slave) and ``dledger`` (three
DLedger members), each with a nameserver.  Every process is ``python -m cli.servers.node`` with
its own ports, store and log under ``root``, and is controlled by pid: SIGKILL and a restart on
the same store, SIGSTOP / SIGCONT.  The slave reaches its master's HA port, and each DLedger
member each other member, through a :class:`~cli.chaos.link_proxy.LinkProxy`, so a partition is
a blocked proxy; clients and the nameserver still reach every node.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import trio

from cli.chaos.disk import DiskControl, Tear, segment_dirs, tear_tail
from cli.chaos.link_proxy import LinkFault, LinkProxy
from cli.chaos.port_blocks import free_port_block
from cli.chaos.schedule import brokers_of
from common.remoting.client import RemotingClient
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand

MODES = ("sync", "async", "dledger")
# failure detection in DLedger mode after 3 x 300 ms (a short run needs fast elections)
_RAFT_TIMING = {
    "heartBeatTimeIntervalMs": "300",
    "maxHeartBeatLeak": "3",
    "minVoteIntervalMs": "100",
    "maxVoteIntervalMs": "300",
}


@attrs.define(eq=False)
class Proc:
    """One server process, started again with the same arguments after a kill."""

    name: str
    args: list[str]
    port: int
    log: Path
    # environment additions (the disk shim's, for a broker)
    env: dict[str, str] = attrs.Factory(dict)
    popen: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "cli.servers.node", *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )
        self.paused = False

    async def _wait(self, timeout: float) -> bool:
        """True once the process has exited, within ``timeout`` seconds (in a worker thread:
        ``wait`` blocks)."""
        popen = self.popen
        assert popen is not None

        def wait() -> bool:
            try:
                popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return False
            return True

        return await trio.to_thread.run_sync(wait)

    async def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            await self._wait(10)

    def pause(self) -> None:
        if self.alive:
            assert self.popen is not None
            self.popen.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.popen is not None and self.paused:
            self.popen.send_signal(signal.SIGCONT)
        self.paused = False

    async def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.resume()
        self.popen.send_signal(signal.SIGCONT)
        self.popen.terminate()
        if not await self._wait(10):
            self.popen.kill()
            await self._wait(10)


@attrs.define(eq=False)
class ChaosCluster:
    root: Path
    mode: str
    # extra broker.conf properties for every broker (the checker's own test breaks one)
    broker_extra: dict[str, str] = attrs.Factory(dict)
    procs: dict[str, Proc] = attrs.Factory(dict)
    # the compiled disk shim every broker runs under (disk.py); None: no disk faults
    shim: Path | None = None
    # node -> the proxies of its replication links (both directions)
    links: dict[str, list[LinkProxy]] = attrs.Factory(dict)
    # two brokers -> the proxies between them (both directions)
    pairs: dict[frozenset[str], list[LinkProxy]] = attrs.Factory(dict)
    # broker -> its disk shim's control file
    disks: dict[str, DiskControl] = attrs.Factory(dict)

    @property
    def brokers(self) -> list[str]:
        return [n for n in self.procs if n != "namesrv"]

    async def start(self, nursery: trio.Nursery) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: expected one of {', '.join(MODES)}")
        self.root.mkdir(parents=True, exist_ok=True)
        ns_port = free_port_block(4) + 1
        self._add(
            "namesrv",
            ["namesrv", "--port", str(ns_port), "--data-dir", str(self.root / "ns")],
            ns_port,
        )
        common = {
            "brokerName": "broker-a",
            "brokerClusterName": "ChaosCluster",
            "namesrvAddr": f"127.0.0.1:{ns_port}",
            "mapedFileSizeCommitLog": str(4 << 20),
            # the disk check every 0.5 s, not 10: a full disk's end is noticed at once, so the
            # recovery measured is the broker's, not the check's period
            "cleanResourceInterval": "500",
            # the full-disk fault reads 95% used, over diskSpaceCleanForciblyRatio: a forced
            # clean would delete segments, and the checker, reading everything back at the end,
            # would count those messages lost; this fault is about refusal and recovery
            # (retention has its own tests)
            "cleanFileForciblyEnable": "false",
            **self.broker_extra,
        }
        if self.mode == "dledger":
            await self._dledger(nursery, common)
        else:
            await self._pair(nursery, common)
        for proc in self.procs.values():
            proc.start()

    async def _pair(self, nursery: trio.Nursery, common: dict[str, str]) -> None:
        master_port, slave_port = free_port_block(4), free_port_block(4)
        ha = LinkProxy(master_port + 1)  # the master's HA port is listenPort + 1
        await nursery.start(ha.serve)
        self.links = {"master": [ha], "slave": [ha]}
        self.pairs = {frozenset(("master", "slave")): [ha]}
        role = "SYNC_MASTER" if self.mode == "sync" else "ASYNC_MASTER"
        self._broker("master", master_port, {**common, "brokerId": "0", "brokerRole": role})
        self._broker(
            "slave",
            slave_port,
            {
                **common,
                "brokerId": "1",
                "brokerRole": "SLAVE",
                "haMasterAddress": f"127.0.0.1:{ha.port}",
            },
        )

    async def _dledger(self, nursery: trio.Nursery, common: dict[str, str]) -> None:
        ids = list(brokers_of("dledger"))
        broker_ports = {i: free_port_block(4) for i in ids}
        raft_ports = {i: free_port_block(1) for i in ids}
        proxies: dict[tuple[str, str], LinkProxy] = {}
        for a in ids:
            for b in ids:
                if a != b:
                    proxies[(a, b)] = proxy = LinkProxy(raft_ports[b])
                    await nursery.start(proxy.serve)
        self.links = {i: [p for (a, b), p in proxies.items() if i in (a, b)] for i in ids}
        self.pairs = {frozenset((a, b)): [proxies[(a, b)], proxies[(b, a)]] for a, b in proxies}
        for i in ids:
            peers = ";".join(
                f"{j}-127.0.0.1:{raft_ports[j] if j == i else proxies[(i, j)].port}" for j in ids
            )
            conf = {
                **common,
                "enableDLegerCommitLog": "true",
                "dLegerGroup": "broker-a",
                "dLegerPeers": peers,
                "dLegerSelfId": i,
                **_RAFT_TIMING,
            }
            self._broker(i, broker_ports[i], conf)

    def _broker(self, name: str, port: int, conf: dict[str, str]) -> None:
        data = self.root / name
        conf = {**conf, "listenPort": str(port), "storePathRootDir": str(data)}
        path = self.root / f"{name}.conf"
        path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        env = {}
        if self.shim is not None:
            disk = self.disks[name] = DiskControl(self.root / f"{name}.disk")
            disk.ok()
            env = disk.env(self.shim)
        self._add(name, ["broker", "-c", str(path)], port, env)

    def _add(
        self, name: str, args: list[str], port: int, env: dict[str, str] | None = None
    ) -> None:
        self.procs[name] = Proc(name, args, port, self.root / f"{name}.log", dict(env or {}))

    # --- faults -------------------------------------------------------------------------------

    def partition(self, node: str) -> None:
        for proxy in self.links.get(node, ()):
            proxy.block()

    def degrade(self, a: str, b: str, fault: LinkFault) -> None:
        """Delay or lose chunks on the links between brokers ``a`` and ``b``."""
        for proxy in self.pairs[frozenset((a, b))]:
            proxy.degrade(fault)

    def heal(self) -> None:
        """Every link unblocked and undegraded."""
        for proxies in self.links.values():
            for proxy in proxies:
                proxy.unblock()

    def disk(self, node: str) -> DiskControl:
        if node not in self.disks:
            raise RuntimeError("disk faults need the cluster started with a shim")
        return self.disks[node]

    async def tear(self, node: str, size: int, fill: str, seed: int) -> list[Tear]:
        """Tear the newest segments' tails of a stopped broker (disk.py)."""
        proc = self.procs[node]
        if proc.alive:
            raise RuntimeError(f"{node} is running: tear its store only between kill and start")
        dirs = segment_dirs(self.root / node, node, self.mode == "dledger")
        tears = []
        for d in dirs:
            tear = await trio.to_thread.run_sync(tear_tail, d, size, fill, seed)
            if tear is not None:
                tears.append(tear)
        return tears

    def restore_all(self) -> None:
        """Every fault ended: links healed, disks well, paused nodes resumed, dead nodes
        started."""
        self.heal()
        for disk in self.disks.values():
            disk.ok()
        for proc in self.procs.values():
            proc.resume()
            if not proc.alive:
                proc.start()

    async def stop(self) -> None:
        """Stop every process at once (one after another could outlast the caller's bound)."""
        async with trio.open_nursery() as nursery:
            for proc in self.procs.values():
                nursery.start_soon(proc.stop)

    def log_tails(self, lines: int) -> Iterator[str]:
        """The last ``lines`` lines of every node's log, for a report; called while the nodes
        still run, so it says which were up."""
        for name, proc in self.procs.items():
            rc = None if proc.popen is None else proc.popen.poll()
            yield f"  {name} ({'running' if rc is None else f'exit {rc}'}), {proc.log}:"
            try:
                with open(proc.log, "rb") as f:
                    f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
                    tail = f.read().decode(errors="replace").splitlines()[-lines:]
            except OSError as exc:
                tail = [f"(no log: {exc.strerror})"]
            yield from (f"    {line}" for line in tail)

    # --- where to send ------------------------------------------------------------------------

    async def writer(self, client: RemotingClient) -> str | None:
        """The address that takes writes now: the master, or the DLedger leader."""
        if self.mode != "dledger":
            return self.procs["master"].addr
        for name in self.brokers:
            proc = self.procs[name]
            if not proc.alive or proc.paused:
                continue
            try:
                r = await client.invoke(
                    proc.addr,
                    RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}),
                    timeout=0.5,
                )
            except Exception:
                client.close_channel(proc.addr)
                continue
            if r.code == ResponseCode.SUCCESS:
                table = json.loads(r.body_bytes())["table"]
                if table.get("dledgerRole") == "LEADER":
                    return proc.addr
        return None
