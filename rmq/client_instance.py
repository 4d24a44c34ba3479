"""What Producer, PullConsumer and Admin share: nameservers, routes, broker addresses.

Theory of operation (MQClientInstance in the Java client, minus its thread zoo):

* Nameservers: "a:9876;b:9876". Requests stick to one nameserver and move to the next only on a
  transport error (connect/timeout/send), as the Java client's `invokeSync` over its namesrv
  list does. Response codes (e.g. 17 TOPIC_NOT_EXIST) are answers, not failures: no failover.
* Routes are cached per topic with the Trio time they were fetched. A route older than
  `route_max_age` (30 s, Java's pollNameServerInterval) is fetched again when next used, and
  any retriable send/pull failure invalidates the topic's route. So no background task is
  needed and nothing outlives the `async with`; a route in use is never older than 30 s.
* Broker addresses (brokerName -> {brokerId: addr}) are the union of every fetched route, so
  a queue of any known topic can be mapped to its master (publish) or to the node the broker
  suggested (subscribe).

`ClientBase` is the async-context-manager shell of the three public clients: it opens (or
borrows) one RemotingClient and closes it on exit, unwrapping single-exception groups so a
user's own exception leaves `async with Producer(...)` as itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import trio

from common.errors import (
    RemotingConnectError,
    RemotingSendError,
    RemotingTimeoutError,
    unwrap_group,
)
from common.model import TopicRouteData
from rmq.client_api import ClientAPI
from rmq.errors import BrokerNotFoundError, ClientError
from rmq.topic_publish_info import find_broker_addr_in_subscribe

T = TypeVar("T")

ROUTE_MAX_AGE = 30.0
_NAMESRV_FAILOVER = (RemotingConnectError, RemotingTimeoutError, RemotingSendError)


def parse_namesrv(namesrv: str | list[str]) -> list[str]:
    items = namesrv.split(";") if isinstance(namesrv, str) else list(namesrv)
    addrs = [a.strip() for a in items if a.strip()]
    if not addrs:
        raise ClientError("no nameserver address given (expected 'host:port[;host:port]')")
    for addr in addrs:
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ClientError(f"bad nameserver address {addr!r} (expected host:port)")
    return addrs


@attrs.define(eq=False)
class ClientInstance:
    remoting: Any
    namesrv_addrs: list[str]
    timeout: float = 3.0
    route_max_age: float = ROUTE_MAX_AGE
    api: ClientAPI = attrs.field(init=False)
    # index into namesrv_addrs of the nameserver that answered last; moves only on failures
    _ns_index: int = attrs.field(default=0, init=False)
    # topic -> (route, trio time fetched); entries are replaced whole, never mutated
    _routes: dict[str, tuple[TopicRouteData, float]] = attrs.field(factory=dict, init=False)
    # brokerName -> {brokerId: addr}, refreshed from every fetched route
    _brokers: dict[str, dict[int, str]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        self.api = ClientAPI(self.remoting)

    async def invoke_namesrv(self, call: Callable[[str], Awaitable[T]]) -> T:
        """Run `call(addr)` on the current nameserver, failing over on transport errors."""
        n = len(self.namesrv_addrs)
        last: Exception | None = None
        for k in range(n):
            i = (self._ns_index + k) % n
            try:
                result = await call(self.namesrv_addrs[i])
            except _NAMESRV_FAILOVER as exc:
                last = exc
                continue
            self._ns_index = i
            return result
        assert last is not None
        raise last

    async def fetch_route(self, topic: str) -> TopicRouteData:
        """Ask the nameserver now; TopicNotExistError when it has no route."""
        route = await self.invoke_namesrv(
            lambda addr: self.api.get_route_info(addr, topic, timeout=self.timeout)
        )
        self._routes[topic] = (route, trio.current_time())
        for bd in route.brokerDatas:
            self._brokers[bd.brokerName] = dict(bd.brokerAddrs)
        return route

    def cached_route(self, topic: str) -> TopicRouteData | None:
        """The cached route if younger than route_max_age."""
        entry = self._routes.get(topic)
        if entry is None or trio.current_time() - entry[1] >= self.route_max_age:
            return None
        return entry[0]

    async def route(self, topic: str) -> TopicRouteData:
        return self.cached_route(topic) or await self.fetch_route(topic)

    def invalidate(self, topic: str) -> None:
        self._routes.pop(topic, None)

    def broker_addrs(self, broker_name: str) -> dict[int, str]:
        return dict(self._brokers.get(broker_name, {}))

    def cached_master_addr(self, broker_name: str) -> str | None:
        """The master of `broker_name` if a fetched route named it (no await: the send path)."""
        addrs = self._brokers.get(broker_name)
        return None if addrs is None else addrs.get(0)

    async def master_addr(self, broker_name: str, topic: str) -> str:
        """The master of `broker_name` (publish, offsets); refetches `topic`'s route once."""
        addr = self._brokers.get(broker_name, {}).get(0)
        if addr is None:
            await self.fetch_route(topic)
            addr = self._brokers.get(broker_name, {}).get(0)
        if addr is None:
            raise BrokerNotFoundError(broker_name)
        return addr

    async def any_addr(self, broker_name: str, topic: str) -> str:
        """The master if known, else any node of `broker_name` (reads that a slave can serve)."""
        found = await self.subscribe_addr(broker_name, 0, topic)
        return found[0]

    async def subscribe_addr(
        self, broker_name: str, broker_id: int, topic: str
    ) -> tuple[str, bool]:
        """(addr, is_slave) of the node a consumer should pull from."""
        found = find_broker_addr_in_subscribe(self._brokers.get(broker_name, {}), broker_id)
        if found is None:
            await self.fetch_route(topic)
            found = find_broker_addr_in_subscribe(self._brokers.get(broker_name, {}), broker_id)
        if found is None:
            raise BrokerNotFoundError(broker_name)
        return found


class ClientBase:
    """Shared `async with` shell: one RemotingClient (own or borrowed) and a ClientInstance."""

    def __init__(
        self,
        namesrv: str | list[str] = "127.0.0.1:9876",
        *,
        remoting: Any = None,
        timeout: float = 3.0,
        route_max_age: float = ROUTE_MAX_AGE,
    ) -> None:
        self._namesrv_addrs = parse_namesrv(namesrv)
        self._remoting = remoting
        self._timeout = timeout
        self._route_max_age = route_max_age
        self._stack: contextlib.AsyncExitStack | None = None
        self._instance: ClientInstance | None = None

    @property
    def client(self) -> ClientInstance:
        if self._instance is None:
            raise ClientError(f"{type(self).__name__} is not open: use `async with`")
        return self._instance

    async def __aenter__(self):
        if self._stack is not None:
            raise ClientError(f"{type(self).__name__} is already open")
        stack = contextlib.AsyncExitStack()
        try:
            remoting = self._remoting
            if remoting is None:
                from common.remoting.client import open_remoting_client

                remoting = await stack.enter_async_context(
                    open_remoting_client(connect_timeout=self._timeout)
                )
        except BaseException as exc:
            await stack.aclose()
            raise unwrap_group(exc) from None
        self._stack = stack
        self._instance = ClientInstance(
            remoting, self._namesrv_addrs, self._timeout, self._route_max_age
        )
        return self

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        stack, self._stack, self._instance = self._stack, None, None
        if stack is None:
            return False
        try:
            return bool(await stack.__aexit__(exc_type, exc, tb))
        except BaseExceptionGroup as group:
            inner = unwrap_group(group)
            if inner is group:
                raise
            if inner is exc:
                return False  # let the original exception propagate unchanged
            raise inner from None
