"""The topic's route across the cluster, with each broker's gRPC endpoint (for QueryRoute).

A 5.x client must reach every queue at the gRPC endpoint of the node that serves it, and only
uses queues whose broker id is 0. The 4.x nameserver knows every broker's remoting address but
not its gRPC port, so this asks each master once: GET_BROKER_CONFIG's ``grpcServerPort`` (the
port it bound; the host is the one of its registered address), cached for ``CACHE_TTL``. The
topic's queues come from the nameserver's GET_ROUTEINFO_BY_TOPIC, so any node, a slave or a
DLedger follower included, answers the masters (or leaders) of every broker name of the topic.

Without a nameserver, or when it cannot be asked, the caller answers from this broker alone.
"""

from __future__ import annotations

import logging

import attrs
import trio

from common import serde
from common.errors import RmqError
from common.model import TopicRouteData
from common.remoting.client import RemotingClient
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.network import parse_addr

log = logging.getLogger(__name__)

CACHE_TTL = 60.0
TIMEOUT = 2.0


@attrs.frozen
class RoutedBroker:
    name: str
    host: str
    grpc_port: int


@attrs.define(eq=False)
class ClusterRoute:
    remoting: RemotingClient
    namesrv_addrs: list[str]
    # remoting address -> (gRPC port, when learned)
    _ports: dict[str, tuple[int, float]] = attrs.field(factory=dict, init=False)

    async def topic_route(self, topic: str) -> TopicRouteData | None:
        for addr in self.namesrv_addrs:
            try:
                answer = await self.remoting.invoke(
                    addr,
                    RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}),
                    TIMEOUT,
                )
            except RmqError as exc:
                log.info("route of %s from %s: %s", topic, addr, exc)
                continue
            if answer.code != ResponseCode.SUCCESS:
                return None
            try:
                return serde.from_json(answer.body_bytes(), TopicRouteData)
            except ValueError as exc:
                log.warning("route of %s from %s undecodable: %s", topic, addr, exc)
                return None
        return None

    async def grpc_port(self, remoting_addr: str) -> int | None:
        now = trio.current_time()
        cached = self._ports.get(remoting_addr)
        if cached is not None and now - cached[1] < CACHE_TTL:
            return cached[0]
        try:
            answer = await self.remoting.invoke(
                remoting_addr, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG), TIMEOUT
            )
        except RmqError as exc:
            log.info("gRPC port of %s: %s", remoting_addr, exc)
            return None
        if answer.code != ResponseCode.SUCCESS:
            return None
        port = None
        for line in answer.body_bytes().decode("utf-8", "replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "grpcServerPort" and value.strip().lstrip("-").isdigit():
                port = int(value.strip())
        if port is None or port <= 0:
            return None
        if len(self._ports) > 1024:
            self._ports.clear()
        self._ports[remoting_addr] = (port, now)
        return port

    async def masters(self, route: TopicRouteData) -> dict[str, RoutedBroker]:
        """Broker name -> its master's gRPC endpoint, for the names that have a master."""
        out: dict[str, RoutedBroker] = {}
        for data in route.brokerDatas:
            addr = data.brokerAddrs.get(0)
            if addr is None:
                continue
            port = await self.grpc_port(addr)
            if port is None:
                continue
            host, _ = parse_addr(addr)
            out[data.brokerName] = RoutedBroker(data.brokerName, host, port)
        return out
