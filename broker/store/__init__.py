"""The broker's message store: CommitLog, ConsumeQueues, index (see docs/internal-apis.md).

Import the public API from here: ``from broker.store import MessageStoreConfig, run_memory_store``.
"""

from broker.store.config import MessageStoreConfig, parse_delay_levels
from broker.store.memory_store import MemoryMessageStore, run_memory_store
from broker.store.message_store import DefaultMessageStore, StoreLockedError, run_message_store
from broker.store.results import (
    AppendMessageResult,
    GetMessageResult,
    GetMessageStatus,
    MessageFilter,
    PendingPut,
    PutMessageResult,
    PutMessageStatus,
    QueryMessageResult,
)

__all__ = [
    "AppendMessageResult",
    "DefaultMessageStore",
    "GetMessageResult",
    "GetMessageStatus",
    "MemoryMessageStore",
    "MessageFilter",
    "MessageStoreConfig",
    "PendingPut",
    "PutMessageResult",
    "PutMessageStatus",
    "QueryMessageResult",
    "StoreLockedError",
    "parse_delay_levels",
    "run_memory_store",
    "run_message_store",
]
