"""Typed requests of the client, one method per RocketMQ request code (MQClientAPIImpl).

Theory of operation: each method builds the exact extFields a 4.9 Java client sends, invokes
one address through the shared `RemotingClient`, and turns the response into a value or an
error by cause (`common.errors.error_for_response`). No state lives here: which address to
call, retries and caches belong to `ClientInstance` and the Producer/consumers.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from common.errors import ProtocolError, error_for_response
from common.message import MessageExt, decode_records
from common.message_properties import decode_properties, encode_properties
from common.model import (
    CheckClientRequestBody,
    ClusterInfo,
    GetConsumerListByGroupResponseBody,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    SubscriptionData,
    TopicConfig,
    TopicList,
    TopicRouteData,
    UnlockBatchRequestBody,
)
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.serde import from_json, to_json
from rmq.remoting import Remoting, RequestHelpers

# Response codes whose send still stored the message (MQClientAPIImpl.processSendResponse).
SEND_OK_CODES = frozenset(
    {
        ResponseCode.SUCCESS,
        ResponseCode.FLUSH_DISK_TIMEOUT,
        ResponseCode.FLUSH_SLAVE_TIMEOUT,
        ResponseCode.SLAVE_NOT_AVAILABLE,
    }
)
# Pull response codes that are outcomes, not errors (PullAPIWrapper.processPullResult).
PULL_CODES = frozenset(
    {
        ResponseCode.SUCCESS,
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
        ResponseCode.PULL_OFFSET_MOVED,
    }
)

# PullSysFlag bits
PULL_COMMIT_OFFSET = 0x1
PULL_SUSPEND = 0x2
PULL_SUBSCRIPTION = 0x4


@attrs.frozen
class SendResponse:
    code: int
    msg_id: str  # offset msgId(s) from the broker; comma-joined for a batch
    queue_id: int
    queue_offset: int
    region_id: str
    trace_on: bool
    transaction_id: str | None


@attrs.frozen
class PullResponse:
    code: int
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_which_broker_id: int
    messages: list[MessageExt]  # tag filtering is the caller's


def send_code(header: Mapping[str, object]) -> int:
    """SEND_BATCH_MESSAGE when header `m` is true (a bool, or the string a prepared header
    carries), SEND_REPLY_MESSAGE_V2 for a reply, else SEND_MESSAGE_V2."""
    m = header.get("m")
    batch = m is True or m == "true"
    if batch:
        return RequestCode.SEND_BATCH_MESSAGE
    # a reply (MSG_TYPE=reply, rmq.request_reply) goes as SEND_REPLY_MESSAGE_V2, as in Java
    props = header.get("i")
    if isinstance(props, str) and "MSG_TYPE\x01reply" in props:
        if decode_properties(props).get("MSG_TYPE") == "reply":
            return RequestCode.SEND_REPLY_MESSAGE_V2
    return RequestCode.SEND_MESSAGE_V2


def send_response(resp: RemotingCommand, header: Mapping[str, object]) -> SendResponse:
    """The answer to a send request with `header`; error codes raise by cause."""
    return SendResponse(*send_answer(resp, header))


def send_answer(
    resp: RemotingCommand, header: Mapping[str, object]
) -> tuple[int, str, int, int, str, bool, str | None]:
    """`send_response`'s fields as a tuple, in its order: the producer's send reads them into
    its SendResult without the SendResponse in between (a send's client CPU, issue 28)."""
    code = resp.code
    if code not in SEND_OK_CODES:
        raise error_for_response(code, resp.remark)
    ext = resp.ext_fields
    get = ext.get
    return (
        code,
        get("msgId", ""),
        # the header's `e` is an int, or its string in a prepared header
        int(get("queueId", str(header.get("e", 0)))),
        int(get("queueOffset", -1)),
        get("MSG_REGION") or "DefaultRegion",
        get("TRACE_ON", "true") != "false",
        get("transactionId"),
    )


class ClientAPI(RequestHelpers):
    """Stateless request helpers over a RemotingClient (a `Remoting`: oneway sends too)."""

    remoting: Remoting

    def __init__(self, remoting: Remoting) -> None:
        super().__init__(remoting)
        self.remoting = remoting

    # --- nameserver ----------------------------------------------------------------------

    async def get_route_info(self, addr: str, topic: str, *, timeout: float) -> TopicRouteData:
        """GET_ROUTEINFO_BY_TOPIC; TopicNotExistError (17) when the nameserver has none."""
        resp = await self._call_ok(
            addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, timeout=timeout
        )
        return from_json(resp.body_bytes(), TopicRouteData)

    async def get_cluster_info(self, addr: str, *, timeout: float) -> ClusterInfo:
        resp = await self._call_ok(addr, RequestCode.GET_BROKER_CLUSTER_INFO, timeout=timeout)
        return from_json(resp.body_bytes(), ClusterInfo)

    async def get_topic_list(self, addr: str, *, timeout: float) -> list[str]:
        resp = await self._call_ok(
            addr, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, timeout=timeout
        )
        return list(from_json(resp.body_bytes(), TopicList).topicList)

    # --- broker: messages ----------------------------------------------------------------

    @staticmethod
    def send_header(
        *,
        group: str,
        topic: str,
        queue_id: int,
        properties: Mapping[str, str],
        born_timestamp: int,
        flag: int = 0,
        sys_flag: int = 0,
        default_topic: str = "TBW102",
        default_topic_queue_nums: int = 4,
        batch: bool = False,
        broker_name: str | None = None,
    ) -> dict[str, object]:
        """SendMessageRequestHeaderV2 (the Java class of that name) with its one-letter names."""
        header: dict[str, object] = {
            "a": group,
            "b": topic,
            "c": default_topic,
            "d": default_topic_queue_nums,
            "e": queue_id,
            "f": sys_flag,
            "g": born_timestamp,
            "h": flag,
            "i": encode_properties(properties),
            "j": 0,
            "k": False,
            "m": batch,
        }
        if broker_name is not None:
            header["n"] = broker_name
        return header

    async def send_message(
        self, addr: str, header: Mapping[str, object], body: bytes, *, timeout: float
    ) -> SendResponse:
        """SEND_MESSAGE_V2, or SEND_BATCH_MESSAGE when header `m` is true."""
        code = send_code(header)
        resp = await self._call(addr, code, header, body, timeout=timeout)
        return send_response(resp, header)

    async def send_message_oneway(
        self, addr: str, header: Mapping[str, object], body: bytes
    ) -> None:
        code = send_code(header)
        await self.remoting.invoke_oneway(
            addr, RemotingCommand.request(code, header, body, oneway=True)
        )

    async def pull_message(
        self,
        addr: str,
        *,
        group: str,
        mq: MessageQueue,
        offset: int,
        max_nums: int,
        sys_flag: int,
        commit_offset: int,
        suspend_ms: int,
        subscription: str,
        sub_version: int,
        timeout: float,
        expression_type: str = "TAG",
    ) -> PullResponse:
        header = {
            "consumerGroup": group,
            "topic": mq.topic,
            "queueId": mq.queueId,
            "queueOffset": offset,
            "maxMsgNums": max_nums,
            "sysFlag": sys_flag,
            "commitOffset": commit_offset,
            "suspendTimeoutMillis": suspend_ms,
            "subscription": subscription,
            "subVersion": sub_version,
            "expressionType": expression_type,
            "bname": mq.brokerName,
        }
        resp = await self._call(addr, RequestCode.PULL_MESSAGE, header, timeout=timeout)
        if resp.code not in PULL_CODES:
            raise error_for_response(resp.code, resp.remark)
        ext = resp.ext_fields
        try:
            next_begin = int(ext["nextBeginOffset"])
            min_off = int(ext.get("minOffset", 0))
            max_off = int(ext.get("maxOffset", 0))
            suggest = int(ext.get("suggestWhichBrokerId", 0))
        except (KeyError, ValueError):
            raise ProtocolError(
                f"pull response {resp.code} without a valid nextBeginOffset: {dict(ext)}"
            ) from None
        body = resp.body_bytes() if resp.code == ResponseCode.SUCCESS else b""
        messages = decode_records(body) if body else []
        return PullResponse(resp.code, next_begin, min_off, max_off, suggest, messages)

    # --- broker: offsets -----------------------------------------------------------------

    async def query_consumer_offset(
        self, addr: str, group: str, mq: MessageQueue, *, timeout: float
    ) -> int | None:
        """The group's committed offset, None when the broker has none (22 QUERY_NOT_FOUND)."""
        resp = await self._call(
            addr,
            RequestCode.QUERY_CONSUMER_OFFSET,
            {
                "consumerGroup": group,
                "topic": mq.topic,
                "queueId": mq.queueId,
                "bname": mq.brokerName,
            },
            timeout=timeout,
        )
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        if resp.code != ResponseCode.SUCCESS:
            raise error_for_response(resp.code, resp.remark)
        return int(resp.ext_fields.get("offset", 0))

    async def update_consumer_offset(
        self, addr: str, group: str, mq: MessageQueue, offset: int, *, timeout: float
    ) -> None:
        await self._call_ok(
            addr,
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {
                "consumerGroup": group,
                "topic": mq.topic,
                "queueId": mq.queueId,
                "commitOffset": offset,
                "bname": mq.brokerName,
            },
            timeout=timeout,
        )

    async def _offset(
        self,
        addr: str,
        code: int,
        mq: MessageQueue,
        extra: Mapping[str, object] | None = None,
        *,
        timeout: float,
    ) -> int:
        ext = {"topic": mq.topic, "queueId": mq.queueId, "bname": mq.brokerName, **(extra or {})}
        resp = await self._call_ok(addr, code, ext, timeout=timeout)
        return int(resp.ext_fields.get("offset", 0))

    async def get_max_offset(self, addr: str, mq: MessageQueue, *, timeout: float) -> int:
        return await self._offset(addr, RequestCode.GET_MAX_OFFSET, mq, timeout=timeout)

    async def get_min_offset(self, addr: str, mq: MessageQueue, *, timeout: float) -> int:
        return await self._offset(addr, RequestCode.GET_MIN_OFFSET, mq, timeout=timeout)

    async def search_offset(
        self, addr: str, mq: MessageQueue, timestamp_ms: int, *, timeout: float
    ) -> int:
        return await self._offset(
            addr,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            mq,
            {"timestamp": timestamp_ms},
            timeout=timeout,
        )

    # --- broker: admin -------------------------------------------------------------------

    async def create_topic(self, addr: str, config: TopicConfig, *, timeout: float) -> None:
        await self._call_ok(
            addr,
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {
                "topic": config.topicName,
                "defaultTopic": "TBW102",
                "readQueueNums": config.readQueueNums,
                "writeQueueNums": config.writeQueueNums,
                "perm": config.perm,
                "topicFilterType": config.topicFilterType,
                "topicSysFlag": config.topicSysFlag,
                "order": config.order,
                # RocketMQ 5's attribute syntax; only sent when the topic has attributes
                **(
                    {"attributes": ",".join(f"+{k}={v}" for k, v in config.attributes.items())}
                    if config.attributes
                    else {}
                ),
            },
            timeout=timeout,
        )

    # --- broker: consumer groups (MQClientAPIImpl, push consumer side) ---------------------

    async def heartbeat(self, addr: str, data: HeartbeatData, *, timeout: float) -> int:
        """HEART_BEAT; returns the broker's version (Java reads it from the response)."""
        resp = await self._call_ok(
            addr, RequestCode.HEART_BEAT, None, to_json(data), timeout=timeout
        )
        return resp.version

    async def unregister_client(
        self,
        addr: str,
        client_id: str,
        *,
        producer_group: str | None = None,
        consumer_group: str | None = None,
        timeout: float,
    ) -> None:
        ext: dict[str, object] = {"clientID": client_id}
        if producer_group:
            ext["producerGroup"] = producer_group
        if consumer_group:
            ext["consumerGroup"] = consumer_group
        await self._call_ok(addr, RequestCode.UNREGISTER_CLIENT, ext, timeout=timeout)

    async def check_client_config(
        self, addr: str, group: str, client_id: str, sub: SubscriptionData, *, timeout: float
    ) -> None:
        """CHECK_CLIENT_CONFIG: does the broker take this (SQL92) subscription? Raises if not."""
        body = to_json(
            CheckClientRequestBody(clientId=client_id, group=group, subscriptionData=sub)
        )
        await self._call_ok(addr, RequestCode.CHECK_CLIENT_CONFIG, None, body, timeout=timeout)

    async def get_consumer_id_list(self, addr: str, group: str, *, timeout: float) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP; the broker answers 1 when the group has no member."""
        resp = await self._call_ok(
            addr,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP,
            {"consumerGroup": group},
            timeout=timeout,
        )
        return list(from_json(resp.body_bytes(), GetConsumerListByGroupResponseBody).consumerIdList)

    async def lock_batch_mq(
        self, addr: str, group: str, client_id: str, mqs: list[MessageQueue], *, timeout: float
    ) -> set[MessageQueue]:
        body = to_json(LockBatchRequestBody(consumerGroup=group, clientId=client_id, mqSet=mqs))
        resp = await self._call_ok(addr, RequestCode.LOCK_BATCH_MQ, None, body, timeout=timeout)
        return set(from_json(resp.body_bytes(), LockBatchResponseBody).lockOKMQSet)

    async def unlock_batch_mq(
        self, addr: str, group: str, client_id: str, mqs: list[MessageQueue], *, timeout: float
    ) -> None:
        body = to_json(UnlockBatchRequestBody(consumerGroup=group, clientId=client_id, mqSet=mqs))
        await self._call_ok(addr, RequestCode.UNLOCK_BATCH_MQ, None, body, timeout=timeout)

    async def consumer_send_msg_back(
        self,
        addr: str,
        msg: MessageExt,
        group: str,
        delay_level: int,
        max_reconsume_times: int,
        *,
        timeout: float,
    ) -> None:
        """CONSUMER_SEND_MSG_BACK of a pulled message (by its CommitLog offset)."""
        origin_id = msg.properties.get("ORIGIN_MESSAGE_ID") or msg.msg_id
        await self._call_ok(
            addr,
            RequestCode.CONSUMER_SEND_MSG_BACK,
            {
                "offset": msg.commit_log_offset,
                "group": group,
                "delayLevel": delay_level,
                "originMsgId": origin_id,
                "originTopic": msg.topic,
                "unitMode": False,
                "maxReconsumeTimes": max_reconsume_times,
            },
            timeout=timeout,
        )
