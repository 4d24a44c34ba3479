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

Background work: once a consumer or producer group registers with the instance
(`register_consumer` / `register_producer`), `run` (a task in the client's nursery) sends
HEART_BEAT every 30 s to the brokers of the topics in use (consumers: every node; producer-only
clients: masters, as MQClientInstance.sendHeartbeatToAllBroker) and re-fetches the route of
every topic in use every 30 s, so rebalancing sees new queues and brokers without waiting for
a send error. A client with nothing registered (a plain Producer or PullConsumer) sends nothing
in the background. `handle_request` answers what brokers ask clients
(ClientRemotingProcessor): NOTIFY_CONSUMER_IDS_CHANGED wakes the group's rebalance,
RESET_CONSUMER_CLIENT_OFFSET moves the group's queues to the offsets in its body (either
ResetOffsetBody form), GET_CONSUMER_STATUS_FROM_CLIENT answers the in-memory offsets of a
topic, GET_CONSUMER_RUNNING_INFO the ConsumerRunningInfo, CONSUME_MESSAGE_DIRECTLY runs the
listener on the given message, CHECK_TRANSACTION_STATE goes to the TransactionProducer of the
half message's group (rmq/transaction_producer.py).

`ClientBase` is the async-context-manager shell of the three public clients: it opens (or
borrows) one RemotingClient and closes it on exit, unwrapping single-exception groups so a
user's own exception leaves `async with Producer(...)` as itself.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Protocol, Self, TypeVar

import attrs
import trio

from common.errors import (
    ProtocolError,
    RemotingConnectError,
    RemotingSendError,
    RemotingTimeoutError,
    RequestCodeNotSupportedError,
    RmqError,
    unwrap_group,
)
from common.message import RecordDecodeError, decode_record
from common.model import (
    ConsumerData,
    HeartbeatData,
    MessageQueue,
    ProducerData,
    SubscriptionData,
    TopicRouteData,
)
from common.remoting.channel import Channel, Handler
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.network import TCP, Network, TcpNetwork
from common.reset_offset_body import decode_offset_table, encode_consumer_status_body
from common.session_credentials import SessionCredentials
from rmq.client_api import ClientAPI
from rmq.errors import BrokerNotFoundError, ClientError, NotANameserverError
from rmq.remoting import Remoting
from rmq.topic_publish_info import find_broker_addr_in_subscribe

T = TypeVar("T")

log = logging.getLogger(__name__)

ROUTE_MAX_AGE = 30.0
HEARTBEAT_INTERVAL = 30.0  # heartbeatBrokerInterval
POLL_NAMESRV_INTERVAL = 30.0  # pollNameServerInterval
_instance_seq = itertools.count()


@functools.cache
def local_ip() -> str:
    """This host's address as Java's RemotingUtil.getLocalAddress would pick (best effort).

    Cached: it is a blocking resolver call and clients are built inside Trio tasks."""
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
    return ip or "127.0.0.1"


def make_client_id(instance_name: str | None = None) -> str:
    """`ip@instance`; the default instance is `<pid>#<n>` so clients of one process differ."""
    if not instance_name:
        instance_name = f"{os.getpid()}#{next(_instance_seq)}"
    return f"{local_ip()}@{instance_name}"


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


class RegisteredConsumer(Protocol):
    """What the instance needs of a consumer registered under its group (a PushConsumer): its
    topics and ConsumerData for heartbeats, and answers to the brokers' requests about it."""

    @property
    def group(self) -> str: ...

    @property
    def subscriptions(self) -> Mapping[str, object]: ...

    def consumer_data(self) -> ConsumerData: ...

    def rebalance_immediately(self) -> None: ...

    def running_info_json(self) -> bytes: ...

    def offset_table_of(self, topic: str) -> dict[MessageQueue, int]: ...

    async def reset_offset_table(self, topic: str, table: Mapping[MessageQueue, int]) -> None: ...

    async def consume_message_directly(self, cmd: RemotingCommand) -> RemotingCommand: ...


@attrs.define(eq=False)
class ClientInstance:
    remoting: Remoting
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
    client_id: str = attrs.field(factory=make_client_id)
    heartbeat_interval: float = HEARTBEAT_INTERVAL
    poll_namesrv_interval: float = POLL_NAMESRV_INTERVAL
    # group -> the PushConsumer registered under it (heartbeats, broker requests)
    consumers: dict[str, RegisteredConsumer] = attrs.field(factory=dict, init=False)
    # producer groups registered with this instance (heartbeats only)
    producer_groups: set[str] = attrs.field(factory=set, init=False)
    # producer group -> what takes CHECK_TRANSACTION_STATE for it (a TransactionProducer)
    transaction_checkers: dict[str, Callable[[RemotingCommand, Channel], None]] = attrs.field(
        factory=dict, init=False
    )
    # set when something registers, so `run` starts its periodic work
    _registered: trio.Event = attrs.field(factory=trio.Event, init=False)
    # request code -> handler of what brokers send this client, for the codes a part of the
    # client serves itself (PUSH_REPLY_MESSAGE_TO_CLIENT: the producer's request-reply);
    # consulted before the built-in ones below
    request_handlers: dict[int, Handler] = attrs.field(factory=dict, init=False)

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
            except RequestCodeNotSupportedError as exc:
                # every call made here is a nameserver request; only a broker refuses those
                raise NotANameserverError(self.namesrv_addrs[i], exc.remark) from None
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

    async def check_client_in_broker(
        self, group: str, sub: SubscriptionData, timeout: float
    ) -> None:
        """MQClientInstance.checkClientInBroker for one subscription: a broker of its topic is
        asked whether it takes the (non-TAG) expression; ClientError with its reason if not."""
        if not sub.expressionType or sub.expressionType == "TAG":
            return
        route = await self.route(sub.topic)
        addrs = [a for bd in route.brokerDatas if (a := bd.select_broker_addr())]
        if not addrs:
            return
        try:
            await self.api.check_client_config(
                addrs[0], group, self.client_id, sub, timeout=timeout
            )
        except RmqError as exc:
            raise ClientError(
                f"broker {addrs[0]} refuses the {sub.expressionType} subscription "
                f"{sub.subString!r} of topic {sub.topic}: {exc}"
            ) from None

    # --- groups, heartbeats, background work (MQClientInstance) ---------------------------

    def register_consumer(self, group: str, consumer: RegisteredConsumer) -> None:
        if group in self.consumers:
            raise ClientError(f"consumer group {group} is already registered in this client")
        self.consumers[group] = consumer
        self._registered.set()

    def unregister_consumer(self, group: str) -> None:
        self.consumers.pop(group, None)

    def register_producer(self, group: str) -> None:
        self.producer_groups.add(group)
        self._registered.set()

    def unregister_producer(self, group: str) -> None:
        self.producer_groups.discard(group)
        self.transaction_checkers.pop(group, None)

    def register_transaction_checker(
        self, group: str, checker: Callable[[RemotingCommand, Channel], None]
    ) -> None:
        self.transaction_checkers[group] = checker

    def topics_in_use(self) -> set[str]:
        topics = set(self._routes)
        for consumer in self.consumers.values():
            topics.update(consumer.subscriptions)
        return topics

    def heartbeat_data(self) -> HeartbeatData:
        return HeartbeatData(
            clientID=self.client_id,
            producerDataSet=[ProducerData(g) for g in sorted(self.producer_groups)],
            consumerDataSet=[c.consumer_data() for c in self.consumers.values()],
        )

    def heartbeat_addrs(self) -> list[str]:
        """Every node of every known broker with consumers; only the masters without."""
        out: list[str] = []
        for name in sorted(self._brokers):
            for broker_id, addr in sorted(self._brokers[name].items()):
                if (self.consumers or broker_id == 0) and addr not in out:
                    out.append(addr)
        return out

    async def send_heartbeat_to_all_brokers(self) -> None:
        if not self.consumers and not self.producer_groups:
            return
        data = self.heartbeat_data()
        for addr in self.heartbeat_addrs():
            try:
                await self.api.heartbeat(addr, data, timeout=self.timeout)
            except Exception as exc:
                log.warning("heartbeat to %s failed: %s", addr, exc)

    async def update_routes(self) -> None:
        for topic in sorted(self.topics_in_use()):
            try:
                await self.fetch_route(topic)
            except Exception as exc:
                log.debug("route refresh of %s failed: %s", topic, exc)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Heartbeats and route refreshes while anything is registered; until cancelled."""
        task_status.started()
        await self._registered.wait()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                self._every, self.heartbeat_interval, self.send_heartbeat_to_all_brokers
            )
            nursery.start_soon(self._every, self.poll_namesrv_interval, self.update_routes)

    @staticmethod
    async def _every(interval: float, fn: Callable[[], Awaitable[None]]) -> None:
        while True:
            await trio.sleep(interval)
            try:
                await fn()
            except Exception as exc:  # periodic work must outlive one bad round
                log.warning("periodic %s failed: %s", getattr(fn, "__name__", fn), exc)

    # --- requests from brokers (ClientRemotingProcessor) -----------------------------------

    def register_request_handler(self, code: int, handler: Handler) -> None:
        self.request_handlers[int(code)] = handler

    async def handle_request(
        self, cmd: RemotingCommand, channel: Channel
    ) -> RemotingCommand | None:
        handler = self.request_handlers.get(cmd.code)
        if handler is not None:
            return await handler(cmd, channel)
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            consumer = self.consumers.get(cmd.ext_fields.get("consumerGroup", ""))
            if consumer is not None:
                log.info("group %s: broker says the members changed", consumer.group)
                consumer.rebalance_immediately()
            return None
        if cmd.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            await self._reset_offset(cmd)
            return None  # oneway, as the broker sends it
        if cmd.code == RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT:
            consumer = self.consumers.get(cmd.ext_fields.get("group", ""))
            table = (
                {}
                if consumer is None
                else consumer.offset_table_of(cmd.ext_fields.get("topic", ""))
            )
            return cmd.response(body=encode_consumer_status_body(table))
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            # oneway: the producer answers later with END_TRANSACTION (ClientRemotingProcessor
            # .checkTransactionState finds the producer by the half message's PGROUP)
            checker = self.transaction_checkers.get(_producer_group_of(cmd.body_bytes()))
            if checker is None:
                log.warning("CHECK_TRANSACTION_STATE for a group this client does not produce")
            else:
                checker(cmd, channel)
            return None
        if cmd.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            group = cmd.ext_fields.get("consumerGroup", "")
            consumer = self.consumers.get(group)
            if consumer is None:
                return cmd.response(
                    ResponseCode.SYSTEM_ERROR,
                    f"The Consumer Group <{group}> not exist in this consumer",
                )
            return cmd.response(body=consumer.running_info_json())
        if cmd.code == RequestCode.CONSUME_MESSAGE_DIRECTLY:
            group = cmd.ext_fields.get("consumerGroup", "")
            consumer = self.consumers.get(group)
            if consumer is None:
                return cmd.response(
                    ResponseCode.SYSTEM_ERROR,
                    f"The Consumer Group <{group}> not exist in this consumer",
                )
            return await consumer.consume_message_directly(cmd)
        return cmd.response(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported"
        )

    async def _reset_offset(self, cmd: RemotingCommand) -> None:
        group, topic = cmd.ext_fields.get("group", ""), cmd.ext_fields.get("topic", "")
        consumer = self.consumers.get(group)
        if consumer is None:
            log.info("[reset-offset] no consumer of group %s in this client", group)
            return
        try:
            table = decode_offset_table(cmd.body_bytes())
        except ProtocolError as exc:
            log.warning("[reset-offset] of %s/%s: bad body: %s", group, topic, exc)
            return
        log.info(
            "[reset-offset] broker asks group %s to move %d queues of %s", group, len(table), topic
        )
        await consumer.reset_offset_table(topic, table)


def _producer_group_of(record: bytes) -> str:
    """PGROUP of the half message a check carries ("" when the body is no record)."""
    try:
        return decode_record(record).properties.get("PGROUP", "")
    except RecordDecodeError:
        return ""


class ClientBase:
    """Shared `async with` shell: one RemotingClient (own or borrowed) and a ClientInstance."""

    def __init__(
        self,
        namesrv: str | list[str] = "127.0.0.1:9876",
        *,
        remoting: Remoting | None = None,
        network: Network | None = None,
        timeout: float = 3.0,
        route_max_age: float = ROUTE_MAX_AGE,
        instance_name: str | None = None,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        credentials: SessionCredentials | None = None,
    ) -> None:
        self._namesrv_addrs = parse_namesrv(namesrv)
        # a broker with plain ACL: every request is signed with these (not a lent `remoting`)
        self._credentials = credentials
        # how brokers are reached when no `remoting` client is lent (TCP; tests: in memory)
        self._network = network
        self._client_id = make_client_id(instance_name)
        self._heartbeat_interval = heartbeat_interval
        self._remoting = remoting
        self._timeout = timeout
        self._route_max_age = route_max_age
        self._stack: contextlib.AsyncExitStack | None = None
        self._instance: ClientInstance | None = None
        self._nursery: trio.Nursery | None = None

    @property
    def over_tcp(self) -> bool:
        """Brokers are reached over real TCP sockets (no lent client, no test network): a
        blocking socket of rmq.sync can reach them too."""
        return (
            self._remoting is None
            and self._credentials is None
            and (self._network is None or self._network is TCP or type(self._network) is TcpNetwork)
        )

    @property
    def client_id(self) -> str:
        """`ip@instance`: what brokers list for this client."""
        return self._client_id

    def heartbeat_producer_group(self) -> str | None:
        """A producer returns its group here to be announced in HEART_BEAT (ProducerData)
        every 30 s and unregistered on exit; None (the default) sends nothing."""
        return None

    @property
    def client(self) -> ClientInstance:
        if self._instance is None:
            raise ClientError(f"{type(self).__name__} is not open: use `async with`")
        return self._instance

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise ClientError(f"{type(self).__name__} is already open")
        stack = contextlib.AsyncExitStack()
        try:
            remoting = self._remoting
            if remoting is None:
                from common.remoting.client import open_remoting_client

                sign = None if self._credentials is None else self._credentials.sign
                remoting = await stack.enter_async_context(
                    open_remoting_client(
                        connect_timeout=self._timeout, network=self._network, sign=sign
                    )
                )
            instance = ClientInstance(
                remoting,
                self._namesrv_addrs,
                self._timeout,
                self._route_max_age,
                client_id=self._client_id,
                heartbeat_interval=self._heartbeat_interval,
            )
            # server->client requests (NOTIFY_CONSUMER_IDS_CHANGED ...) of this connection set
            remoting.set_request_handler(instance.handle_request)
            # the instance's periodic work; idle until a group registers
            nursery = await stack.enter_async_context(trio.open_nursery())
            stack.callback(nursery.cancel_scope.cancel)
            await nursery.start(instance.run)
            self._nursery = nursery
            producer_group = self.heartbeat_producer_group()
            if producer_group:
                instance.register_producer(producer_group)
                stack.push_async_callback(self._unregister_producer, instance, producer_group)
        except BaseException as exc:
            await stack.aclose()
            raise unwrap_group(exc) from None
        self._stack = stack
        self._instance = instance
        return self

    async def _unregister_producer(self, instance: ClientInstance, group: str) -> None:
        instance.unregister_producer(group)
        with trio.CancelScope(shield=True), trio.move_on_after(self._timeout):
            for addr in instance.heartbeat_addrs():
                try:
                    await instance.api.unregister_client(
                        addr, instance.client_id, producer_group=group, timeout=self._timeout
                    )
                except Exception as exc:
                    log.info("unregister producer %s from %s failed: %s", group, addr, exc)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # None, not bool: leaving a client never swallows the caller's exception (so mypy
        # knows a `return` inside `async with Producer(...)` is the function's end). The stack
        # could only swallow a Cancelled of our own nursery's scope, and nothing cancels that
        # while the caller's block runs: a failed task raises its error at exit instead.
        stack, self._stack, self._instance = self._stack, None, None
        if stack is None:
            return
        try:
            await stack.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            inner = unwrap_group(group)
            if inner is group:
                raise
            if inner is exc:
                return  # let the original exception propagate unchanged
            raise inner from None
