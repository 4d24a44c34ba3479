"""Pop for 5.x clients that reach a slave: served by the master, as RocketMQ 5's proxy routes it.

What RocketMQ 5 does
--------------------
Pop state (checkpoints, acks) is written by the master of a broker group.  RocketMQ's proxy
sends ReceiveMessage / AckMessage / ChangeInvisibleDuration to a broker group's master
(``TopicRouteWrapper.getMasterAddrPrefer``: the master, a slave only when the route has no
master).  A plain slave (``enableSlaveActingMaster=false``, the default) cannot write a
checkpoint: its ``EscapeBridge.putMessageToSpecificQueue`` answers SERVICE_NOT_AVAILABLE, and
its pop then hands messages out with no checkpoint stored (they are never revived) while an ack
it takes is lost (answered SUCCESS).  We refuse instead, before anything is handed out: the
remoting POP_MESSAGE / ACK_MESSAGE / CHANGE_MESSAGE_INVISIBLETIME of a slave answer
SERVICE_NOT_AVAILABLE (14), RocketMQ's code for that write (``broker/processor/pop.py``).

What the gRPC endpoint of a slave does
--------------------------------------
A 5.x client reaches a slave's (or DLedger follower's) gRPC endpoint with a route that named it
when it was the master (a DLedger leader that stepped down keeps serving gRPC) or when it is the
only access point it knows.  :class:`MasterPop` wraps the broker's pop service for the gRPC
activities: on a master it is the local service; on a slave each call goes to the master over
the remoting protocol, as the proxy would send it (POP_MESSAGE with RocketMQ 5's headers,
ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME, and for ForwardMessageToDeadLetterQueue
CONSUMER_SEND_MSG_BACK with delay level -1 then ACK_MESSAGE), and the answer comes back as if
served here: same handles (the master's), same attempts.  The master is the one the slave's
registration learned (``registrar.master_addr``); none known, or not reachable, answers
NOT_MASTER (gRPC INTERNAL_SERVER_ERROR with the cause), so a client retries rather than being
served from a copy that cannot record what it hands out.  During a master outage a 5.x consumer
therefore receives nothing from that broker group until the master is back (SYNC_MASTER) or a
new leader is elected (DLedger); see docs/guarantees.md.
"""

from __future__ import annotations

import logging
import time

import attrs
import trio

from broker.controller import BrokerController
from broker.pop.api import (
    AckResult,
    AckStatus,
    ChangeInvisibleResult,
    PopMessage,
    PopRequest,
    PopResult,
    PopService,
    PopStatus,
)
from broker.pop.receipt import BadReceiptHandle, ReceiptHandle
from common.errors import RmqError
from common.message import RecordDecodeError, decode_records
from common.remoting.client import RemotingClient
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand

log = logging.getLogger(__name__)

__all__ = ["MasterPop"]

POP_CK = "POP_CK"  # MessageConst.PROPERTY_POP_CK: the handle on a remoting pop's record
# beyond a forwarded pop's own poll time: the master's answer and the way back
CALL_MARGIN_S = 3.0

# the master's remoting answer -> the pop outcome here (broker/processor/pop.py, inverted)
_POP_STATUS: dict[int, PopStatus] = {
    ResponseCode.POLLING_TIMEOUT: PopStatus.NO_NEW_MSG,
    ResponseCode.PULL_NOT_FOUND: PopStatus.NO_NEW_MSG,
    ResponseCode.NO_MESSAGE: PopStatus.NO_NEW_MSG,
    ResponseCode.POLLING_FULL: PopStatus.POLLING_FULL,
    ResponseCode.TOPIC_NOT_EXIST: PopStatus.TOPIC_NOT_EXIST,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: PopStatus.SUBSCRIPTION_GROUP_NOT_EXIST,
    ResponseCode.NO_PERMISSION: PopStatus.NO_PERMISSION,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: PopStatus.FILTER_ERROR,
    ResponseCode.SYSTEM_ERROR: PopStatus.BAD_REQUEST,
}

_ACK_STATUS: dict[int, AckStatus] = {
    ResponseCode.SUCCESS: AckStatus.OK,
    ResponseCode.NO_MESSAGE: AckStatus.EXPIRED,
    ResponseCode.MESSAGE_ILLEGAL: AckStatus.BAD_HANDLE,
    ResponseCode.TOPIC_NOT_EXIST: AckStatus.TOPIC_NOT_EXIST,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: AckStatus.SUBSCRIPTION_GROUP_NOT_EXIST,
}


class _NoMaster(Exception):
    """No master to forward to, or it did not answer: the remark says which."""


@attrs.define(eq=False)
class MasterPop:
    """A :class:`PopService` that is the local one on a master and the master's on a slave."""

    local: PopService
    controller: BrokerController
    remoting: RemotingClient
    timeout: float = 3.0
    # calls forwarded to the master so far (tests, logs)
    forwarded: int = 0

    def _master(self) -> str | None:
        """The master to forward to; None on a master (serve locally)."""
        c = self.controller
        if not c.is_slave:
            return None
        registrar = c.registrar
        addr = registrar.master_addr if registrar is not None else None
        if not addr or addr == c.broker_addr:
            raise _NoMaster("this broker is a slave and knows no live master")
        return addr

    async def _call(self, addr: str, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        try:
            answer = await self.remoting.invoke(addr, cmd, timeout)
        except RmqError as exc:
            raise _NoMaster(f"the master {addr} cannot be reached: {exc}") from None
        self.forwarded += 1
        if answer.code == ResponseCode.SERVICE_NOT_AVAILABLE:
            # the master we knew is no longer one (a DLedger leader that stepped down)
            raise _NoMaster(f"{addr} is no longer the master: {answer.remark}")
        return answer

    # --- pop ----------------------------------------------------------------------------------
    async def pop(self, req: PopRequest) -> PopResult:
        try:
            addr = self._master()
            if addr is None:
                return await self.local.pop(req)
            return await self._forward_pop(addr, req)
        except _NoMaster as exc:
            return PopResult(PopStatus.NOT_MASTER, remark=str(exc))

    async def _forward_pop(self, addr: str, req: PopRequest) -> PopResult:
        # the header of RocketMQ 5's PopMessageRequestHeader, as its proxy sends it
        fields = {
            "consumerGroup": req.group,
            "topic": req.topic,
            "queueId": req.queue_id,
            "maxMsgNums": req.max_msgs,
            "invisibleTime": req.invisible_time_ms,
            "pollTime": req.poll_time_ms,
            "bornTime": int(time.time() * 1000),
            "initMode": int(req.init_mode),
            "expType": req.expression_type,
            "exp": req.expression,
            "order": "true" if req.order else "false",
        }
        cmd = RemotingCommand.request(RequestCode.POP_MESSAGE, fields)
        answer = await self._call(addr, cmd, req.poll_time_ms / 1000 + CALL_MARGIN_S)
        ext = answer.ext_fields
        pop_time = _int(ext.get("popTime"))
        invisible = _int(ext.get("invisibleTime"), req.invisible_time_ms)
        empty = PopResult(
            PopStatus.NO_NEW_MSG,
            pop_time_ms=pop_time,
            invisible_time_ms=invisible,
            revive_qid=_int(ext.get("reviveQid")),
            rest_num=_int(ext.get("restNum")),
        )
        if answer.code != ResponseCode.SUCCESS:
            status = _POP_STATUS.get(answer.code, PopStatus.NOT_MASTER)
            return attrs.evolve(empty, status=status, remark=answer.remark or "")
        try:
            records = decode_records(answer.body_bytes())
        except RecordDecodeError as exc:
            raise _NoMaster(f"the master's pop answer does not decode: {exc}") from None
        out = []
        for m in records:
            raw = m.properties.pop(POP_CK, "")
            try:
                h = ReceiptHandle.parse(raw)
            except BadReceiptHandle:
                log.warning("pop forwarded to %s: a record without a handle, skipped", addr)
                continue
            # the proxy's nine-field form: the CommitLog offset lets the handle dead-letter
            handle = attrs.evolve(h, commit_log_offset=m.commit_log_offset).encode()
            out.append(PopMessage(m, handle, m.reconsume_times + 1, pop_time, invisible))
        if not out:
            return empty
        return attrs.evolve(empty, status=PopStatus.FOUND, messages=out)

    # --- ack / change / dead letter -----------------------------------------------------------
    def _handle_fields(self, group: str, topic: str, receipt_handle: str) -> dict[str, object]:
        h = ReceiptHandle.parse(receipt_handle)
        return {
            "consumerGroup": group,
            "topic": topic,
            "queueId": h.queue_id,
            "extraInfo": h.extra_info(),
            "offset": h.offset,
        }

    async def ack(self, group: str, topic: str, receipt_handle: str) -> AckResult:
        try:
            addr = self._master()
            if addr is None:
                return await self.local.ack(group, topic, receipt_handle)
            fields = self._handle_fields(group, topic, receipt_handle)
            cmd = RemotingCommand.request(RequestCode.ACK_MESSAGE, fields)
            answer = await self._call(addr, cmd, self.timeout)
        except _NoMaster as exc:
            return AckResult(AckStatus.NOT_MASTER, str(exc))
        except BadReceiptHandle as exc:
            return AckResult(AckStatus.BAD_HANDLE, str(exc))
        return AckResult(_ack_status(answer.code), answer.remark or "")

    async def change_invisible_time(
        self, group: str, topic: str, receipt_handle: str, invisible_time_ms: int
    ) -> ChangeInvisibleResult:
        try:
            addr = self._master()
            if addr is None:
                return await self.local.change_invisible_time(
                    group, topic, receipt_handle, invisible_time_ms
                )
            h = ReceiptHandle.parse(receipt_handle)
            fields = self._handle_fields(group, topic, receipt_handle)
            fields["invisibleTime"] = invisible_time_ms
            cmd = RemotingCommand.request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, fields)
            answer = await self._call(addr, cmd, self.timeout)
        except _NoMaster as exc:
            return ChangeInvisibleResult(AckStatus.NOT_MASTER, remark=str(exc))
        except BadReceiptHandle as exc:
            return ChangeInvisibleResult(AckStatus.BAD_HANDLE, remark=str(exc))
        if answer.code != ResponseCode.SUCCESS:
            return ChangeInvisibleResult(_ack_status(answer.code), remark=answer.remark or "")
        ext = answer.ext_fields
        pop_time = _int(ext.get("popTime"), h.pop_time)
        invisible = _int(ext.get("invisibleTime"), invisible_time_ms)
        if h.order:
            # a FIFO handle keeps its pop time; its invisible time counts from it
            nh = attrs.evolve(h, invisible_time=invisible)
        else:
            # a new one-message checkpoint at the message's own offset (broker/pop/service.py)
            nh = attrs.evolve(
                h,
                ck_offset=h.offset,
                pop_time=pop_time,
                invisible_time=invisible,
                revive_qid=_int(ext.get("reviveQid"), h.revive_qid),
            )
        return ChangeInvisibleResult(AckStatus.OK, nh.encode(), pop_time, invisible)

    async def forward_to_dead_letter_queue(
        self, group: str, topic: str, receipt_handle: str
    ) -> AckResult:
        try:
            addr = self._master()
            if addr is None:
                return await self.local.forward_to_dead_letter_queue(group, topic, receipt_handle)
            h = ReceiptHandle.parse(receipt_handle)
            if h.commit_log_offset < 0:
                return AckResult(AckStatus.BAD_HANDLE, "the handle has no CommitLog offset")
            # the proxy's way: CONSUMER_SEND_MSG_BACK with delay level -1 (the DLQ), then ack
            back = RemotingCommand.request(
                RequestCode.CONSUMER_SEND_MSG_BACK,
                {"group": group, "offset": h.commit_log_offset, "delayLevel": -1},
            )
            answer = await self._call(addr, back, self.timeout)
        except _NoMaster as exc:
            return AckResult(AckStatus.NOT_MASTER, str(exc))
        except BadReceiptHandle as exc:
            return AckResult(AckStatus.BAD_HANDLE, str(exc))
        if answer.code != ResponseCode.SUCCESS:
            return AckResult(_ack_status(answer.code), answer.remark or "")
        return await self.ack(group, topic, receipt_handle)

    # --- the rest is the local service's ------------------------------------------------------
    def inflight_in_queue(self, group: str, topic: str, queue_id: int) -> int:
        return self.local.inflight_in_queue(group, topic, queue_id)

    async def run_revive(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await self.local.run_revive(task_status=task_status)


def _int(raw: object, default: int = 0) -> int:
    try:
        return int(str(raw))
    except ValueError:
        return default


def _ack_status(code: int) -> AckStatus:
    return _ACK_STATUS.get(code, AckStatus.NOT_MASTER)
