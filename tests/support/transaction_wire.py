"""A transactional producer speaking the wire as RocketMQ's Java client does (4.9
``DefaultMQProducerImpl.sendMessageInTransaction`` / ``endTransaction`` /
``checkTransactionState``), for tests of the broker's transactions that do not go through our
client: raw SEND_MESSAGE_V2 with TRAN_MSG / PGROUP and sysFlag TRANSACTION_PREPARED, oneway
END_TRANSACTION with the Java header fields, HEART_BEAT naming the producer group, and an
answer to CHECK_TRANSACTION_STATE (39) pushed by the broker on the same connection.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio

from common.message import MessageExt, decode_record
from common.message_id import decode_offset_msg_id
from common.message_properties import encode_properties
from common.remoting.channel import Channel
from common.remoting.client import RemotingClient, open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.network import TCP, Network

COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0


@attrs.frozen
class HalfSent:
    uniq: str
    queue_offset: int
    commit_log_offset: int
    code: int


@attrs.define(eq=False)
class JavaTxProducer:
    client: RemotingClient
    group: str
    client_id: str
    # CHECK_TRANSACTION_STATE -> the state answered (COMMIT / ROLLBACK / UNKNOWN); None: no answer
    answer: Callable[[MessageExt], int | None] = lambda m: UNKNOWN
    # every check received: (header fields, the decoded body)
    checks: list[tuple[dict[str, str], MessageExt]] = attrs.Factory(list)
    check_arrived: trio.Event = attrs.Factory(trio.Event)

    async def heartbeat(self, addr: str) -> None:
        body = json.dumps(
            {
                "clientID": self.client_id,
                "consumerDataSet": [],
                "producerDataSet": [{"groupName": self.group}],
            }
        ).encode()
        r = await self.client.invoke(
            addr, RemotingCommand.request(RequestCode.HEART_BEAT, {}, body)
        )
        assert r.code == ResponseCode.SUCCESS, r.remark

    async def send_half(
        self,
        addr: str,
        topic: str,
        body: bytes,
        *,
        queue_id: int = 0,
        props: dict[str, str] | None = None,
    ) -> HalfSent:
        uniq = uuid.uuid4().hex.upper()
        p = {"TRAN_MSG": "true", "PGROUP": self.group, "UNIQ_KEY": uniq, "WAIT": "true"}
        p.update(props or {})
        fields = {
            "a": self.group,
            "b": topic,
            "c": "TBW102",
            "d": "4",
            "e": str(queue_id),
            "f": "4",  # MessageSysFlag.TRANSACTION_PREPARED_TYPE
            "g": str(int(time.time() * 1000)),
            "h": "0",
            "i": encode_properties(p),
            "j": "0",
            "k": "false",
            "m": "false",
        }
        r = await self.client.invoke(
            addr, RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, fields, body)
        )
        if r.code != ResponseCode.SUCCESS:
            return HalfSent(uniq, -1, -1, r.code)
        _, offset = decode_offset_msg_id(r.ext_fields["msgId"])
        return HalfSent(uniq, int(r.ext_fields["queueOffset"]), offset, r.code)

    def end_request(
        self,
        half: HalfSent,
        state: int,
        *,
        from_check: bool = False,
        group: str | None = None,
    ) -> RemotingCommand:
        return RemotingCommand.request(
            RequestCode.END_TRANSACTION,
            {
                "producerGroup": group or self.group,
                "tranStateTableOffset": str(half.queue_offset),
                "commitLogOffset": str(half.commit_log_offset),
                "commitOrRollback": str(state),
                "fromTransactionCheck": "true" if from_check else "false",
                "msgId": half.uniq,
                "transactionId": half.uniq,
            },
            oneway=True,
        )

    async def end(self, addr: str, half: HalfSent, state: int) -> None:
        await self.client.invoke_oneway(addr, self.end_request(half, state))

    async def on_request(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand | None:
        if cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
            return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "not a check")
        msg = decode_record(cmd.body_bytes())
        self.checks.append((dict(cmd.ext_fields), msg))
        self.check_arrived.set()
        self.check_arrived = trio.Event()
        state = self.answer(msg)
        if state is None:
            return None
        end = RemotingCommand.request(
            RequestCode.END_TRANSACTION,
            {
                "producerGroup": self.group,
                "tranStateTableOffset": cmd.ext_fields["tranStateTableOffset"],
                "commitLogOffset": cmd.ext_fields["commitLogOffset"],
                "commitOrRollback": str(state),
                "fromTransactionCheck": "true",
                "msgId": msg.properties.get("UNIQ_KEY", ""),
                "transactionId": cmd.ext_fields.get("transactionId", ""),
            },
            oneway=True,
        )
        await channel.send(end)
        return None


@asynccontextmanager
async def java_tx_producer(
    group: str, client_id: str, *, network: Network = TCP
) -> AsyncIterator[JavaTxProducer]:
    async with open_remoting_client(network=network) as client:
        p = JavaTxProducer(client, group, client_id)
        client.set_request_handler(p.on_request)
        yield p
