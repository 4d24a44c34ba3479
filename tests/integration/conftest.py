"""DLedger groups as real processes, with a fault-injecting TCP proxy on every Raft link.

``dledger_group(n)`` (fixture ``dledger``) starts a nameserver and ``n`` brokers
(``python -m cli.servers.node broker -c <conf>``) forming one DLedger group ``broker-a``. Every
directed Raft link i -> j goes through its own :class:`LinkProxy` in the test's Trio loop: node i's
``dLegerPeers`` names node j at the proxy's port, and only node i itself at its real DLedger
port (where it binds).  So ``group.isolate("n0")`` cuts every link to and from n0 while n0 stays
reachable by the nameserver and the clients: a leader partitioned from both followers, as the
issue asks, without network namespaces.  ``heal()`` restores them.

Process control is by pid (``tests/conftest.py`` ``ProcessGroup``): ``kill`` is SIGKILL,
``restart`` starts the same config and store again.

``ns_and_broker`` runs a nameserver and a broker (file store) in the test's own loop on
127.0.0.1 (ports 0), for tests that write raw frames to both.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import pytest
import trio

from broker.config import BrokerConfig
from broker.service import BrokerHandle, run_broker
from broker.store import MessageStoreConfig
from cli.chaos.link_proxy import LinkProxy
from cli.chaos.port_blocks import free_port_block
from common.errors import RemotingError
from common.remoting.client import RemotingClient, open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.serde import loads
from namesrv.config import NamesrvConfig
from namesrv.service import NamesrvHandle, run_namesrv
from rmq import Admin

if TYPE_CHECKING:
    from tests.conftest import Node, ProcessGroup

# laptop timing (what `rmq up --dledger` uses): failure detected after 3 x 500 ms
FAST_TIMING = {
    "heartBeatTimeIntervalMs": 500,
    "maxHeartBeatLeak": 3,
    "minVoteIntervalMs": 150,
    "maxVoteIntervalMs": 400,
}


@attrs.define(eq=False)
class DLedgerGroupProcs:
    procs: ProcessGroup
    nursery: trio.Nursery
    ids: list[str]
    namesrv: Node | None = None
    nodes: dict[str, Node] = attrs.Factory(dict)  # id -> its process
    raft_ports: dict[str, int] = attrs.Factory(dict)
    broker_ports: dict[str, int] = attrs.Factory(dict)
    # (from, to) -> proxy
    links: dict[tuple[str, str], LinkProxy] = attrs.Factory(dict)
    extra: dict[str, object] = attrs.Factory(dict)

    @property
    def namesrv_addr(self) -> str:
        assert self.namesrv is not None, "start() first"
        return self.namesrv.addr

    def addr(self, node: str) -> str:
        return f"127.0.0.1:{self.broker_ports[node]}"

    async def start(self) -> None:
        self.namesrv = self.procs.namesrv()
        for i in self.ids:
            self.broker_ports[i] = free_port_block(4)
            self.raft_ports[i] = free_port_block(1)
        for a in self.ids:
            for b in self.ids:
                if a != b:
                    proxy = LinkProxy(self.raft_ports[b])
                    await self.nursery.start(proxy.serve)
                    self.links[(a, b)] = proxy
        for i in self.ids:
            self._spawn(i)

    def _peers(self, me: str) -> str:
        parts = []
        for j in self.ids:
            port = self.raft_ports[j] if j == me else self.links[(me, j)].port
            parts.append(f"{j}-127.0.0.1:{port}")
        return ";".join(parts)

    def _spawn(self, i: str) -> Node:
        node = self.procs.broker(
            f"broker-a-{i}",
            port=self.broker_ports[i],
            namesrvAddr=self.namesrv_addr,
            brokerClusterName="RaftCluster",
            enableDLegerCommitLog="true",
            dLegerGroup="broker-a",
            dLegerPeers=self._peers(i),
            dLegerSelfId=i,
            sendMessageThreadPoolNums=1,
            **{**FAST_TIMING, **self.extra},
        )
        self.nodes[i] = node
        return node

    def kill(self, i: str) -> None:
        self.nodes[i].kill()

    def restart(self, i: str) -> None:
        node = self.nodes[i]
        if node.proc.poll() is None:
            node.kill()
        self.procs.nodes.remove(node)
        self._spawn(i)

    def isolate(self, i: str) -> None:
        for (a, b), proxy in self.links.items():
            if i in (a, b):
                proxy.block()

    def heal(self) -> None:
        for proxy in self.links.values():
            proxy.unblock()

    async def runtime(
        self, client: RemotingClient, i: str, timeout: float = 2.0
    ) -> dict[str, str] | None:
        """The node's runtime info table, None when it does not answer."""
        try:
            r = await client.invoke(
                self.addr(i),
                RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}),
                timeout=timeout,
            )
        except Exception:
            client.close_channel(self.addr(i))
            return None
        if r.code != ResponseCode.SUCCESS:
            return None
        table: dict[str, str] = json.loads(r.body_bytes())["table"]
        return table

    async def create_topic(
        self, client: RemotingClient, topic: str, *, queues: int = 4, timeout: float = 30.0
    ) -> None:
        """Create ``topic`` on the group's master and wait until every member has it, so a
        failover never lands on a member that does not know it.  Followers copy topics from
        the master every 5 s: a change of leader before that loses the topic with the old
        leader's table (RocketMQ's behaviour too), and then it is created again on the new
        master.  A master that has it while a follower never learns it fails the wait."""
        with trio.fail_after(timeout):
            while True:
                async with Admin(self.namesrv_addr) as admin:
                    await admin.create_topic(topic, queues=queues, cluster="RaftCluster")
                if await self._topic_spreads(client, topic):
                    return
                await trio.sleep(0.2)

    async def _has_topic(self, client: RemotingClient, node: str, topic: str) -> bool | None:
        try:
            r = await client.invoke(
                self.addr(node), RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG, {})
            )
        except RemotingError:
            # a member elects over its Raft port before its broker port listens ("connection
            # refused" can come right after the leader is known), or is busy starting
            client.close_channel(self.addr(node))
            return None
        return topic in loads(r.body_bytes()).get("topicConfigTable", {})

    async def _topic_spreads(self, client: RemotingClient, topic: str) -> bool:
        """True once every member has ``topic``; False when the master does not (lost with a
        change of leader: create it again)."""
        while True:
            master = await self.master_addr(client)
            have = {i: await self._has_topic(client, i, topic) for i in self.ids}
            if all(have.values()):
                return True
            if master is not None and any(
                self.addr(i) == master and have[i] is False for i in self.ids
            ):
                return False
            await trio.sleep(0.2)

    async def master_addr(self, client: RemotingClient) -> str | None:
        """The nameserver's brokerId-0 address of broker-a, None when it has none."""
        try:
            r = await client.invoke(
                self.namesrv_addr,
                RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO, {}),
                timeout=2.0,
            )
        except Exception:
            client.close_channel(self.namesrv_addr)
            return None
        if r.code != ResponseCode.SUCCESS:
            return None
        table = loads(r.body_bytes()).get("brokerAddrTable", {})
        addrs = table.get("broker-a", {}).get("brokerAddrs", {})
        return addrs.get("0")

    async def leader(
        self,
        client: RemotingClient,
        *,
        timeout: float = 30.0,
        among: list[str] | None = None,
        master: bool = True,
    ) -> str:
        """The id of the one live node that says it leads; with ``master``, also wait until it
        serves as master (the nameserver lists it as brokerId 0)."""
        with trio.fail_after(timeout):
            while True:
                live = among or [i for i in self.ids if self.nodes[i].proc.poll() is None]
                for i in live:
                    info = await self.runtime(client, i, timeout=1.0)
                    if info and info.get("dledgerRole") == "LEADER":
                        if not master or await self.master_addr(client) == self.addr(i):
                            return i
                await trio.sleep(0.05)


# make(n=3, **broker.conf properties): a started DLedger group of n brokers
DLedgerFactory = Callable[..., Awaitable[DLedgerGroupProcs]]


@pytest.fixture
async def dledger_factory(
    procs: ProcessGroup, nursery: trio.Nursery
) -> AsyncIterator[DLedgerFactory]:
    async def make(n: int = 3, **extra: object) -> DLedgerGroupProcs:
        group = DLedgerGroupProcs(procs, nursery, [f"n{k}" for k in range(n)], extra=dict(extra))
        await group.start()
        return group

    yield make


@pytest.fixture
async def raft_client() -> AsyncIterator[RemotingClient]:
    async with open_remoting_client() as client:
        yield client


@pytest.fixture
async def ns_and_broker(
    tmp_path: Path, nursery: trio.Nursery
) -> tuple[NamesrvHandle, BrokerHandle]:
    """The handles (``.port``) of a nameserver and a broker registered with it, both in
    ``nursery``."""
    ns = await nursery.start(
        run_namesrv, NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kv.json"))
    )
    broker = await nursery.start(
        run_broker,
        BrokerConfig(
            listen_port=0,
            namesrv_addr=f"127.0.0.1:{ns.port}",
            store=MessageStoreConfig(store_path_root_dir=str(tmp_path / "store")),
        ),
    )
    return ns, broker
