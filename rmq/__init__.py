"""trio-rmq client SDK: `from rmq import Producer, PullConsumer, Admin, Message`.

Async on Trio (`async with Producer(...) as p: await p.send(msg)`); the same shapes for
synchronous code live in `rmq.sync`.
"""

from common.message import MessageExt
from common.model import MessageQueue
from common.session_credentials import SessionCredentials
from rmq.admin import Admin, QueueOffsets
from rmq.errors import BrokerNotFoundError, ClientError, InvalidMessageError, NoRouteInfoError
from rmq.lite_pull_consumer import LitePullConsumer
from rmq.message import Message
from rmq.message_selector import MessageSelector
from rmq.producer import Producer, SendResult, SendStatus
from rmq.pull_consumer import PullConsumer, PullResult, PullStatus
from rmq.push_consumer import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageModel,
    OrderlyStatus,
    PushConsumer,
    allocate_averagely,
)
from rmq.request_reply import create_reply_message
from rmq.transaction_producer import (
    LocalTransactionState,
    TransactionProducer,
    TransactionSendResult,
)

__all__ = [
    "Admin",
    "ConsumeFromWhere",
    "ConsumeStatus",
    "MessageModel",
    "OrderlyStatus",
    "PushConsumer",
    "allocate_averagely",
    "BrokerNotFoundError",
    "ClientError",
    "InvalidMessageError",
    "LitePullConsumer",
    "Message",
    "MessageExt",
    "MessageQueue",
    "MessageSelector",
    "NoRouteInfoError",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "QueueOffsets",
    "SendResult",
    "SendStatus",
    "SessionCredentials",
    "create_reply_message",
    "LocalTransactionState",
    "TransactionProducer",
    "TransactionSendResult",
]
