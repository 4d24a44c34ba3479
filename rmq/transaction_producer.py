"""TransactionProducer: transactional sends (RocketMQ ``TransactionMQProducer`` and
``DefaultMQProducerImpl.sendMessageInTransaction`` / ``endTransaction`` /
``checkTransactionState``, apache/rocketmq 4.9).

    async def execute_local(msg, arg):      # your local transaction
        await db.insert(arg)
        return LocalTransactionState.COMMIT_MESSAGE

    async def check_local(msg):             # the broker asks: did it commit?
        return LocalTransactionState.COMMIT_MESSAGE if await db.has(msg.msg_id) else ...

    async with TransactionProducer("txg", ns, execute_local=execute_local,
                                   check_local=check_local) as p:
        await p.send_in_transaction(Message("Orders", b"..."), arg=order)

Theory of operation
-------------------
``send_in_transaction`` is three steps, as in Java:

1. the message goes as a *half* message: properties TRAN_MSG=true and PGROUP=<group>, sysFlag
   TRANSACTION_PREPARED; the broker stores it where no consumer sees it.  A delay level is
   dropped (Java clears it).  A send that fails raises; one that was not SEND_OK (not flushed,
   no slave) is rolled back without running the local transaction;
2. ``execute_local(msg, arg)`` runs (a plain function or a coroutine).  An exception, or a
   result that is no LocalTransactionState, counts as UNKNOW;
3. END_TRANSACTION goes oneway to the broker that holds the half message, with commit (8),
   rollback (12) or unknown (0).  Unknown leaves the decision to the broker's check.

The check: every ``transactionCheckInterval`` the broker sends CHECK_TRANSACTION_STATE (39) for
a half message still undecided after ``transactionTimeOut`` on a connection of the producer
group (the client heartbeats the group to the broker right after its first half message there,
so it is known at once).  The client's request handler hands it here; ``check_local(msg)`` runs
in a task of this producer and its answer goes back as END_TRANSACTION with
fromTransactionCheck=true on the connection the check came on.  An exception or UNKNOW answers
unknown: the broker asks again next round, up to its transactionCheckMax.

With ``enable_trace=True`` (Java's enableMsgTrace on a TransactionMQProducer) the half message
gives a Pub record of type Trans_Msg_Half, and every END_TRANSACTION, from step 3 or from a
check, an EndTransaction record (rmq/trace/hooks.py), both through the one trace writer.
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from common.message import MessageExt, decode_record
from common.message_id import decode_offset_msg_id
from common.message_properties import MessageConst
from common.remoting.channel import Channel
from common.remoting.codes import RequestCode
from common.remoting.command import RemotingCommand
from rmq.errors import ClientError, InvalidMessageError
from rmq.message import Message
from rmq.producer import Producer
from rmq.send_result import SendResult, SendStatus
from rmq.trace.encoder import MessageType, now_ms
from rmq.trace.hooks import EndTransactionTracer

log = logging.getLogger(__name__)

# MessageSysFlag
_TRANSACTION_PREPARED = 0x4
_COMMIT = 0x8
_ROLLBACK = 0xC
_NOT_TYPE = 0


class LocalTransactionState(enum.Enum):
    """RocketMQ's names (UNKNOW included)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"


_END_FLAG = {
    LocalTransactionState.COMMIT_MESSAGE: _COMMIT,
    LocalTransactionState.ROLLBACK_MESSAGE: _ROLLBACK,
    LocalTransactionState.UNKNOW: _NOT_TYPE,
}

# execute_local(msg, arg) / check_local(msg): a plain function or a coroutine function
ExecuteLocal = Callable[[Message, Any], "LocalTransactionState | Awaitable[LocalTransactionState]"]
CheckLocal = Callable[[MessageExt], "LocalTransactionState | Awaitable[LocalTransactionState]"]


@attrs.frozen
class TransactionSendResult(SendResult):
    """A SendResult plus the local transaction's outcome (Java ``TransactionSendResult``)."""

    local_transaction_state: LocalTransactionState = LocalTransactionState.UNKNOW


async def _call_local(fn: Callable[..., object], *args: object) -> LocalTransactionState:
    out = fn(*args)
    if inspect.isawaitable(out):
        out = await out
    return local_state(out)


def local_state(out: object) -> LocalTransactionState:
    """What a local transaction returned, as a state (anything else: UNKNOW)."""
    if not isinstance(out, LocalTransactionState):
        log.warning("local transaction returned %r, not a LocalTransactionState: UNKNOW", out)
        return LocalTransactionState.UNKNOW
    return out


def end_transaction_header(
    group: str,
    *,
    tran_state_table_offset: int,
    commit_log_offset: int,
    state: LocalTransactionState,
    msg_id: str,
    transaction_id: str | None,
    from_check: bool,
) -> dict[str, str]:
    """EndTransactionRequestHeader as the Java client fills it."""
    header = {
        "producerGroup": group,
        "tranStateTableOffset": str(tran_state_table_offset),
        "commitLogOffset": str(commit_log_offset),
        "commitOrRollback": str(_END_FLAG[state]),
        "fromTransactionCheck": "true" if from_check else "false",
        "msgId": msg_id,
    }
    if transaction_id:
        header["transactionId"] = transaction_id
    return header


def transaction_result(sent: SendResult, state: LocalTransactionState) -> TransactionSendResult:
    return TransactionSendResult(**attrs.asdict(sent, recurse=False), local_transaction_state=state)


class TransactionProducer(Producer):
    """A Producer that also sends in transactions (see the module doc)."""

    def __init__(
        self,
        group: str = "DEFAULT_PRODUCER",
        namesrv: str | list[str] = "127.0.0.1:9876",
        *,
        execute_local: ExecuteLocal | None = None,
        check_local: CheckLocal | None = None,
        enable_trace: bool = False,
        trace_topic: str | None = None,
        **kwargs: Any,
    ) -> None:
        """``kwargs``: the Producer's other keyword arguments (network, send_timeout, ...)."""
        super().__init__(
            group, namesrv, enable_trace=enable_trace, trace_topic=trace_topic, **kwargs
        )
        self.execute_local = execute_local
        self.check_local = check_local
        # brokers this producer's group was announced to by a heartbeat
        self._announced: set[str] = set()
        # EndTransaction records, through the Pub records' trace writer
        self._end_tracer: EndTransactionTracer | None = None

    async def __aenter__(self) -> TransactionProducer:
        await super().__aenter__()
        if self._send_tracer is not None:
            self._end_tracer = EndTransactionTracer(self._send_tracer.dispatcher, self.group)
        self.client.register_transaction_checker(self.group, self._on_check)
        return self

    async def send_in_transaction(
        self, msg: Message, arg: object = None, *, timeout: float | None = None
    ) -> TransactionSendResult:
        """Half message, ``execute_local(msg, arg)``, END_TRANSACTION (see the module doc)."""
        if self.execute_local is None:
            raise ClientError("send_in_transaction needs execute_local")
        sent = await self._send_half(msg, timeout=timeout)
        state = LocalTransactionState.ROLLBACK_MESSAGE
        error: BaseException | None = None
        if sent.status is SendStatus.SEND_OK:
            try:
                state = await _call_local(self.execute_local, msg, arg)
            except Exception as exc:  # Java: logged, UNKNOW, the remark says why
                log.info("local transaction of %s raised %r: UNKNOW", sent.msg_id, exc)
                state, error = LocalTransactionState.UNKNOW, exc
        await self._end_transaction(msg, sent, state, error)
        return transaction_result(sent, state)

    async def _send_half(self, msg: Message, *, timeout: float | None = None) -> SendResult:
        """Step 1: the half message (sysFlag TRANSACTION_PREPARED, TRAN_MSG, PGROUP)."""
        if msg.deliver_at is not None or msg.delay is not None:
            # as RocketMQ 5's clients: a transactional message cannot carry a delivery time
            raise InvalidMessageError("a transactional message cannot have deliver_at or delay")
        if msg.delay_level:
            msg = attrs.evolve(msg, delay_level=0)
        body, props, uniq = self._prepare(msg)
        props = f"{props}\x02TRAN_MSG\x01true\x02PGROUP\x01{self.group}"
        flag = msg.flag

        def build(mq: Any) -> tuple[dict[str, str], bytes]:
            header = self._header(mq, props, flag, batch=False)
            header["f"] = str(int(header.get("f", "0")) | _TRANSACTION_PREPARED)
            return header, body

        tracer = self._send_tracer
        start = now_ms()
        sent = await self._send(msg.topic, build, uniq, timeout, None)
        if tracer is not None:
            broker = self.client.cached_master_addr(sent.message_queue.brokerName)
            tracer.record(msg, sent, broker or "", start, MessageType.Trans_Msg_Half)
        await self._announce(sent.message_queue.brokerName)
        return sent

    async def _announce(self, broker_name: str) -> None:
        """Heartbeat the group to a broker the first time it holds our half message: its
        check must find a connection of the group at once, not after the 30 s heartbeat."""
        addr = self.client.cached_master_addr(broker_name)
        if addr is None or addr in self._announced:
            return
        try:
            await self.client.send_heartbeat_to_all_brokers()
            self._announced.add(addr)
        except Exception as exc:
            log.info("heartbeat after a half message failed: %s", exc)

    async def _end_transaction(
        self,
        msg: Message,
        sent: SendResult,
        state: LocalTransactionState,
        error: BaseException | None = None,
    ) -> None:
        """Step 3: END_TRANSACTION, oneway, to the broker holding `msg`'s half message."""
        _, commit_log_offset = decode_offset_msg_id(sent.offset_msg_id)
        header = end_transaction_header(
            self.group,
            tran_state_table_offset=sent.queue_offset,
            commit_log_offset=commit_log_offset,
            state=state,
            msg_id=sent.msg_id,
            transaction_id=sent.transaction_id or sent.msg_id,
            from_check=False,
        )
        cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, header, oneway=True)
        if error is not None:
            cmd.remark = f"executeLocalTransactionBranch exception: {error!r}"
        addr = await self.client.master_addr(
            sent.message_queue.brokerName, sent.message_queue.topic
        )
        if self._end_tracer is not None:
            # Java's client makes the msgId the transactionId of the message it traces
            self._end_tracer.record(
                topic=msg.topic,
                msg_id=sent.msg_id,
                tags=msg.tags,
                keys=msg.keys,
                store_host=addr,
                state=state.value,
                transaction_id=sent.msg_id,
                from_check=False,
            )
        await self.client.remoting.invoke_oneway(addr, cmd, self.send_timeout)

    # --- the broker's check ----------------------------------------------------------------
    def _on_check(self, cmd: RemotingCommand, channel: Channel) -> None:
        """CHECK_TRANSACTION_STATE for our group: answered from a task of ours."""
        nursery = self._nursery
        if nursery is None:
            return
        nursery.start_soon(self._answer_check, cmd, channel)

    async def _answer_check(self, cmd: RemotingCommand, channel: Channel) -> None:
        try:
            msg = decode_record(cmd.body_bytes())
        except ValueError as exc:
            log.warning("CHECK_TRANSACTION_STATE with a bad body: %s", exc)
            return
        state = LocalTransactionState.UNKNOW
        remark = None
        if self.check_local is None:
            log.warning("broker checks transaction %s but no check_local is set", msg.uniq_key)
        else:
            try:
                state = await _call_local(self.check_local, msg)
            except Exception as exc:
                log.info("check_local of %s raised %r: UNKNOW", msg.uniq_key, exc)
                remark = f"checkLocalTransactionState exception: {exc!r}"
        f = cmd.ext_fields
        try:
            header = end_transaction_header(
                self.group,
                tran_state_table_offset=int(f.get("tranStateTableOffset", "")),
                commit_log_offset=int(f.get("commitLogOffset", "")),
                state=state,
                msg_id=msg.uniq_key or msg.msg_id,
                transaction_id=f.get("transactionId"),
                from_check=True,
            )
        except ValueError:
            log.warning("CHECK_TRANSACTION_STATE without offsets: %s", f)
            return
        end = RemotingCommand.request(RequestCode.END_TRANSACTION, header, oneway=True)
        end.remark = remark
        if self._end_tracer is not None:
            self._end_tracer.record(
                topic=msg.topic,
                msg_id=header["msgId"],
                tags=msg.tags,
                keys=msg.keys,
                store_host=channel.remote_addr,
                state=state.value,
                transaction_id=msg.uniq_key,
                from_check=True,
                region_id=msg.properties.get(MessageConst.MSG_REGION),
            )
        try:
            with trio.move_on_after(self.send_timeout):
                await channel.send(end)
        except Exception as exc:
            log.info("answer to the check of %s failed: %s", msg.uniq_key, exc)


__all__ = [
    "local_state",
    "transaction_result",
    "CheckLocal",
    "ExecuteLocal",
    "LocalTransactionState",
    "TransactionProducer",
    "TransactionSendResult",
]
