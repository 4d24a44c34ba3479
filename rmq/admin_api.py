"""Admin wire calls and the values they answer (the admin half of MQClientAPIImpl).

Theory of operation: like `rmq.client_api`, each function builds the extFields a 4.9 Java
admin tool sends to ONE address and turns the answer into a value or an error by cause. Which
addresses to ask and how to merge the answers of several brokers is `rmq.admin.Admin`'s job.

Some answers are not strict JSON: TopicStatsTable and ConsumeStats (and the consumer bodies
relayed from clients) are fastjson renderings of a `Map<MessageQueue, V>`, whose keys are JSON
*objects* (`{{"brokerName":..}:{..}}`); `common.mq_map` reads and writes that shape.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from common.errors import ProtocolError, error_for_response
from common.message import MessageExt, decode_records
from common.model import MessageQueue
from common.mq_map import as_mq_entries, parse_mq_map, parse_value
from common.remoting.codes import RequestCode, ResponseCode
from common.reset_offset_body import decode_consumer_table, decode_offset_table
from common.serde import loads
from rmq.remoting import RequestHelpers

# QueryMessageRequestHeader's end timestamp when the caller wants "any time" (Long.MAX_VALUE).
END_OF_TIME = 2**63 - 1

# --- values ----------------------------------------------------------------------------------


@attrs.frozen
class QueueConsumeStats:
    """One queue of a group's progress (Java OffsetWrapper)."""

    queue: MessageQueue
    broker_offset: int  # the queue's max offset (next offset to be written)
    consumer_offset: int  # the group's committed offset (0 when it never committed)
    last_timestamp: int  # store time (ms) of the last consumed message, 0 when none
    # pop (RocketMQ 5): messages popped and neither acked nor revived yet
    inflight: int = 0

    @property
    def lag(self) -> int:
        return max(self.broker_offset - self.consumer_offset, 0)


@attrs.frozen
class ConsumeStats:
    """A group's progress over every queue it consumes (Java ConsumeStats), merged over brokers."""

    group: str
    queues: tuple[QueueConsumeStats, ...]  # sorted by topic, broker name, queue id
    consume_tps: float = 0.0  # summed over the brokers that report it

    @property
    def lag(self) -> int:
        return sum(q.lag for q in self.queues)

    @property
    def inflight(self) -> int:
        return sum(q.inflight for q in self.queues)

    @property
    def broker_offset(self) -> int:
        return sum(q.broker_offset for q in self.queues)

    @property
    def consumer_offset(self) -> int:
        return sum(q.consumer_offset for q in self.queues)

    def topics(self) -> list[str]:
        return sorted({q.queue.topic for q in self.queues})


@attrs.frozen
class ConsumerConnection:
    """One online client of a consumer group as a broker sees it (Java Connection + group)."""

    client_id: str
    client_addr: str
    language: str
    version: int
    # the group's subscriptions (topic -> sub expression), its consume type and model
    subscriptions: dict[str, str] = attrs.field(factory=dict, eq=False)
    consume_type: str = ""
    message_model: str = ""
    consume_from_where: str = ""
    protocol: str = "REMOTING"  # or GRPC_V2: a RocketMQ 5 client (broker/grpc)


@attrs.frozen
class OffsetReset:
    """One queue of a group's offset reset: where the group was and where it is sent."""

    queue: MessageQueue
    old_offset: int  # the group's committed offset before, -1 when it had none
    new_offset: int


@attrs.frozen
class ConsumerRunningInfo:
    """What one client says about its consumer of a group (Java ConsumerRunningInfo)."""

    properties: dict[str, str]
    subscriptions: list[dict[str, Any]]  # SubscriptionData as the client wrote it
    # MessageQueue -> ProcessQueueInfo (commitOffset, cachedMsgCount, locked, ...)
    mq_table: list[tuple[MessageQueue, dict[str, Any]]]
    # topic -> ConsumeStatus (pullRT, pullTPS, consumeRT, consumeOKTPS, ...)
    status_table: dict[str, dict[str, Any]]
    jstack: str | None = None


@attrs.frozen
class ConsumeMessageDirectlyResult:
    """A client's answer to CONSUME_MESSAGE_DIRECTLY (Java ConsumeMessageDirectlyResult)."""

    consume_result: str  # CR_SUCCESS, CR_LATER, CR_ROLLBACK, CR_COMMIT, CR_THROW_EXCEPTION, ...
    remark: str | None
    spent_time_ms: int
    order: bool = False
    auto_commit: bool = True


@attrs.frozen
class QueueStats:
    """One queue of a topic (Java TopicOffset)."""

    queue: MessageQueue
    min_offset: int
    max_offset: int
    last_update_timestamp: int  # store time (ms) of the newest message, 0 when empty

    @property
    def count(self) -> int:
        return max(self.max_offset - self.min_offset, 0)


@attrs.frozen
class ProducerInfo:
    """One producer client as a broker sees it (Java ProducerInfo of GET_ALL_PRODUCER_INFO)."""

    group: str
    client_id: str
    client_addr: str
    language: str
    version: int
    last_update_timestamp: int  # wall-clock ms of its last heartbeat
    protocol: str = "REMOTING"  # or GRPC_V2: a RocketMQ 5 client (broker/grpc)


@attrs.frozen
class StatsWindow:
    """One window of VIEW_BROKER_STATS_DATA (Java BrokerStatsItem)."""

    sum: int
    tps: float
    avgpt: float


@attrs.frozen
class BrokerStatsData:
    minute: StatsWindow
    hour: StatsWindow
    day: StatsWindow

    def sum_24h(self) -> int:
        """mqadmin statsAll's compute24HourSum: the day, else the hour, else the minute."""
        return self.day.sum or self.hour.sum or self.minute.sum


# --- Map<MessageQueue, V> bodies: common.mq_map (re-exported: callers import it from here)


def _int(value: Any, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ProtocolError(f"{what} is not an integer: {value!r}") from None


# ConsumerRunningInfo of a C++ member without queues (see AdminAPI.consumer_running_info)
_CPP_EMPTY_MQ_TABLE = b'{"mqTable":},'

# --- requests --------------------------------------------------------------------------------


class AdminAPI(RequestHelpers):
    """Stateless admin requests over a RemotingClient (all they need is `invoke`)."""

    async def broker_runtime_info(self, addr: str, *, timeout: float) -> dict[str, str]:
        resp = await self._call_ok(addr, RequestCode.GET_BROKER_RUNTIME_INFO, timeout=timeout)
        try:
            table = loads(resp.body_bytes()).get("table")
        except (ValueError, AttributeError) as exc:
            raise ProtocolError(
                f"{addr} sent a runtime info body that is not a KVTable: {exc}"
            ) from None
        if not isinstance(table, dict):
            raise ProtocolError(f"{addr} sent a runtime info body without a table")
        return {str(k): str(v) for k, v in table.items()}

    async def offset_topics_by_group(self, addr: str, *, timeout: float) -> dict[str, set[str]]:
        """group -> the topics it has a consumer offset for on the broker at `addr`, from
        GET_ALL_CONSUMER_OFFSET (ConsumerOffsetSerializeWrapper, keyed `topic@group`)."""
        resp = await self._call_ok(addr, RequestCode.GET_ALL_CONSUMER_OFFSET, timeout=timeout)
        try:
            table = loads(resp.body_bytes() or b"{}").get("offsetTable") or {}
        except (ValueError, AttributeError) as exc:
            raise ProtocolError(
                f"{addr} sent a bad ConsumerOffsetSerializeWrapper: {exc}"
            ) from None
        groups: dict[str, set[str]] = {}
        for key, queues in table.items():
            topic, at, group = str(key).rpartition("@")
            if at and queues:
                groups.setdefault(group, set()).add(topic)
        return groups

    async def subscription_groups(self, addr: str, *, timeout: float) -> list[str]:
        """Group names of GET_ALL_SUBSCRIPTIONGROUP_CONFIG (SubscriptionGroupWrapper)."""
        resp = await self._call_ok(
            addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, timeout=timeout
        )
        try:
            table = loads(resp.body_bytes()).get("subscriptionGroupTable") or {}
        except (ValueError, AttributeError) as exc:
            raise ProtocolError(f"{addr} sent a bad SubscriptionGroupWrapper: {exc}") from None
        return sorted(str(g) for g in table)

    async def consume_stats(
        self, addr: str, group: str, topic: str | None, *, timeout: float
    ) -> tuple[float, list[QueueConsumeStats]]:
        ext: dict[str, object] = {"consumerGroup": group}
        if topic:
            ext["topic"] = topic
        resp = await self._call_ok(addr, RequestCode.GET_CONSUME_STATS, ext, timeout=timeout)
        others, entries = parse_mq_map(resp.body_bytes(), "offsetTable")
        try:
            tps = float(others.get("consumeTps") or 0.0)
        except (TypeError, ValueError):
            tps = 0.0
        out = []
        for mq, v in entries:
            if not isinstance(v, dict):
                raise ProtocolError(f"consume stats value of {mq} is not an object: {v!r}")
            out.append(
                QueueConsumeStats(
                    mq,
                    _int(v.get("brokerOffset", 0), "brokerOffset"),
                    _int(v.get("consumerOffset", 0), "consumerOffset"),
                    _int(v.get("lastTimestamp", 0), "lastTimestamp"),
                    _int(v.get("inflight", 0), "inflight"),
                )
            )
        return tps, out

    async def topic_stats(self, addr: str, topic: str, *, timeout: float) -> list[QueueStats]:
        resp = await self._call_ok(
            addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}, timeout=timeout
        )
        _, entries = parse_mq_map(resp.body_bytes(), "offsetTable")
        out = []
        for mq, v in entries:
            if not isinstance(v, dict):
                raise ProtocolError(f"topic stats value of {mq} is not an object: {v!r}")
            out.append(
                QueueStats(
                    mq,
                    _int(v.get("minOffset", 0), "minOffset"),
                    _int(v.get("maxOffset", 0), "maxOffset"),
                    _int(v.get("lastUpdateTimestamp", 0), "lastUpdateTimestamp"),
                )
            )
        return out

    async def consumer_connections(
        self, addr: str, group: str, *, timeout: float
    ) -> list[ConsumerConnection]:
        """The group's clients on this broker; [] when CONSUMER_NOT_ONLINE (206)."""
        resp = await self._call(
            addr,
            RequestCode.GET_CONSUMER_CONNECTION_LIST,
            {"consumerGroup": group},
            timeout=timeout,
        )
        if resp.code == ResponseCode.CONSUMER_NOT_ONLINE:
            return []
        if resp.code != ResponseCode.SUCCESS:
            raise error_for_response(resp.code, resp.remark)
        try:
            doc = loads(resp.body_bytes())
            subs = {
                str(t): str((s or {}).get("subString", "*"))
                for t, s in (doc.get("subscriptionTable") or {}).items()
            }
            return [
                ConsumerConnection(
                    str(c.get("clientId", "")),
                    str(c.get("clientAddr", "")),
                    str(c.get("language", "")),
                    _int(c.get("version", 0), "version"),
                    subs,
                    str(doc.get("consumeType") or ""),
                    str(doc.get("messageModel") or ""),
                    str(doc.get("consumeFromWhere") or ""),
                    str(c.get("protocol") or "REMOTING"),
                )
                for c in doc.get("connectionSet") or []
            ]
        except (ValueError, AttributeError) as exc:
            raise ProtocolError(f"{addr} sent a bad ConsumerConnection body: {exc}") from None

    # --- offset reset and what the broker relays to a client (Broker2Client) ------------------

    async def reset_offset(
        self, addr: str, topic: str, group: str, timestamp: int, force: bool, *, timeout: float
    ) -> dict[MessageQueue, int]:
        """INVOKE_BROKER_TO_RESET_OFFSET: the broker's new offsets (ResetOffsetBody)."""
        ext = {"topic": topic, "group": group, "timestamp": timestamp, "isForce": force}
        resp = await self._call_ok(
            addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext, timeout=timeout
        )
        return decode_offset_table(resp.body_bytes()) if resp.body_bytes() else {}

    async def consumer_status(
        self, addr: str, topic: str, group: str, client_id: str | None, *, timeout: float
    ) -> dict[str, dict[MessageQueue, int]]:
        """INVOKE_BROKER_TO_GET_CONSUMER_STATUS: client id -> its in-memory offsets."""
        ext: dict[str, object] = {"topic": topic, "group": group}
        if client_id:
            ext["clientAddr"] = client_id
        resp = await self._call_ok(
            addr, RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, ext, timeout=timeout
        )
        return decode_consumer_table(resp.body_bytes())

    async def consumer_running_info(
        self, addr: str, group: str, client_id: str, *, jstack: bool = False, timeout: float
    ) -> ConsumerRunningInfo:
        """GET_CONSUMER_RUNNING_INFO relayed by the broker at `addr` to the client."""
        ext = {"consumerGroup": group, "clientId": client_id, "jstackEnable": jstack}
        resp = await self._call_ok(
            addr, RequestCode.GET_CONSUMER_RUNNING_INFO, ext, timeout=timeout
        )
        body = resp.body_bytes()
        if body.startswith(_CPP_EMPTY_MQ_TABLE):
            # rocketmq-client-cpp writes an empty mqTable as `"mqTable":}` (its encoder cuts
            # the `{` when no queue follows): a member that owns no queue
            body = b'{"mqTable":{},' + body[len(_CPP_EMPTY_MQ_TABLE) :]
        try:
            doc = parse_value(body)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            props = doc.get("properties") or {}
            status = doc.get("statusTable") or {}
            return ConsumerRunningInfo(
                {str(k): str(v) for k, v in props.items()},
                [s for s in doc.get("subscriptionSet") or [] if isinstance(s, dict)],
                as_mq_entries(doc.get("mqTable")),
                {str(k): v for k, v in status.items() if isinstance(v, dict)},
                doc.get("jstack"),
            )
        except (ValueError, AttributeError) as exc:
            raise ProtocolError(f"{addr} sent a bad ConsumerRunningInfo: {exc}") from None

    async def consume_message_directly(
        self, addr: str, group: str, client_id: str, msg_id: str, *, timeout: float
    ) -> ConsumeMessageDirectlyResult:
        """CONSUME_MESSAGE_DIRECTLY: the broker at `addr` (the message's store) hands the
        message to the client's listener; what the listener said."""
        ext = {"consumerGroup": group, "clientId": client_id, "msgId": msg_id}
        resp = await self._call_ok(addr, RequestCode.CONSUME_MESSAGE_DIRECTLY, ext, timeout=timeout)
        try:
            doc = loads(resp.body_bytes())
            return ConsumeMessageDirectlyResult(
                str(doc.get("consumeResult")),
                doc.get("remark"),
                _int(doc.get("spentTimeMills", 0), "spentTimeMills"),
                bool(doc.get("order", False)),
                bool(doc.get("autoCommit", True)),
            )
        except (ValueError, AttributeError) as exc:
            raise ProtocolError(f"{addr} sent a bad ConsumeMessageDirectlyResult: {exc}") from None

    async def delete_topic_in_broker(self, addr: str, topic: str, *, timeout: float) -> None:
        await self._call_ok(
            addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic}, timeout=timeout
        )

    async def delete_topic_in_namesrv(
        self, addr: str, topic: str, cluster: str | None, *, timeout: float
    ) -> None:
        ext: dict[str, object] = {"topic": topic}
        if cluster:
            ext["clusterName"] = cluster
        await self._call_ok(addr, RequestCode.DELETE_TOPIC_IN_NAMESRV, ext, timeout=timeout)

    async def query_message(
        self,
        addr: str,
        topic: str,
        key: str,
        max_num: int,
        *,
        unique: bool = False,
        begin: int = 0,
        end: int = END_OF_TIME,
        timeout: float,
    ) -> list[MessageExt]:
        """QUERY_MESSAGE: records indexed under `key` (or the UNIQ_KEY with `unique`)."""
        ext = {
            "topic": topic,
            "key": key,
            "maxNum": max_num,
            "beginTimestamp": begin,
            "endTimestamp": end,
            "_UNIQUE_KEY_QUERY": "true" if unique else "false",
        }
        resp = await self._call(addr, RequestCode.QUERY_MESSAGE, ext, timeout=timeout)
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return []
        if resp.code != ResponseCode.SUCCESS:
            raise error_for_response(resp.code, resp.remark)
        body = resp.body_bytes()
        return decode_records(body) if body else []

    async def view_message(self, addr: str, phys_offset: int, *, timeout: float) -> MessageExt:
        """VIEW_MESSAGE_BY_ID: the record at CommitLog offset `phys_offset`."""
        resp = await self._call_ok(
            addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": phys_offset}, timeout=timeout
        )
        records = decode_records(resp.body_bytes())
        if not records:
            raise ProtocolError(f"{addr} answered VIEW_MESSAGE_BY_ID with no record")
        return records[0]

    # --- operations (broker config, producers, groups, permissions, stats) --------------------

    async def broker_config(self, addr: str, *, timeout: float) -> tuple[dict[str, str], str]:
        """GET_BROKER_CONFIG: (properties in the broker's order, the DataVersion JSON)."""
        resp = await self._call_ok(addr, RequestCode.GET_BROKER_CONFIG, timeout=timeout)
        props: dict[str, str] = {}
        for line in resp.body_bytes().decode("utf-8", "replace").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                props[key.strip()] = value.strip()
        return props, str((resp.ext_fields or {}).get("version", ""))

    async def update_broker_config(
        self, addr: str, props: dict[str, str], *, timeout: float
    ) -> str | None:
        """UPDATE_BROKER_CONFIG; the broker's remark (which keys wait for a restart) or None."""
        body = "".join(f"{k}={v}\n" for k, v in props.items()).encode("utf-8")
        resp = await self._call_ok(
            addr, RequestCode.UPDATE_BROKER_CONFIG, None, body, timeout=timeout
        )
        return resp.remark

    async def all_producer_info(self, addr: str, *, timeout: float) -> list[ProducerInfo]:
        """GET_ALL_PRODUCER_INFO: every producer client of every group on this broker."""
        resp = await self._call_ok(addr, RequestCode.GET_ALL_PRODUCER_INFO, {}, timeout=timeout)
        try:
            data = loads(resp.body_bytes()).get("data") or {}
            return [
                ProducerInfo(
                    str(group),
                    str(p.get("clientId", "")),
                    str(p.get("remoteIP", "")),
                    str(p.get("language", "")),
                    _int(p.get("version", 0), "version"),
                    _int(p.get("lastUpdateTimestamp", 0), "lastUpdateTimestamp"),
                    str(p.get("protocol") or "REMOTING"),
                )
                for group, infos in data.items()
                for p in infos or []
            ]
        except (ValueError, AttributeError, TypeError) as exc:
            raise ProtocolError(f"{addr} sent a bad ProducerTableInfo: {exc}") from None

    async def create_subscription_group(
        self, addr: str, config: dict[str, object], *, timeout: float
    ) -> None:
        body = json.dumps(config).encode("utf-8")
        await self._call_ok(
            addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, body, timeout=timeout
        )

    async def delete_subscription_group(
        self, addr: str, group: str, remove_offset: bool, *, timeout: float
    ) -> None:
        ext = {"groupName": group, "removeOffset": "true" if remove_offset else "false"}
        await self._call_ok(addr, RequestCode.DELETE_SUBSCRIPTIONGROUP, ext, timeout=timeout)

    async def write_perm_of_broker(
        self, namesrv: str, broker_name: str, *, wipe: bool, timeout: float
    ) -> int:
        """WIPE_WRITE_PERM_OF_BROKER / ADD_WRITE_PERM_OF_BROKER on one nameserver: how many
        topics changed (wipeTopicCount / addTopicCount)."""
        code = (
            RequestCode.WIPE_WRITE_PERM_OF_BROKER if wipe else RequestCode.ADD_WRITE_PERM_OF_BROKER
        )
        resp = await self._call_ok(namesrv, code, {"brokerName": broker_name}, timeout=timeout)
        field = "wipeTopicCount" if wipe else "addTopicCount"
        return _int((resp.ext_fields or {}).get(field, 0), field)

    async def broker_stats(
        self, addr: str, name: str, key: str, *, timeout: float
    ) -> BrokerStatsData | None:
        """VIEW_BROKER_STATS_DATA; None when the broker has no such item (nothing counted)."""
        resp = await self._call(
            addr,
            RequestCode.VIEW_BROKER_STATS_DATA,
            {"statsName": name, "statsKey": key},
            timeout=timeout,
        )
        if resp.code == ResponseCode.SYSTEM_ERROR and "not exist" in (resp.remark or ""):
            return None
        if resp.code != ResponseCode.SUCCESS:
            raise error_for_response(resp.code, resp.remark)
        try:
            doc = loads(resp.body_bytes())

            def window(field: str) -> StatsWindow:
                w = doc.get(field) or {}
                return StatsWindow(
                    _int(w.get("sum", 0), "sum"),
                    float(w.get("tps", 0.0)),
                    float(w.get("avgpt", 0.0)),
                )

            return BrokerStatsData(window("statsMinute"), window("statsHour"), window("statsDay"))
        except (ValueError, AttributeError, TypeError) as exc:
            raise ProtocolError(f"{addr} sent a bad BrokerStatsData: {exc}") from None

    async def consume_by_who(self, addr: str, topic: str, *, timeout: float) -> list[str]:
        """QUERY_TOPIC_CONSUME_BY_WHO: the groups that consume (or have offsets on) `topic`."""
        resp = await self._call_ok(
            addr, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": topic}, timeout=timeout
        )
        try:
            return sorted(str(g) for g in loads(resp.body_bytes()).get("groupList") or [])
        except (ValueError, AttributeError) as exc:
            raise ProtocolError(f"{addr} sent a bad GroupList: {exc}") from None

    async def subscription_group_configs(
        self, addr: str, *, timeout: float
    ) -> dict[str, dict[str, Any]]:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG: group name -> its SubscriptionGroupConfig fields."""
        resp = await self._call_ok(
            addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, timeout=timeout
        )
        try:
            table = loads(resp.body_bytes()).get("subscriptionGroupTable") or {}
            return {str(g): dict(c) for g, c in table.items()}
        except (ValueError, AttributeError, TypeError) as exc:
            raise ProtocolError(f"{addr} sent a bad SubscriptionGroupWrapper: {exc}") from None
