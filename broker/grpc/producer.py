"""SendMessage and EndTransaction for 5.x producers (RocketMQ 5's ``SendMessageActivity`` and
``EndTransactionActivity``, local mode).

A send becomes the 4.x SEND_MESSAGE the broker's send processor handles (local_broker.py):
the same checks, store, replication wait and answer codes as a 4.x send; the properties come
from the protobuf message (converter.py); timers (``delivery_timestamp`` ->
``TIMER_DELIVER_MS``) and transactions (TRAN_MSG, PGROUP = topic) are then the send path's
business. Before that, as the proxy does: a message must name the same topic as the first
(MESSAGE_CORRUPTED), the topic must exist (TOPIC_NOT_FOUND), its ``message.type`` must accept
the message's type (MESSAGE_PROPERTY_CONFLICT_WITH_TYPE) and the body must fit the broker's
maxMessageSize (MESSAGE_BODY_TOO_LARGE).

The queue: a single message with a ``message_group`` goes to writable queue
``Hashing.consistentHash(group.hashCode(), n)`` (Guava's consistent hash of Java's String
hash), so one group always lands in one queue (FIFO); others to a random writable queue.

Each message answers one ``SendResultEntry``: OK with the client's message id, the queue
offset and, for a transactional half, a transaction id that names where the half is (see
client_channel.transaction_id) so EndTransaction needs no server-side table; FLUSH_DISK_TIMEOUT,
FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE become MASTER_PERSISTENCE_TIMEOUT,
SLAVE_PERSISTENCE_TIMEOUT and HA_NOT_AVAILABLE, other refusals their ResponseBuilder code. The
response status is the entries' common code, or MULTIPLE_RESULTS.
"""

from __future__ import annotations

import random

from broker.grpc.client_channel import parse_transaction_id, transaction_id
from broker.grpc.client_manager import GrpcClientManager
from broker.grpc.converter import (
    MessageError,
    now_ms,
    properties_of,
    sys_flag_of,
    timestamp_ms,
    type_of_properties,
    wrap_namespace,
)
from broker.grpc.local_broker import LocalBroker
from broker.grpc.status import OK, ActivityError, code_of_remoting, status
from common.grpc.service import CallContext
from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import service_pb2 as spb
from common.message import MessageSysFlag
from common.message_id import decode_offset_msg_id
from common.message_properties import encode_properties
from common.model import PermName
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.string_hash import java_string_hash
from common.topic_message_type import topic_message_type
from common.topics import AUTO_CREATE_TOPIC_KEY_TOPIC

_MASK64 = (1 << 64) - 1


def consistent_hash(value: int, buckets: int) -> int:
    """Guava ``Hashing.consistentHash(long, int)`` (its linear congruential walk)."""
    state = value & _MASK64
    candidate = 0
    while True:
        state = (2862933555777941757 * state + 1) & _MASK64
        # (double) ((int) (state >>> 33) + 1) / 2^31
        shifted = state >> 33
        as_int = shifted - (1 << 32) if shifted >= 1 << 31 else shifted
        nxt = int((candidate + 1) / ((as_int + 1) / 2147483648.0))
        if 0 <= nxt < buckets:
            candidate = nxt
        else:
            return candidate


class ProducerActivity:
    def __init__(self, local: LocalBroker, clients: GrpcClientManager) -> None:
        self.local = local
        self.clients = clients

    def _select_queue(self, request: spb.SendMessageRequest, write_queues: int) -> int:
        group = request.messages[0].system_properties.message_group
        if len(request.messages) == 1 and group:
            return consistent_hash(java_string_hash(group), write_queues)
        return random.randrange(write_queues)

    async def send_message(
        self, req: spb.SendMessageRequest, ctx: CallContext
    ) -> spb.SendMessageResponse:
        try:
            entries = await self._send(req, ctx)
        except ActivityError as exc:
            return spb.SendMessageResponse(status=exc.status)
        codes = {e.status.code for e in entries}
        if len(codes) > 1:
            overall = status(pb.MULTIPLE_RESULTS)
        else:
            overall = status(codes.pop())
        return spb.SendMessageResponse(status=overall, entries=entries)

    async def _send(
        self, req: spb.SendMessageRequest, ctx: CallContext
    ) -> list[spb.SendResultEntry]:
        if not req.messages:
            raise ActivityError(pb.MESSAGE_CORRUPTED, "no message to send")
        channel = self.clients.channel(ctx)
        b = self.local.controller
        first = req.messages[0].topic
        topic = wrap_namespace(first)
        tc = b.topic_config_manager.select_topic_config(topic)
        if tc is None:
            raise ActivityError(pb.TOPIC_NOT_FOUND, f"topic {first.name} not found")
        if not PermName.is_writeable(tc.perm & b.config.broker_permission) or not tc.writeQueueNums:
            raise ActivityError(pb.FORBIDDEN, f"topic {first.name} is not writable here")
        accepted = topic_message_type(tc.attributes or {})
        max_body = b.config.store.max_message_size
        queue_id = self._select_queue(req, tc.writeQueueNums)
        entries = []
        for message in req.messages:
            if message.topic != first:
                raise ActivityError(pb.MESSAGE_CORRUPTED, "topic in message is not same")
            try:
                props = properties_of(message, topic)
            except MessageError as exc:
                entries.append(spb.SendResultEntry(status=status(exc.code, str(exc))))
                continue
            kind = type_of_properties(props)
            if not accepted.accepts(kind):
                entries.append(
                    spb.SendResultEntry(
                        status=status(
                            pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                            f"current message type {kind.value} does not match the topic's "
                            f"accepted message types {accepted.value}",
                        )
                    )
                )
                continue
            if len(message.body) > max_body:
                entries.append(
                    spb.SendResultEntry(
                        status=status(
                            pb.MESSAGE_BODY_TOO_LARGE,
                            f"message body size {len(message.body)} exceeds {max_body}",
                        )
                    )
                )
                continue
            system = message.system_properties
            born = (
                timestamp_ms(system.born_timestamp)
                if system.HasField("born_timestamp")
                else now_ms()
            )
            cmd = RemotingCommand.request(
                RequestCode.SEND_MESSAGE,
                {
                    "producerGroup": topic,
                    "topic": topic,
                    "defaultTopic": AUTO_CREATE_TOPIC_KEY_TOPIC,
                    "defaultTopicQueueNums": 4,
                    "queueId": queue_id,
                    "sysFlag": sys_flag_of(message),
                    "bornTimestamp": born,
                    "flag": 0,
                    "properties": encode_properties(props),
                    "reconsumeTimes": max(system.delivery_attempt - 1, 0),
                    "unitMode": "false",
                    "batch": "false",
                },
                message.body,
            )
            answer = await self.local.call(cmd, channel)
            entries.append(self._entry(answer, system))
        return entries

    @staticmethod
    def _entry(answer: RemotingCommand, system: pb.SystemProperties) -> spb.SendResultEntry:
        code = answer.code
        if code != ResponseCode.SUCCESS:
            mapped = code_of_remoting(code)
            if code in (
                ResponseCode.FLUSH_DISK_TIMEOUT,
                ResponseCode.FLUSH_SLAVE_TIMEOUT,
                ResponseCode.SLAVE_NOT_AVAILABLE,
            ):
                return spb.SendResultEntry(
                    status=status(mapped, f"send message failed, sendStatus={code}")
                )
            return spb.SendResultEntry(status=status(mapped, answer.remark or str(code)))
        fields = answer.ext_fields
        offset = int(fields.get("queueOffset", "0"))
        tx_id = ""
        if system.message_type == pb.TRANSACTION:
            _, commit_log_offset = decode_offset_msg_id(fields.get("msgId", ""))
            tx_id = transaction_id(commit_log_offset, offset)
        return spb.SendResultEntry(
            status=status(pb.OK),
            message_id=system.message_id,
            transaction_id=tx_id,
            offset=offset,
        )

    async def end_transaction(
        self, req: spb.EndTransactionRequest, ctx: CallContext
    ) -> spb.EndTransactionResponse:
        try:
            channel = self.clients.channel(ctx)
        except ActivityError as exc:
            return spb.EndTransactionResponse(status=exc.status)
        where = parse_transaction_id(req.transaction_id)
        if where is None:
            return spb.EndTransactionResponse(
                status=status(pb.INVALID_TRANSACTION_ID, "transaction id is invalid")
            )
        commit_log_offset, table_offset = where
        if req.resolution == pb.COMMIT:
            end = MessageSysFlag.TRANSACTION_COMMIT
        elif req.resolution == pb.ROLLBACK:
            end = MessageSysFlag.TRANSACTION_ROLLBACK
        else:
            end = MessageSysFlag.TRANSACTION_NOT_TYPE
        topic = wrap_namespace(req.topic)
        cmd = RemotingCommand.request(
            RequestCode.END_TRANSACTION,
            {
                "producerGroup": topic,
                "tranStateTableOffset": table_offset,
                "commitLogOffset": commit_log_offset,
                "commitOrRollback": end,
                "fromTransactionCheck": str(req.source == pb.SOURCE_SERVER_CHECK).lower(),
                "msgId": req.message_id,
                "transactionId": req.transaction_id,
            },
        )
        answer = await self.local.call(cmd, channel)
        if answer.code == ResponseCode.SUCCESS:
            return spb.EndTransactionResponse(status=OK)
        return spb.EndTransactionResponse(
            status=status(code_of_remoting(answer.code), answer.remark or str(answer.code))
        )
