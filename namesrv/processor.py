"""DefaultRequestProcessor: the nameserver's request handlers.

Java's `namesrv/processor/DefaultRequestProcessor.java` in RocketMQ 4.9.

Theory of operation
-------------------
Each handler reads its extFields through `RemotingCommand.get_*` (a missing required field raises
BadRequestHeader, answered as SYSTEM_ERROR "the custom field <x> is null"), calls the route tables
or the KV store, and returns the response. Handlers never await between reading and changing the
tables, so every request sees and leaves the tables consistent without a lock.

`NamesrvProcessor` owns the mutable pieces: the RouteInfoManager, the KVConfigManager and the
current NamesrvConfig (replaced whole by UPDATE_NAMESRV_CONFIG). `register(dispatcher)` installs
the handlers and the channel-close listener that drops brokers whose connection went away;
unknown codes fall to the dispatcher default (REQUEST_CODE_NOT_SUPPORTED, as 5.x answers).

Bodies are written as strict JSON (quoted map keys): both the Java and the C++ clients read it.
QueueData carries the flag under both names, `topicSysFlag` (4.9+) and `topicSynFlag` (older
clients, and what the C++ client reads).
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVarTuple

import attrs

from common import model
from common.errors import RequestError
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.serde import loads, to_json
from namesrv.config import NamesrvConfig, format_properties, parse_properties
from namesrv.kvconfig import NAMESPACE_ORDER_TOPIC_CONFIG, KVConfigManager
from namesrv.register_body import (
    RegisterBodyError,
    data_version_from,
    data_version_json,
    decode_register_body,
)
from namesrv.routeinfo import BrokerData, QueueData, RouteInfoManager, TopicRoute

if TYPE_CHECKING:
    # Only for annotations: the processor works with anything shaped like a dispatcher, so it is
    # testable without sockets.
    from common.remoting.server import Channel, RequestDispatcher

Ts = TypeVarTuple("Ts")


def crc32_matches(body: bytes, expected: int) -> bool:
    """Whether `expected` is the CRC32 of `body` as a RocketMQ broker sends it.

    Java brokers send UtilAll.crc32, which masks the CRC to 31 bits; a plain signed or unsigned
    32-bit rendering of the same CRC is accepted as well.
    """
    crc = zlib.crc32(body)
    signed = crc - (1 << 32) if crc >= 1 << 31 else crc
    return expected in (crc & 0x7FFFFFFF, signed, crc)


def _queue_data(qd: QueueData) -> model.QueueData:
    return model.QueueData(
        brokerName=qd.broker_name,
        readQueueNums=qd.read_queue_nums,
        writeQueueNums=qd.write_queue_nums,
        perm=qd.perm,
        topicSysFlag=qd.topic_sys_flag,
    )


def _broker_data(bd: BrokerData) -> model.BrokerData:
    return model.BrokerData(
        cluster=bd.cluster, brokerName=bd.broker_name, brokerAddrs=dict(bd.broker_addrs)
    )


def topic_route_json(route: TopicRoute, order_topic_conf: str | None = None) -> bytes:
    return to_json(
        model.TopicRouteData(
            queueDatas=[_queue_data(q) for q in route.queue_datas],
            brokerDatas=[_broker_data(b) for b in route.broker_datas],
            filterServerTable=route.filter_server_table,
            orderTopicConf=order_topic_conf,
        )
    )


def topic_list_json(topics: list[str], broker_addr: str | None = None) -> bytes:
    return to_json(model.TopicList(topicList=topics, brokerAddr=broker_addr))


def kv_table_json(table: dict[str, str]) -> bytes:
    return to_json(model.KVTable(table=table))


@attrs.define(eq=False)
class NamesrvProcessor:
    routes: RouteInfoManager
    kv: KVConfigManager
    # replaced whole (never mutated) by UPDATE_NAMESRV_CONFIG; readers take one snapshot
    config: NamesrvConfig

    def register(self, dispatcher: RequestDispatcher) -> None:
        handlers = {
            RequestCode.PUT_KV_CONFIG: self.put_kv_config,
            RequestCode.GET_KV_CONFIG: self.get_kv_config,
            RequestCode.DELETE_KV_CONFIG: self.delete_kv_config,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self.get_kv_list_by_namespace,
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.QUERY_DATA_VERSION: self.query_data_version,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_broker_cluster_info,
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: self.wipe_write_perm_of_broker,
            RequestCode.ADD_WRITE_PERM_OF_BROKER: self.add_write_perm_of_broker,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topic_list,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self.delete_topic_in_namesrv,
            RequestCode.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
            RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS: self.get_system_topic_list,
            RequestCode.GET_UNIT_TOPIC_LIST: self.get_unit_topic_list,
            RequestCode.GET_HAS_UNIT_SUB_TOPIC_LIST: self.get_has_unit_sub_topic_list,
            RequestCode.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST: self.get_has_unit_sub_ununit_topic_list,
            RequestCode.UPDATE_NAMESRV_CONFIG: self.update_config,
            RequestCode.GET_NAMESRV_CONFIG: self.get_config,
        }
        for code, handler in handlers.items():
            dispatcher.register(code, handler)
        # the lookup clients make most never waits: answered in the read loop, no task (a
        # flood of them then costs no scheduling, and its answers are bounded by the outbox)
        dispatcher.register(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, self.get_route_info_by_topic, inline=True
        )
        dispatcher.add_close_listener(self.on_channel_close)

    def on_channel_close(self, channel: Channel) -> None:
        self.routes.on_channel_destroy(channel)

    # ---------------------------------------------------------------- KV config

    async def _kv_write(self, fn: Callable[[*Ts], Awaitable[None]], *args: *Ts) -> None:
        try:
            await fn(*args)
        except OSError as exc:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"persist kv config failed: {exc}"
            ) from exc

    async def put_kv_config(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        ns, key, value = cmd.get_str("namespace"), cmd.get_str("key"), cmd.get_str("value")
        await self._kv_write(self.kv.put, ns, key, value)
        return cmd.response()

    async def get_kv_config(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        ns, key = cmd.get_str("namespace"), cmd.get_str("key")
        value = self.kv.get(ns, key)
        if value is None:
            return cmd.response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {ns} Key: {key}"
            )
        return cmd.response(ext_fields={"value": value})

    async def delete_kv_config(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        ns, key = cmd.get_str("namespace"), cmd.get_str("key")
        await self._kv_write(self.kv.delete, ns, key)
        return cmd.response()

    async def get_kv_list_by_namespace(
        self, cmd: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        ns = cmd.get_str("namespace")
        table = self.kv.get_namespace(ns)
        if table is None:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {ns}")
        return cmd.response(body=kv_table_json(table))

    # ---------------------------------------------------------------- brokers

    async def register_broker(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        broker_name = cmd.get_str("brokerName")
        broker_addr = cmd.get_str("brokerAddr")
        cluster_name = cmd.get_str("clusterName")
        ha_server_addr = cmd.get_str("haServerAddr")
        broker_id = cmd.get_int("brokerId")
        compressed = cmd.get_bool("compressed", False)
        body_crc = cmd.get_int("bodyCrc32", 0)
        body = cmd.body_bytes()
        if body_crc != 0 and not crc32_matches(body, body_crc):
            return cmd.response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        try:
            reg = decode_register_body(body, compressed=compressed, version=cmd.version)
        except RegisterBodyError as exc:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR, f"Failed to decode RegisterBrokerBody: {exc}"
            )
        result = self.routes.register_broker(
            cluster_name,
            broker_addr,
            broker_name,
            broker_id,
            ha_server_addr,
            reg.data_version,
            reg.topic_configs,
            reg.filter_server_list,
            channel,
        )
        order_conf = self.kv.get_namespace(NAMESPACE_ORDER_TOPIC_CONFIG)
        return cmd.response(
            ext_fields={"haServerAddr": result.ha_server_addr, "masterAddr": result.master_addr},
            body=kv_table_json(order_conf) if order_conf else b"",
        )

    async def unregister_broker(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        self.routes.unregister_broker(
            cmd.get_str("clusterName"),
            cmd.get_str("brokerAddr"),
            cmd.get_str("brokerName"),
            cmd.get_int("brokerId"),
        )
        return cmd.response()

    async def query_data_version(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        for name in ("brokerName", "clusterName", "brokerId"):
            cmd.get_str(name)  # required, though only the address is used
        broker_addr = cmd.get_str("brokerAddr")
        body = cmd.body_bytes()
        try:
            version = data_version_from(loads(body)) if body else data_version_from(None)
        except ValueError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad DataVersion body: {exc}")
        changed = self.routes.is_broker_topic_config_changed(broker_addr, version)
        if not changed:
            # An unchanged version is a heartbeat: the broker skips re-registering.
            self.routes.update_broker_info_update_timestamp(broker_addr)
        stored = self.routes.query_broker_topic_config(broker_addr)
        return cmd.response(
            ext_fields={"changed": changed},
            body=data_version_json(stored) if stored is not None else b"",
        )

    async def wipe_write_perm_of_broker(
        self, cmd: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        count = self.routes.wipe_write_perm_of_broker(cmd.get_str("brokerName"))
        return cmd.response(ext_fields={"wipeTopicCount": count})

    async def add_write_perm_of_broker(
        self, cmd: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        count = self.routes.add_write_perm_of_broker(cmd.get_str("brokerName"))
        return cmd.response(ext_fields={"addTopicCount": count})

    # ---------------------------------------------------------------- routes and topics

    def get_route_info_by_topic(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        topic = cmd.get_str("topic")
        route = self.routes.pickup_topic_route_data(topic)
        if route is None:
            return cmd.response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {topic}",
            )
        order_conf = None
        if self.config.order_message_enable:
            order_conf = self.kv.get(NAMESPACE_ORDER_TOPIC_CONFIG, topic)
        return cmd.response(body=topic_route_json(route, order_conf))

    async def get_broker_cluster_info(
        self, cmd: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        info = self.routes.get_all_cluster_info()
        body = model.ClusterInfo(
            brokerAddrTable={n: _broker_data(b) for n, b in info.broker_addr_table.items()},
            clusterAddrTable=info.cluster_addr_table,
        )
        return cmd.response(body=to_json(body))

    async def get_all_topic_list(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        return cmd.response(body=topic_list_json(self.routes.get_all_topic_list()))

    async def delete_topic_in_namesrv(
        self, cmd: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        topic = cmd.get_str("topic")
        cluster = cmd.get_str("clusterName", None)
        self.routes.delete_topic(topic, cluster or None)
        return cmd.response()

    async def get_topics_by_cluster(
        self, cmd: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        topics = self.routes.get_topics_by_cluster(cmd.get_str("cluster"))
        return cmd.response(body=topic_list_json(topics))

    async def get_system_topic_list(
        self, cmd: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        topics, addr = self.routes.get_system_topic_list()
        return cmd.response(body=topic_list_json(topics, addr))

    async def get_unit_topic_list(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        return cmd.response(body=topic_list_json(self.routes.get_unit_topics()))

    async def get_has_unit_sub_topic_list(
        self, cmd: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        return cmd.response(body=topic_list_json(self.routes.get_has_unit_sub_topic_list()))

    async def get_has_unit_sub_ununit_topic_list(
        self, cmd: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        topics = self.routes.get_has_unit_sub_ununit_topic_list()
        return cmd.response(body=topic_list_json(topics))

    # ---------------------------------------------------------------- config

    async def update_config(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        body = cmd.body_bytes()
        if not body:
            return cmd.response()
        try:
            props = parse_properties(body.decode("utf-8"))
        except UnicodeDecodeError:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "string2Properties error")
        try:
            new = self.config.updated(props)
        except PermissionError as exc:
            return cmd.response(ResponseCode.NO_PERMISSION, str(exc))
        except ValueError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
        self.apply_config(new)
        return cmd.response()

    def apply_config(self, new: NamesrvConfig) -> None:
        """Adopt a new config; the scan task reads its interval from here on each round.
        (listenPort and bindAddress take effect on the next start only.)"""
        self.config = new
        self.routes.broker_channel_expired_time = new.broker_channel_expired_time

    async def get_config(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        text = format_properties(self.config.to_properties())
        return cmd.response(body=text.encode("utf-8"))
