"""Admin requests (RocketMQ ``AdminBrokerProcessor``): topics, groups, offsets, runtime info,
the broker's configuration, producers, statistics, consume queues and the ACL file.

Theory of operation
-------------------
These are what ``mqadmin``-style tools and slaves (syncing metadata from their master) send.
Writes (topic and group create/update/delete) are refused on a slave - its tables are copies of
the master's - and change the tables through their managers, which bump the DataVersion,
persist the file and (for topics) trigger an immediate re-registration.  Reads serialize the tables
in Java's wrapper shapes (``common/protocol/body/ConsumerOffsetSerializeWrapper.java``,
``SubscriptionGroupWrapper.java``, ``TopicConfigSerializeWrapper.java``; ``common.model``) so a Java
slave or tool can parse them.

The operations keep their logic where the concept lives and only translate here: which config
keys apply live (``broker/configuration.py``), the stats windows
(``broker/broker_stats_manager.py``), the ACL file edits (``broker/acl/permission_manager.py``).
Bodies with ``Map<MessageQueue, V>`` (ConsumeStats, ConsumeStatsList) are written as fastjson
writes them (``common.mq_map.encode_mq_map``).

Codes without a processor get REQUEST_CODE_NOT_SUPPORTED from the dispatcher.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from pathlib import PurePath

import attrs
import trio

from broker.acl.permission_manager import (
    AccountUpdate,
    AclEditError,
    delete_account,
    set_global_white,
    split_list,
    update_account,
)
from broker.acl.validator import Edit, PlainAccessValidator
from broker.configuration import MAX_BODY, ConfigUpdateError, config_properties, plan_update
from broker.consumer_manager import ClientChannelInfo
from broker.controller import BrokerController
from broker.topic_config import validate_topic
from common import serde
from common.errors import RequestError
from common.model import KVTable, MessageQueue, SubscriptionGroupConfig, TopicConfig
from common.mq_map import encode_mq_map
from common.remoting.channel import PROTOCOL_ATTR
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import CURRENT_VERSION, RemotingCommand
from common.remoting.server import Channel, RequestDispatcher
from common.topic_message_type import (
    TopicAttributeError,
    apply_attribute_changes,
    parse_attribute_changes,
)
from common.topics import (
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    SCHEDULE_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
)

# QUERY_CONSUME_QUEUE answers at most this many units (mqadmin queryCq asks 10 by default)
MAX_CONSUME_QUEUE_UNITS = 1024

_SLAVE_REFUSAL = "Can't modify topic or subscription group from slave broker, please execute it from master broker."

log = logging.getLogger(__name__)


def _connection_set(clients: Iterable[ClientChannelInfo]) -> list[dict[str, object]]:
    """A ProducerConnection's or ConsumerConnection's ``connectionSet`` (Java's Connection)."""
    return [
        {
            "clientId": c.client_id,
            "clientAddr": c.channel.remote_addr,
            "language": c.language,
            "version": c.version,
            **_protocol(c.channel),
        }
        for c in clients
    ]


def _protocol(channel: Channel) -> dict[str, str]:
    """`protocol` (our addition to Java's Connection / ProducerInfo, which Java readers ignore)
    for a RocketMQ 5 gRPC client, so `rmq top` and `rmq group describe` can tell it from a 4.x
    connection; nothing for a 4.x connection."""
    protocol = channel.attrs.get(PROTOCOL_ATTR)
    return {"protocol": protocol} if isinstance(protocol, str) else {}


class AdminBrokerProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    def register(self, dispatcher: RequestDispatcher) -> None:
        r = dispatcher.register
        r(RequestCode.UPDATE_AND_CREATE_TOPIC, self.update_and_create_topic)
        r(RequestCode.DELETE_TOPIC_IN_BROKER, self.delete_topic)
        r(RequestCode.GET_ALL_TOPIC_CONFIG, self.get_all_topic_config)
        r(RequestCode.GET_ALL_CONSUMER_OFFSET, self.get_all_consumer_offset)
        r(RequestCode.GET_ALL_DELAY_OFFSET, self.get_all_delay_offset)
        r(RequestCode.GET_TIMER_CHECK_POINT, self.get_timer_check_point)
        r(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, self.get_all_subscription_group)
        r(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, self.update_and_create_group)
        r(RequestCode.DELETE_SUBSCRIPTIONGROUP, self.delete_group)
        r(RequestCode.GET_BROKER_RUNTIME_INFO, self.get_broker_runtime_info)
        r(RequestCode.GET_BROKER_CONFIG, self.get_broker_config)
        r(RequestCode.UPDATE_BROKER_CONFIG, self.update_broker_config)
        r(RequestCode.GET_PRODUCER_CONNECTION_LIST, self.get_producer_connection_list)
        r(RequestCode.GET_ALL_PRODUCER_INFO, self.get_all_producer_info)
        r(RequestCode.VIEW_BROKER_STATS_DATA, self.view_broker_stats_data)
        r(RequestCode.GET_BROKER_CONSUME_STATS, self.get_broker_consume_stats)
        r(RequestCode.QUERY_CONSUME_QUEUE, self.query_consume_queue)
        r(RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, self.clean_expired_consume_queue)
        r(RequestCode.CLEAN_UNUSED_TOPIC, self.clean_unused_topic)
        r(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, self.update_and_create_acl_config)
        r(RequestCode.DELETE_ACL_CONFIG, self.delete_acl_config)
        r(RequestCode.GET_BROKER_CLUSTER_ACL_INFO, self.get_broker_cluster_acl_info)
        r(RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, self.update_global_white_addrs_config)
        r(RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, self.get_broker_cluster_acl_config)
        r(RequestCode.GET_CONSUMER_CONNECTION_LIST, self.get_consumer_connection_list)
        r(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, self.query_topic_consume_by_who)
        r(RequestCode.GET_TOPIC_STATS_INFO, self.get_topic_stats_info)
        r(RequestCode.GET_CONSUME_STATS, self.get_consume_stats)

    def _refuse_on_slave(self) -> None:
        if self.broker.is_slave:
            raise RequestError(ResponseCode.SYSTEM_ERROR, _SLAVE_REFUSAL)

    # --- topics -------------------------------------------------------------------------------
    async def update_and_create_topic(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        b = self.broker
        self._refuse_on_slave()
        topic = req.get_str("topic")
        why = validate_topic(topic)
        if why is not None:
            return req.response(ResponseCode.SYSTEM_ERROR, why)
        if topic == b.config.broker_cluster_name:
            return req.response(
                ResponseCode.SYSTEM_ERROR,
                f"the topic[{topic}] is conflict with system reserved words.",
            )
        read = req.get_int("readQueueNums")
        write = req.get_int("writeQueueNums")
        if read <= 0 or write <= 0 or read > 1024 or write > 1024:
            return req.response(
                ResponseCode.SYSTEM_ERROR,
                f"illegal queue nums: readQueueNums={read} writeQueueNums={write}",
            )
        filter_type = req.get_str("topicFilterType", "SINGLE_TAG")
        if filter_type not in ("SINGLE_TAG", "MULTI_TAG"):
            return req.response(ResponseCode.SYSTEM_ERROR, f"illegal topicFilterType {filter_type}")
        tc = TopicConfig(
            topicName=topic,
            readQueueNums=read,
            writeQueueNums=write,
            perm=req.get_int("perm", 6),
            topicFilterType=filter_type,
            topicSysFlag=req.get_int("topicSysFlag", 0),
            order=req.get_bool("order", False),
            attributes=self._topic_attributes(topic, req.get_str("attributes", "")),
        )
        b.topic_config_manager.update_topic_config(tc)
        return await self._when_durable(req)

    def _topic_attributes(self, topic: str, text: str) -> dict[str, str] | None:
        """RocketMQ 5's ``attributes`` field ("+message.type=FIFO"), merged into the topic's
        current attributes (TopicConfigManager.updateTopicConfig)."""
        current = self.broker.topic_config_manager.select_topic_config(topic)
        existing = (current.attributes if current is not None else None) or {}
        if not text:
            return dict(existing) or None
        try:
            changes = parse_attribute_changes(text)
        except TopicAttributeError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        return apply_attribute_changes(existing, changes) or None

    async def delete_topic(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        b = self.broker
        self._refuse_on_slave()
        topic = req.get_str("topic")
        b.topic_config_manager.delete_topic_config(topic)
        b.consumer_offset_manager.remove_topics([topic])
        b.store.delete_topics([topic])
        if b.metrics is not None:
            b.metrics.forget_topics([topic])
        return await self._when_durable(req)

    async def get_all_topic_config(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        return req.response(ResponseCode.SUCCESS, body=self.broker.topic_config_manager.encode())

    # --- offsets and groups ------------------------------------------------------------------
    async def get_all_consumer_offset(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        return req.response(ResponseCode.SUCCESS, body=self.broker.consumer_offset_manager.encode())

    async def get_all_delay_offset(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        return req.response(ResponseCode.SUCCESS, body=self.broker.schedule_service.encode())

    async def get_timer_check_point(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        """RocketMQ 5 AdminBrokerProcessor.getTimerCheckPoint: what a slave's sync copies.  The
        body is our checkpoint's JSON (``broker/timer/checkpoint.py``), not RocketMQ's binary
        TimerCheckpoint: only our slaves ask for it."""
        if not self.broker.config.store.timer_wheel_enable:
            return req.response(ResponseCode.SYSTEM_ERROR, "The checkpoint is null")
        body = serde.dumps(self.broker.timer_service.checkpoint.own())
        return req.response(ResponseCode.SUCCESS, body=body)

    async def get_all_subscription_group(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        return req.response(
            ResponseCode.SUCCESS, body=self.broker.subscription_group_manager.encode()
        )

    async def update_and_create_group(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        self._refuse_on_slave()
        try:
            cfg = serde.from_json(req.body_bytes(), SubscriptionGroupConfig)
        except ValueError as exc:
            return req.response(ResponseCode.SYSTEM_ERROR, f"bad SubscriptionGroupConfig: {exc}")
        if not cfg.groupName:
            return req.response(ResponseCode.SYSTEM_ERROR, "groupName is empty")
        self.broker.subscription_group_manager.update_subscription_group_config(cfg)
        return await self._when_durable(req)

    async def _when_durable(self, req: RemotingCommand) -> RemotingCommand:
        """SUCCESS once the change is on disk (the table is fsynced off the loop)."""
        if await self.broker.wait_config_durable():
            return req.response(ResponseCode.SUCCESS)
        return req.response(
            ResponseCode.SYSTEM_ERROR, "the change is applied but could not be written to disk"
        )

    async def delete_group(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        self._refuse_on_slave()
        group = req.get_str("groupName")
        self.broker.subscription_group_manager.delete_subscription_group_config(group)
        # 4.9.7's DeleteSubscriptionGroupRequestHeader.removeOffset (mqadmin deleteSubGroup -r)
        if req.get_bool("removeOffset", False):
            self.broker.consumer_offset_manager.remove_offset(group)
        return await self._when_durable(req)

    # --- runtime ------------------------------------------------------------------------------
    def runtime_info(self) -> dict[str, str]:
        b = self.broker
        now = int(time.time() * 1000)
        up = max(0, now - b.boot_timestamp) // 1000
        days, rem = divmod(up, 86400)
        hours, rem = divmod(rem, 3600)
        minutes, seconds = divmod(rem, 60)
        info = {
            "brokerVersionDesc": "V4_9_7",
            "brokerVersion": str(CURRENT_VERSION),
            "msgPutTotalYesterdayMorning": "0",
            "msgPutTotalTodayMorning": "0",
            "msgPutTotalTodayNow": str(b.stats.put_count),
            "msgGetTotalYesterdayMorning": "0",
            "msgGetTotalTodayMorning": "0",
            "msgGetTotalTodayNow": str(b.stats.get_found),
            "sendThreadPoolQueueSize": "0",
            "sendThreadPoolQueueCapacity": "10000",
            "pullThreadPoolQueueSize": "0",
            "pullThreadPoolQueueCapacity": "100000",
            "queryThreadPoolQueueSize": "0",
            "queryThreadPoolQueueCapacity": "20000",
            "EndTransactionQueueSize": "0",
            "EndTransactionThreadPoolQueueCapacity": "100000",
            "pageCacheLockTimeMills": "0",
            "sendThreadPoolQueueHeadWaitTimeMills": "0",
            "pullThreadPoolQueueHeadWaitTimeMills": "0",
            "queryThreadPoolQueueHeadWaitTimeMills": "0",
            "earliestMessageTimeStamp": "0",
            "startAcceptSendRequestTimeStamp": "0",
            "remainTransientStoreBufferNumbs": "0",
            "bootTimestamp": str(b.boot_timestamp),
            "runtime": f"[ {days} days, {hours} hours, {minutes} minutes, {seconds} seconds ]",
            "dispatchBehindBytes": str(b.store.dispatch_behind_bytes),
        }
        try:
            info.update(b.store.runtime_info())
        except Exception:  # a store without stats must not break the admin call
            log.exception("store runtime info failed")
        # Replication: push2SlaveMaxOffset, connection count and per-slave ack offset and lag
        # on a master; the master address and reported offset on a slave.
        if b.ha is not None:
            info.update(b.ha.runtime_info())
        if b.config.store.timer_wheel_enable:
            info.update(b.timer_service.runtime_info())
        return info

    async def get_broker_runtime_info(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        body = serde.to_json(KVTable(table=self.runtime_info()))
        return req.response(ResponseCode.SUCCESS, body=body)

    async def get_broker_config(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        b = self.broker
        # brokerId and brokerRole are the live ones: in DLedger mode the Raft role sets them
        text = config_properties(
            b.config, {"brokerId": str(b.broker_id), "brokerRole": b.broker_role}
        )
        version = serde.to_json(b.configuration.data_version).decode()
        return req.response(
            ResponseCode.SUCCESS, None, {"version": version}, body=text.encode("utf-8")
        )

    async def update_broker_config(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        """Properties text -> the live keys applied, every key written to the config file
        (broker/configuration.py says which keys are live, restart-only or refused)."""
        b = self.broker
        body = req.body_bytes()
        if not body:
            return req.response(ResponseCode.SUCCESS)  # RocketMQ: no body, nothing to do
        if len(body) > MAX_BODY:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"the body is {len(body)} bytes, at most {MAX_BODY}"
            )
        try:
            plan = plan_update(b.config, body.decode("utf-8"))
        except UnicodeDecodeError:
            return req.response(ResponseCode.SYSTEM_ERROR, "the body is not UTF-8 text")
        except ConfigUpdateError as exc:
            return req.response(ResponseCode.SYSTEM_ERROR, str(exc))
        log.info("updateBrokerConfig from %s: %s", channel.remote_addr, dict(plan.raw))
        if not await b.update_config(plan):
            return req.response(
                ResponseCode.SYSTEM_ERROR,
                f"applied, but could not be written to {b.configuration.path}",
            )
        remark = None
        if plan.restart:
            remark = (
                f"written to {b.configuration.path}; takes effect after a restart: "
                + ", ".join(plan.restart)
            )
        return req.response(ResponseCode.SUCCESS, remark)

    # --- producers ----------------------------------------------------------------------------
    async def get_producer_connection_list(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        group = req.get_str("producerGroup")
        chans = self.broker.producer_manager.groups.get(group)
        if not chans:
            return req.response(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        body = {"connectionSet": _connection_set(chans.values())}
        return req.response(ResponseCode.SUCCESS, body=serde.dumps(body))

    async def get_all_producer_info(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        """ProducerTableInfo: every producer group with its clients (ProducerInfo)."""
        # last heartbeat on the Trio clock -> wall-clock milliseconds, as Java reports it
        skew = time.time() - trio.current_time()
        data = {
            group: [
                {
                    "clientId": c.client_id,
                    "remoteIP": c.channel.remote_addr,
                    "language": c.language,
                    "version": c.version,
                    "lastUpdateTimestamp": int((c.last_update + skew) * 1000),
                    **_protocol(c.channel),
                }
                for c in chans.values()
            ]
            for group, chans in self.broker.producer_manager.groups.items()
        }
        return req.response(ResponseCode.SUCCESS, body=serde.dumps({"data": data}))

    async def get_consumer_connection_list(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        b = self.broker
        group = req.get_str("consumerGroup")
        info = b.consumer_manager.get_consumer_group_info(group)
        if info is None or not info.channels:
            return req.response(
                ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online"
            )
        body = {
            "connectionSet": _connection_set(info.channels.values()),
            "subscriptionTable": {
                t: serde.converter.unstructure(s) for t, s in info.subscriptions.items()
            },
            "consumeType": info.consume_type.name,
            "messageModel": info.message_model.name,
            "consumeFromWhere": info.consume_from_where.name,
        }
        return req.response(ResponseCode.SUCCESS, body=serde.dumps(body))

    async def query_topic_consume_by_who(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        b = self.broker
        topic = req.get_str("topic")
        groups = b.consumer_manager.query_topic_consume_by_who(topic)
        groups |= b.consumer_offset_manager.groups_of_topic(topic)
        return req.response(ResponseCode.SUCCESS, body=serde.dumps({"groupList": sorted(groups)}))

    # --- stats (Map<MessageQueue, ...> bodies) ------------------------------------------------
    def _store_time_at(self, topic: str, queue_id: int, offset: int) -> int:
        store = self.broker.store
        if offset < 0:
            return 0
        phys = store.get_commit_log_offset_in_queue(topic, queue_id, offset)
        m = store.look_message_by_offset(phys) if phys or offset == 0 else None
        return m.store_timestamp if m is not None and m.topic == topic else 0

    async def get_topic_stats_info(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        b = self.broker
        topic = req.get_str("topic")
        tc = b.topic_config_manager.select_topic_config(topic)
        if tc is None:
            return req.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        entries = []
        for q in range(tc.writeQueueNums):
            mx = b.store.get_max_offset_in_queue(topic, q)
            entries.append(
                (
                    MessageQueue(topic, b.config.broker_name, q),
                    {
                        "minOffset": max(b.store.get_min_offset_in_queue(topic, q), 0),
                        "maxOffset": max(mx, 0),
                        "lastUpdateTimestamp": self._store_time_at(topic, q, mx - 1),
                    },
                )
            )
        body = b'{"offsetTable":' + encode_mq_map(entries) + b"}"
        return req.response(ResponseCode.SUCCESS, body=body)

    async def get_consume_stats(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        b = self.broker
        group = req.get_str("consumerGroup")
        only = req.ext_fields.get("topic")
        topics = [only] if only else sorted(b.consumer_offset_manager.topics_of_group(group))
        entries = []
        now = trio.current_time()
        consume_tps = 0.0
        for topic in topics:
            consume_tps += b.stats.manager.tps_group_get_nums(topic, group, now)
            tc = b.topic_config_manager.select_topic_config(topic)
            if tc is None:
                continue
            for q in range(tc.writeQueueNums):
                consumer = max(b.consumer_offset_manager.query_offset(group, topic, q), 0)
                wrapper: dict[str, int] = {
                    "brokerOffset": b.store.get_max_offset_in_queue(topic, q),
                    "consumerOffset": consumer,
                    "lastTimestamp": self._store_time_at(topic, q, consumer - 1),
                }
                # pop (RocketMQ 5): popped, not acked yet; an extra field Java clients ignore
                inflight = b.pop.inflight_in_queue(group, topic, q) if b.pop is not None else 0
                if inflight:
                    wrapper["inflight"] = inflight
                entries.append((MessageQueue(topic, b.config.broker_name, q), wrapper))
        body = (
            b'{"consumeTps":%s,"offsetTable":' % repr(consume_tps).encode()
            + encode_mq_map(entries)
            + b"}"
        )
        return req.response(ResponseCode.SUCCESS, body=body)

    async def get_broker_consume_stats(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        """ConsumeStatsList: every subscription group's ConsumeStats per topic it has offsets
        on (mqadmin brokerConsumeStats); ``isOrder`` keeps the ordered topics only."""
        b = self.broker
        only_order = req.get_bool("isOrder", False)
        now = trio.current_time()
        groups = []
        total_diff = 0
        for group in sorted(b.subscription_group_manager.table):
            stats = []
            for topic in sorted(b.consumer_offset_manager.topics_of_group(group)):
                tc = b.topic_config_manager.select_topic_config(topic)
                if tc is None or (only_order and not tc.order):
                    continue
                entries = []
                for q in range(tc.writeQueueNums):
                    broker_offset = max(b.store.get_max_offset_in_queue(topic, q), 0)
                    consumer = max(b.consumer_offset_manager.query_offset(group, topic, q), 0)
                    total_diff += broker_offset - consumer
                    entries.append(
                        (
                            MessageQueue(topic, b.config.broker_name, q),
                            {
                                "brokerOffset": broker_offset,
                                "consumerOffset": consumer,
                                "lastTimestamp": self._store_time_at(topic, q, consumer - 1),
                            },
                        )
                    )
                tps = b.stats.manager.tps_group_get_nums(topic, group, now)
                stats.append(
                    b'{"consumeTps":%s,"offsetTable":' % repr(tps).encode()
                    + encode_mq_map(entries)
                    + b"}"
                )
            groups.append(b"{" + json.dumps(group).encode() + b":[" + b",".join(stats) + b"]}")
        body = (
            b'{"brokerAddr":'
            + json.dumps(b.broker_addr).encode()
            + b',"consumeStatsList":['
            + b",".join(groups)
            + b'],"totalDiff":%d}' % total_diff
        )
        return req.response(ResponseCode.SUCCESS, body=body)

    async def view_broker_stats_data(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        """BrokerStatsData of one stats item: minute, hour and day (broker_stats_manager.py)."""
        name = req.get_str("statsName")
        key = req.get_str("statsKey")
        item = self.broker.stats.manager.get(name, key)
        if item is None:
            return req.response(ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        now = trio.current_time()
        body = {
            field: attrs.asdict(item.snapshot(window, now))
            for field, window in (
                ("statsMinute", "minute"),
                ("statsHour", "hour"),
                ("statsDay", "day"),
            )
        }
        return req.response(ResponseCode.SUCCESS, body=serde.dumps(body))

    async def query_consume_queue(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        """QueryConsumeQueueResponseBody: ``count`` units of one queue from ``index``
        (mqadmin queryCq), with the group's subscription when one is named."""
        b = self.broker
        topic = req.get_str("topic")
        queue_id = req.get_int("queueId")
        index = req.get_int("index")
        count = req.get_int("count")
        group = req.ext_fields.get("consumerGroup")
        max_offset = b.store.get_max_offset_in_queue(topic, queue_id)
        if b.topic_config_manager.select_topic_config(topic) is None and max_offset <= 0:
            return req.response(ResponseCode.SYSTEM_ERROR, f"{queue_id}@{topic} is not exist!")
        body: dict[str, object] = {
            "maxQueueIndex": max_offset,
            "minQueueIndex": b.store.get_min_offset_in_queue(topic, queue_id),
        }
        if group is not None:
            sub = b.consumer_manager.find_subscription_data(group, topic)
            if sub is None:
                body["filterData"] = f"{group}@{topic} is not online!"
            else:
                body["subscriptionData"] = serde.converter.unstructure(sub)
        if index < 0 or index >= max_offset or count <= 0:
            return req.response(
                ResponseCode.SUCCESS,
                f"Index {index} of {queue_id}@{topic} is not exist!",
                body=serde.dumps(body),
            )
        units = []
        for offset in range(index, min(index + count, index + MAX_CONSUME_QUEUE_UNITS, max_offset)):
            unit = b.store.get_queue_unit(topic, queue_id, offset)
            if unit is None:
                break
            phys, size, tags_code = unit
            units.append(
                {"physicOffset": phys, "physicSize": size, "tagsCode": tags_code, "eval": False}
            )
        body["queueData"] = units
        return req.response(ResponseCode.SUCCESS, body=serde.dumps(body))

    async def clean_expired_consume_queue(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        """Drop the consume queues of topics whose every message left the CommitLog
        (RocketMQ ``cleanExpiredConsumerQueue``; it drops single queues, we whole topics, the
        store deleting by topic)."""
        b = self.broker
        store = b.store
        min_phys = store.get_min_phy_offset()
        expired = []
        for topic, queues in store.topic_queues().items():
            if topic == SCHEDULE_TOPIC:
                continue
            lasts = []
            for q in queues:
                mx = store.get_max_offset_in_queue(topic, q)
                unit = store.get_queue_unit(topic, q, mx - 1) if mx > 0 else None
                lasts.append(unit[0] if unit is not None else -1)
            # -1: a queue with nothing readable may have just been created; keep it
            if lasts and all(0 <= last < min_phys for last in lasts):
                expired.append(topic)
        if expired:
            log.warning("cleanExpiredConsumeQueue: %s", expired)
            store.delete_topics(expired)
        return req.response(ResponseCode.SUCCESS)

    async def clean_unused_topic(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        """Drop the consume queues of topics the topic table no longer has (RocketMQ
        ``cleanUnusedTopic``; the delay and transaction queues stay, whether in the table or not)."""
        b = self.broker
        keep = set(b.topic_config_manager.table) | {
            SCHEDULE_TOPIC,
            RMQ_SYS_TRANS_HALF_TOPIC,
            RMQ_SYS_TRANS_OP_HALF_TOPIC,
            TRANS_CHECK_MAX_TIME_TOPIC,
        }
        unused = [t for t in b.store.topic_queues() if t not in keep]
        if unused:
            log.warning("cleanUnusedTopic: %s", unused)
            b.store.delete_topics(unused)
        return req.response(ResponseCode.SUCCESS)

    # --- ACL admin (broker/acl/permission_manager.py) ------------------------------------------
    def _acl(self, req: RemotingCommand, failed: int) -> PlainAccessValidator:
        acl = self.broker.acl
        if acl is None:
            raise RequestError(failed, "ACL is not enabled on this broker (aclEnable=false)")
        return acl

    async def _acl_edit(self, req: RemotingCommand, failed: int, edit: Edit) -> RemotingCommand:
        acl = self._acl(req, failed)
        try:
            await acl.rewrite(edit)
        except AclEditError as exc:
            return req.response(failed, str(exc))
        return req.response(ResponseCode.SUCCESS)

    async def update_and_create_acl_config(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        failed = ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED
        update = AccountUpdate(
            access_key=req.get_str("accessKey"),
            secret_key=req.ext_fields.get("secretKey"),
            white_remote_address=req.ext_fields.get("whiteRemoteAddress"),
            admin=req.get_bool("admin", False),
            default_topic_perm=req.ext_fields.get("defaultTopicPerm"),
            default_group_perm=req.ext_fields.get("defaultGroupPerm"),
            topic_perms=split_list(req.ext_fields.get("topicPerms")),
            group_perms=split_list(req.ext_fields.get("groupPerms")),
        )
        return await self._acl_edit(req, failed, lambda doc: update_account(doc, update))

    async def delete_acl_config(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        access_key = req.get_str("accessKey")
        return await self._acl_edit(
            req, ResponseCode.DELETE_ACL_CONFIG_FAILED, lambda doc: delete_account(doc, access_key)
        )

    async def update_global_white_addrs_config(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        failed = ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED
        acl = self._acl(req, failed)
        addrs = split_list(req.get_str("globalWhiteAddrs")) or []
        # a file named from the network is only ever the broker's own ACL file
        path = req.ext_fields.get("aclFileFullPath")
        if path and PurePath(path) != PurePath(acl.path):
            return req.response(failed, f"{path} is not this broker's ACL file ({acl.path})")
        return await self._acl_edit(req, failed, lambda doc: set_global_white(doc, addrs))

    async def get_broker_cluster_acl_info(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        b = self.broker
        acl = self._acl(req, ResponseCode.SYSTEM_ERROR)
        version = serde.to_json(acl.data_version).decode()
        ext = {
            "version": version,
            "allAclFileVersion": json.dumps({acl.path: json.loads(version)}),
            "brokerName": b.config.broker_name,
            "brokerAddr": b.broker_addr,
            "clusterName": b.config.broker_cluster_name,
        }
        return req.response(ResponseCode.SUCCESS, None, ext)

    async def get_broker_cluster_acl_config(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        """GetBrokerClusterAclConfigResponseBody (4.9.7; removed in 4.9.8)."""
        acl = self._acl(req, ResponseCode.SYSTEM_ERROR)
        doc = acl.document
        body = {
            "globalWhiteAddrs": doc.get("globalWhiteRemoteAddresses") or [],
            "plainAccessConfigs": doc.get("accounts") or [],
        }
        return req.response(ResponseCode.SUCCESS, body=serde.dumps(body))
