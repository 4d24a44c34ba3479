"""END_TRANSACTION (37): a producer commits or rolls back a half message (RocketMQ
``EndTransactionProcessor``, apache/rocketmq 4.9).

Usually oneway; answered anyway when the producer waits.  A slave answers SLAVE_NOT_AVAILABLE
(11) with no remark, as Java does; an unknown state (commitOrRollback 0, "the producer does not
know yet") and any other value get no answer: the check asks again later.  The header checks
(producer group, tranStateTableOffset, commitLogOffset) and the commit itself are
``TransactionalMessageService.end_transaction``'s; their codes and remarks are RocketMQ's.
"""

from __future__ import annotations

import logging

from broker.controller import BrokerController
from broker.transaction.service import EndRequest
from common.message import MessageSysFlag
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.server import Channel, RequestDispatcher

log = logging.getLogger(__name__)

_ENDS = (MessageSysFlag.TRANSACTION_COMMIT, MessageSysFlag.TRANSACTION_ROLLBACK)


class EndTransactionProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    def register(self, dispatcher: RequestDispatcher) -> None:
        dispatcher.register(RequestCode.END_TRANSACTION, self.end_transaction)

    async def end_transaction(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand | None:
        b = self.broker
        if b.is_slave:
            log.warning("END_TRANSACTION on a slave from %s refused", channel.remote_addr)
            return req.response(ResponseCode.SLAVE_NOT_AVAILABLE)
        end = EndRequest(
            producer_group=req.get_str("producerGroup"),
            tran_state_table_offset=req.get_int("tranStateTableOffset"),
            commit_log_offset=req.get_int("commitLogOffset"),
            commit_or_rollback=req.get_int("commitOrRollback"),
            from_transaction_check=req.get_bool("fromTransactionCheck", False),
        )
        if end.commit_or_rollback not in _ENDS:
            log.info(
                "producer %s: transaction %s still unknown%s (remark %r)",
                channel.remote_addr,
                req.ext_fields.get("msgId"),
                " after a check" if end.from_transaction_check else "",
                req.remark,
            )
            return None
        if end.commit_or_rollback == MessageSysFlag.TRANSACTION_ROLLBACK:
            log.info("producer %s rolls back %s", channel.remote_addr, req.ext_fields.get("msgId"))
        code, remark = await b.transaction_service.end_transaction(end)
        return req.response(code, remark)


__all__ = ["EndTransactionProcessor"]
