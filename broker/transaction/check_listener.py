"""Sending a check to a producer, and the discard (RocketMQ
``AbstractTransactionalMessageCheckListener`` + ``Broker2Client.checkProducerTransactionState``,
apache/rocketmq 4.9).

A check goes oneway as CHECK_TRANSACTION_STATE (39) on a live connection of the half message's
producer group, picked among the connections whose heartbeats named that group
(``ProducerManager.get_available_channel``): a producer that left is no longer asked, another
member of its group is.  With no member connected, nothing is sent; the record was re-put and
is checked again next round (RocketMQ does the same).  The producer answers with END_TRANSACTION
(fromTransactionCheck=true).
"""

from __future__ import annotations

import logging

import attrs
import trio

from broker.consumer_manager import ProducerManager
from broker.transaction.service import CheckListener, CheckRequest
from common.errors import RmqError
from common.remoting.codes import RequestCode
from common.remoting.command import RemotingCommand

log = logging.getLogger(__name__)

# Java: invokeOneway(channel, request, 10) -- a check must not hold the round up
SEND_TIMEOUT = 3.0


@attrs.define(eq=False)
class DefaultTransactionalMessageCheckListener(CheckListener):
    producers: ProducerManager
    # checks sent / found no producer (tests, stats)
    sent: int = 0
    no_producer: int = 0

    async def resolve_half(self, request: CheckRequest) -> None:
        channel = self.producers.get_available_channel(request.group)
        if channel is None:
            self.no_producer += 1
            log.warning(
                "check of %s: no producer of group %s is connected",
                request.fields.get("msgId"),
                request.group,
            )
            return
        cmd = RemotingCommand.request(
            RequestCode.CHECK_TRANSACTION_STATE, dict(request.fields), oneway=True
        )
        cmd.body = request.body
        try:
            with trio.move_on_after(SEND_TIMEOUT):
                await channel.send(cmd)
                self.sent += 1
        except RmqError as exc:
            log.info("check of %s to %s failed: %s", request.fields.get("msgId"), channel, exc)


__all__ = ["DefaultTransactionalMessageCheckListener"]
