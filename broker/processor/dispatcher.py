"""The request table of a broker: which processor answers which request code."""

from __future__ import annotations

from broker.broker2client import Broker2Client
from broker.controller import BrokerController
from broker.processor.admin import AdminBrokerProcessor
from broker.processor.client_manage import ClientManageProcessor
from broker.processor.consumer_manage import ConsumerManageProcessor
from broker.processor.end_transaction import EndTransactionProcessor
from broker.processor.pop import PopProcessor
from broker.processor.pull import PullMessageProcessor
from broker.processor.query_message import QueryMessageProcessor
from broker.processor.reply import ReplyMessageProcessor
from broker.processor.send import SendMessageProcessor
from common.remoting.server import RequestDispatcher


def build_dispatcher(controller: BrokerController) -> RequestDispatcher:
    """Every processor registered on one dispatcher (the normal and the VIP port share it)."""
    d = RequestDispatcher()
    for proc in (
        SendMessageProcessor(controller),
        PullMessageProcessor(controller),
        ClientManageProcessor(controller),
        ConsumerManageProcessor(controller),
        QueryMessageProcessor(controller),
        AdminBrokerProcessor(controller),
        Broker2Client(controller),
        ReplyMessageProcessor(controller),
        EndTransactionProcessor(controller),
        PopProcessor(controller),
    ):
        proc.register(d)
    d.add_close_listener(controller.on_channel_closed)
    return d


__all__ = ["build_dispatcher"]
