"""RocketMQ 5's pop codes on the remoting port: POP_MESSAGE 200050, ACK_MESSAGE 200051,
CHANGE_MESSAGE_INVISIBLETIME 200053, BATCH_ACK_MESSAGE 200151 (``PopMessageProcessor``,
``AckMessageProcessor``, ``ChangeInvisibleTimeProcessor`` in apache/rocketmq 5.x), over
``controller.pop``.  PEEK_MESSAGE 200052 is not served (REQUEST_CODE_NOT_SUPPORTED).

Headers are RocketMQ 5's: a pop names ``consumerGroup topic queueId maxMsgNums invisibleTime
pollTime bornTime initMode expType exp order``; its answer carries ``popTime invisibleTime
reviveQid restNum startOffsetInfo msgOffsetInfo orderCountInfo`` and the records.  The Java
client rebuilds each handle from those headers unless the record has a ``POP_CK`` property,
so we put the exact handle there too and both agree.  A record read from the pop retry topic
is answered under the topic asked for, with its handle in ``POP_CK`` (RocketMQ 5 does the same
unless ``popResponseReturnActualRetryTopic``).

Answers: SUCCESS with records; POLLING_TIMEOUT 210 when nothing came within the poll time;
POLLING_FULL 209; TOPIC_NOT_EXIST 17, SUBSCRIPTION_GROUP_NOT_EXIST 26, NO_PERMISSION 16,
SUBSCRIPTION_PARSE_FAILED 23, SYSTEM_ERROR 1 for a bad queue id / count, and
SERVICE_NOT_AVAILABLE 14 on a broker that is not the master (pop state lives on the master).
An ack of a stale handle answers SUCCESS (RocketMQ's ack is idempotent); a change of invisible
time on one answers NO_MESSAGE 208; a handle that does not parse answers MESSAGE_ILLEGAL 13.
"""

from __future__ import annotations

import base64
import json

from broker.controller import BrokerController
from broker.pop.api import AckStatus, ConsumeInitMode, PopMessage, PopRequest, PopService, PopStatus
from broker.pop.receipt import BadReceiptHandle, ReceiptHandle
from common.errors import RequestError
from common.message import MessageExtBrokerInner
from common.message_encoder import encode_record
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.server import Channel, RequestDispatcher

__all__ = ["PopProcessor"]

POP_CK = "POP_CK"  # MessageConst.PROPERTY_POP_CK

_POP_CODES = {
    PopStatus.FOUND: ResponseCode.SUCCESS,
    PopStatus.NO_NEW_MSG: ResponseCode.POLLING_TIMEOUT,
    PopStatus.POLLING_FULL: ResponseCode.POLLING_FULL,
    PopStatus.TOPIC_NOT_EXIST: ResponseCode.TOPIC_NOT_EXIST,
    PopStatus.SUBSCRIPTION_GROUP_NOT_EXIST: ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
    PopStatus.NO_PERMISSION: ResponseCode.NO_PERMISSION,
    PopStatus.BAD_REQUEST: ResponseCode.SYSTEM_ERROR,
    PopStatus.FILTER_ERROR: ResponseCode.SUBSCRIPTION_PARSE_FAILED,
    PopStatus.NOT_MASTER: ResponseCode.SERVICE_NOT_AVAILABLE,
}

_ACK_CODES = {
    AckStatus.OK: ResponseCode.SUCCESS,
    AckStatus.BAD_HANDLE: ResponseCode.MESSAGE_ILLEGAL,
    AckStatus.EXPIRED: ResponseCode.NO_MESSAGE,
    AckStatus.TOPIC_NOT_EXIST: ResponseCode.TOPIC_NOT_EXIST,
    AckStatus.SUBSCRIPTION_GROUP_NOT_EXIST: ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
    AckStatus.NOT_MASTER: ResponseCode.SERVICE_NOT_AVAILABLE,
}


def _record(p: PopMessage, queue_topic: str) -> bytes:
    m = p.msg
    props = dict(m.properties)
    props[POP_CK] = ReceiptHandle.parse(p.receipt_handle).extra_info()
    props.setdefault("1ST_POP_TIME", str(p.pop_time_ms))
    inner = MessageExtBrokerInner(
        topic=queue_topic,
        queue_id=m.queue_id,
        flag=m.flag,
        body=m.body,
        properties=props,
        sys_flag=m.sys_flag,
        born_timestamp=m.born_timestamp,
        born_host=m.born_host,
        store_host=m.store_host,
        # FIFO attempts are counted by the broker, not stored: the record says them
        reconsume_times=p.delivery_attempt - 1,
        prepared_transaction_offset=m.prepared_transaction_offset,
    )
    return encode_record(inner, m.queue_offset, m.commit_log_offset, m.store_timestamp)


class PopProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    def register(self, dispatcher: RequestDispatcher) -> None:
        dispatcher.register(RequestCode.POP_MESSAGE, self.pop)
        dispatcher.register(RequestCode.ACK_MESSAGE, self.ack)
        dispatcher.register(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, self.change_invisible_time)
        dispatcher.register(RequestCode.BATCH_ACK_MESSAGE, self.batch_ack)

    def _service(self) -> PopService:
        pop = self.broker.pop
        if pop is None:
            raise RequestError(ResponseCode.SERVICE_NOT_AVAILABLE, "pop is not served here")
        return pop

    async def pop(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        group = req.get_str("consumerGroup")
        topic = req.get_str("topic")
        order = req.get_bool("order", False)
        preq = PopRequest(
            group=group,
            topic=topic,
            queue_id=req.get_int("queueId"),
            max_msgs=req.get_int("maxMsgNums"),
            invisible_time_ms=req.get_int("invisibleTime"),
            poll_time_ms=req.get_int("pollTime"),
            expression_type=req.ext_fields.get("expType") or "TAG",
            expression=req.ext_fields.get("exp") or "*",
            order=order,
            init_mode=ConsumeInitMode.MIN
            if req.get_int("initMode", 0) == ConsumeInitMode.MIN
            else ConsumeInitMode.LAST,
            client_id=channel.remote_addr,
        )
        result = await self._service().pop(preq)
        code = _POP_CODES[result.status]
        ext: dict[str, object] = {
            "popTime": result.pop_time_ms,
            "invisibleTime": result.invisible_time_ms,
            "reviveQid": result.revive_qid,
            "restNum": result.rest_num,
        }
        if result.status is not PopStatus.FOUND:
            return req.response(code, result.remark or result.status.name, ext)
        starts: dict[tuple[str, int], int] = {}
        offsets: dict[tuple[str, int], list[int]] = {}
        counts: dict[tuple[str, int], int] = {}
        bufs: list[bytes] = []
        for p in result.messages:
            h = ReceiptHandle.parse(p.receipt_handle)
            mark = "1" if h.retry else "0"
            key = (mark, h.queue_id)
            starts.setdefault(key, h.ck_offset)
            offsets.setdefault(key, []).append(h.offset)
            counts[key] = max(counts.get(key, 0), p.delivery_attempt - 1)
            bufs.append(_record(p, topic))
        ext["startOffsetInfo"] = ";".join(f"{t} {q} {o}" for (t, q), o in starts.items())
        ext["msgOffsetInfo"] = ";".join(
            f"{t} {q} {','.join(map(str, os))}" for (t, q), os in offsets.items()
        )
        if order:
            ext["orderCountInfo"] = ";".join(f"{t} {q} {c}" for (t, q), c in counts.items())
        return req.response(code, None, ext, body=b"".join(bufs))

    def _handle(self, req: RemotingCommand) -> str:
        """The full 8-field handle from ``extraInfo`` (7 fields from RocketMQ's 4.x-era POP
        clients, which send the message's offset in ``offset``)."""
        extra = req.get_str("extraInfo")
        offset = req.get_int("offset")
        try:
            h = ReceiptHandle.parse(extra, offset)
        except BadReceiptHandle as exc:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        if h.offset != offset or h.queue_id != req.get_int("queueId"):
            raise RequestError(
                ResponseCode.MESSAGE_ILLEGAL, "offset/queueId do not match the extraInfo"
            )
        return h.encode()

    async def ack(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        group = req.get_str("consumerGroup")
        topic = req.get_str("topic")
        result = await self._service().ack(group, topic, self._handle(req))
        if result.status is AckStatus.EXPIRED:
            return req.response(ResponseCode.SUCCESS)  # idempotent, as RocketMQ's ack
        return req.response(_ACK_CODES[result.status], result.remark or None)

    async def batch_ack(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        """BATCH_ACK_MESSAGE: body ``BatchAckMessageRequestBody`` ``{brokerName, acks}``, each
        ack one CK's acked positions as a ``java.util.BitSet`` (fastjson2 writes its
        ``toByteArray()`` as a number array, or base64).  Acks that do not apply are skipped,
        as RocketMQ skips them; no acks at all answers NO_MESSAGE."""
        pop = self._service()
        try:
            body = json.loads(req.body_bytes() or b"null")
            acks = body.get("acks") if isinstance(body, dict) else None
        except ValueError:
            acks = None
        if not isinstance(acks, list) or not acks:
            return req.response(ResponseCode.NO_MESSAGE)
        broker_name = str(body.get("brokerName") or self.broker.config.broker_name)
        for a in acks[:1024]:
            try:
                group, topic, handles = _batch_handles(a, broker_name)
            except (ValueError, TypeError, KeyError):
                continue
            for h in handles[:4096]:
                await pop.ack(group, topic, h.encode())
        return req.response(ResponseCode.SUCCESS)

    async def change_invisible_time(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        group = req.get_str("consumerGroup")
        topic = req.get_str("topic")
        invisible = req.get_int("invisibleTime")
        result = await self._service().change_invisible_time(
            group, topic, self._handle(req), invisible
        )
        if result.status is not AckStatus.OK:
            return req.response(_ACK_CODES[result.status], result.remark or None)
        h = ReceiptHandle.parse(result.receipt_handle)
        return req.response(
            ResponseCode.SUCCESS,
            None,
            {
                "popTime": result.pop_time_ms,
                "invisibleTime": result.invisible_time_ms,
                "reviveQid": h.revive_qid,
            },
        )


def _field(a: dict[str, object], short: str, long: str) -> object:
    return a[short] if short in a else a[long]


def _batch_handles(a: object, broker_name: str) -> tuple[str, str, list[ReceiptHandle]]:
    if not isinstance(a, dict):
        raise TypeError("an ack is an object")
    raw = _field(a, "b", "bitSet")
    if isinstance(raw, str):
        bits = base64.b64decode(raw)
    elif isinstance(raw, list):
        bits = bytes(int(x) & 0xFF for x in raw[:512])
    else:
        raise TypeError("bitSet")
    so = int(str(_field(a, "so", "startOffset")))
    fields = (
        int(str(_field(a, "pt", "popTime"))),
        int(str(_field(a, "it", "invisibleTime"))),
        int(str(_field(a, "rq", "reviveQueueId"))),
        str(a.get("r", a.get("retry", "0"))) == "1",
        broker_name,
        int(str(_field(a, "q", "queueId"))),
    )
    handles = [
        ReceiptHandle(so, *fields, so + i * 8 + j)
        for i, byte in enumerate(bits)
        for j in range(8)
        if byte >> j & 1
    ]
    return str(_field(a, "c", "consumerGroup")), str(_field(a, "t", "topic")), handles
