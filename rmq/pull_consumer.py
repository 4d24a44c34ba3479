"""PullConsumer: the caller picks queues and offsets (DefaultMQPullConsumer).

Theory of operation:

* `fetch_queues(topic)` asks the nameserver and returns every readable queue.
* `pull(mq, offset)` sends PULL_MESSAGE with the subscription in the request (sysFlag
  SUBSCRIPTION, so no heartbeat is needed first) and, with `suspend` > 0, the SUSPEND flag:
  the broker then holds the request up to `suspend` seconds until a message arrives (long
  polling); the invoke timeout is that plus the normal timeout.
* It pulls from the node the broker last suggested for that queue (`suggestWhichBrokerId`,
  e.g. a slave when the master is behind), falling back to the master or any live node.
* Response codes 0/19/20/21 are outcomes (FOUND / NO_NEW_MSG / NO_MATCHED_MSG /
  OFFSET_ILLEGAL), anything else raises. Messages are filtered again by tag on the client,
  because the broker's consume-queue filter compares only tag hash codes; a SQL92 selector
  (`MessageSelector.by_sql`) is evaluated by the broker alone (and refused by one without
  `enablePropertyFilter`: the pull raises with the broker's reason).
* Offsets: `query_offset` / `commit_offset` read and store the group's offset on the
  broker (master); -1 means the broker has none for the group yet.
"""

from __future__ import annotations

import enum
import time

import attrs

from common.message import MessageExt
from common.model import MessageQueue
from common.remoting.codes import ResponseCode
from common.remoting.network import Network
from common.session_credentials import SessionCredentials
from rmq.client_api import PULL_SUBSCRIPTION, PULL_SUSPEND
from rmq.client_instance import ClientBase
from rmq.errors import ClientError
from rmq.message_selector import MessageSelector
from rmq.remoting import Remoting
from rmq.topic_publish_info import subscribe_queues


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


_STATUS_BY_CODE = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


@attrs.frozen
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = attrs.field(factory=list)
    # the node that answered: the master, or a slave serving reads (a message's store_host
    # names the master that stored it, even when a slave serves it)
    broker_addr: str = ""
    # the brokerId the route listed that node under when it was asked (0: the master; in
    # DLedger mode a follower is k + 1 for member n<k>); -1 when the route did not list it
    broker_id: int = -1
    # the node the answer suggests for the next pull of this queue (suggestWhichBrokerId)
    suggest_which_broker_id: int = 0


class PullConsumer(ClientBase):
    """`async with PullConsumer("cg", "127.0.0.1:9876") as c: await c.pull(mq, 0)`."""

    def __init__(
        self,
        group: str = "DEFAULT_CONSUMER",
        namesrv: str | list[str] = "127.0.0.1:9876",
        *,
        remoting: Remoting | None = None,
        network: Network | None = None,
        timeout: float = 3.0,
        route_max_age: float = 30.0,
        credentials: SessionCredentials | None = None,
    ) -> None:
        super().__init__(
            namesrv,
            remoting=remoting,
            network=network,
            timeout=timeout,
            route_max_age=route_max_age,
            credentials=credentials,
        )
        if not group:
            raise ClientError("consumer group is empty")
        self.group = group
        self.timeout = timeout
        # queue -> broker id the broker suggested on the last pull (0 = master)
        self._suggested: dict[MessageQueue, int] = {}

    async def __aenter__(self) -> PullConsumer:
        await super().__aenter__()
        return self

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """Every readable queue of `topic`; TopicNotExistError if the nameserver has none."""
        route = await self.client.fetch_route(topic)
        return subscribe_queues(topic, route)

    async def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int = 32,
        *,
        tags: str = "*",
        suspend: float = 0.0,
        timeout: float | None = None,
        selector: MessageSelector | None = None,
    ) -> PullResult:
        """Pull up to `max_nums` messages from `offset`; `suspend` > 0 long-polls that long.

        `tags` ('A || B') or a `selector` (`MessageSelector.by_sql(...)`) say which messages."""
        if offset < 0:
            raise ClientError(f"offset must be >= 0, got {offset}")
        if not 1 <= max_nums <= 1024:
            raise ClientError("max_nums must be within 1..1024")
        if selector is not None and tags.strip() not in ("", "*"):
            raise ClientError("pass tags or a selector, not both")
        chosen = selector if selector is not None else MessageSelector.by_tag(tags)
        wanted = chosen.tags()
        sys_flag = PULL_SUBSCRIPTION | (PULL_SUSPEND if suspend > 0 else 0)
        invoke_timeout = (self.timeout if timeout is None else timeout) + max(0.0, suspend)
        client = self.client
        addr, _is_slave = await client.subscribe_addr(
            mq.brokerName, self._suggested.get(mq, 0), mq.topic
        )
        # RocketMQ's pull answer does not name the node; the client knows whom it asked
        broker_id = next(
            (i for i, a in client.broker_addrs(mq.brokerName).items() if a == addr), -1
        )
        try:
            resp = await client.api.pull_message(
                addr,
                group=self.group,
                mq=mq,
                offset=offset,
                max_nums=max_nums,
                sys_flag=sys_flag,
                commit_offset=0,
                suspend_ms=int(max(0.0, suspend) * 1000),
                subscription=chosen.expression,
                sub_version=int(time.time() * 1000),
                expression_type=chosen.expression_type,
                timeout=invoke_timeout,
            )
        except Exception as exc:
            if getattr(exc, "retriable", False):
                client.invalidate(mq.topic)
                self._suggested.pop(mq, None)
            raise
        self._suggested[mq] = resp.suggest_which_broker_id
        messages = resp.messages
        if wanted is not None:
            messages = [m for m in messages if m.tags in wanted]
        return PullResult(
            _STATUS_BY_CODE[ResponseCode(resp.code)],
            resp.next_begin_offset,
            resp.min_offset,
            resp.max_offset,
            messages,
            addr,
            broker_id,
            resp.suggest_which_broker_id,
        )

    async def check_selector(self, topic: str, selector: MessageSelector) -> None:
        """Ask a broker of `topic` whether it takes `selector` (CHECK_CLIENT_CONFIG, as Java's
        consumers do at start); ClientError with the broker's reason when it does not."""
        await self.client.check_client_in_broker(
            self.group, selector.subscription(topic), self.timeout
        )

    # --- offsets ---------------------------------------------------------------------------

    async def query_offset(self, mq: MessageQueue) -> int:
        """The group's committed offset of `mq`, or -1 when none is stored.

        Asked of the master, or of a slave while the broker has no master (Java's
        RemoteBrokerOffsetStore falls back the same way), so consumers keep going on failover.
        """
        addr = await self.client.any_addr(mq.brokerName, mq.topic)
        found = await self.client.api.query_consumer_offset(
            addr, self.group, mq, timeout=self.timeout
        )
        return -1 if found is None else found

    async def commit_offset(self, mq: MessageQueue, offset: int) -> None:
        addr = await self.client.any_addr(mq.brokerName, mq.topic)
        await self.client.api.update_consumer_offset(
            addr, self.group, mq, offset, timeout=self.timeout
        )

    async def max_offset(self, mq: MessageQueue) -> int:
        addr = await self.client.any_addr(mq.brokerName, mq.topic)
        return await self.client.api.get_max_offset(addr, mq, timeout=self.timeout)

    async def min_offset(self, mq: MessageQueue) -> int:
        addr = await self.client.any_addr(mq.brokerName, mq.topic)
        return await self.client.api.get_min_offset(addr, mq, timeout=self.timeout)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        addr = await self.client.any_addr(mq.brokerName, mq.topic)
        return await self.client.api.search_offset(addr, mq, timestamp_ms, timeout=self.timeout)
