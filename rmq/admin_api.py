"""Admin wire calls and the values they answer (the admin half of MQClientAPIImpl).

Theory of operation: like `rmq.client_api`, each function builds the extFields a 4.9 Java
admin tool sends to ONE address and turns the answer into a value or an error by cause. Which
addresses to ask and how to merge the answers of several brokers is `rmq.admin.Admin`'s job.

Two answers are not strict JSON: TopicStatsTable and ConsumeStats are fastjson renderings of
a `Map<MessageQueue, V>`, whose keys are JSON *objects* (`{{"brokerName":..}:{..}}`).
`parse_mq_map` reads that shape with the standard decoder's `raw_decode`, one key and one
value at a time, and accepts strict JSON objects too (keys that are strings holding JSON).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from common.errors import ProtocolError, error_for_response
from common.message import MessageExt, decode_records
from common.model import MessageQueue
from common.remoting.codes import RequestCode, ResponseCode
from common.serde import loads
from rmq.remoting import RequestHelpers

# QueryMessageRequestHeader's end timestamp when the caller wants "any time" (Long.MAX_VALUE).
END_OF_TIME = 2**63 - 1

# --- values ----------------------------------------------------------------------------------


@attrs.frozen
class QueueConsumeStats:
    """One queue of a group's progress (Java OffsetWrapper)."""

    queue: MessageQueue
    broker_offset: int  # the queue's max offset (next offset to be written)
    consumer_offset: int  # the group's committed offset (0 when it never committed)
    last_timestamp: int  # store time (ms) of the last consumed message, 0 when none

    @property
    def lag(self) -> int:
        return max(self.broker_offset - self.consumer_offset, 0)


@attrs.frozen
class ConsumeStats:
    """A group's progress over every queue it consumes (Java ConsumeStats), merged over brokers."""

    group: str
    queues: tuple[QueueConsumeStats, ...]  # sorted by topic, broker name, queue id
    consume_tps: float = 0.0  # summed over the brokers that report it

    @property
    def lag(self) -> int:
        return sum(q.lag for q in self.queues)

    @property
    def broker_offset(self) -> int:
        return sum(q.broker_offset for q in self.queues)

    @property
    def consumer_offset(self) -> int:
        return sum(q.consumer_offset for q in self.queues)

    def topics(self) -> list[str]:
        return sorted({q.queue.topic for q in self.queues})


@attrs.frozen
class ConsumerConnection:
    """One online client of a consumer group as a broker sees it (Java Connection + group)."""

    client_id: str
    client_addr: str
    language: str
    version: int
    # the group's subscriptions (topic -> sub expression), its consume type and model
    subscriptions: dict[str, str] = attrs.field(factory=dict, eq=False)
    consume_type: str = ""
    message_model: str = ""
    consume_from_where: str = ""


@attrs.frozen
class QueueStats:
    """One queue of a topic (Java TopicOffset)."""

    queue: MessageQueue
    min_offset: int
    max_offset: int
    last_update_timestamp: int  # store time (ms) of the newest message, 0 when empty

    @property
    def count(self) -> int:
        return max(self.max_offset - self.min_offset, 0)


# --- Map<MessageQueue, V> bodies ---------------------------------------------------------------


def _mq(value: Any) -> MessageQueue:
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError(f"a MessageQueue key must be an object, not {value!r}")
    try:
        return MessageQueue(str(value["topic"]), str(value["brokerName"]), int(value["queueId"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"bad MessageQueue key {value!r}: {exc}") from None


def parse_mq_map(body: bytes, field: str) -> tuple[dict[str, Any], list[tuple[MessageQueue, Any]]]:
    """(other top-level fields, [(mq, value)]) of a body holding `field: Map<MessageQueue, V>`.

    Raises ProtocolError when the body is neither fastjson's object-keyed map nor strict JSON.
    """
    text = body.decode("utf-8", "replace")
    try:
        return _parse_mq_map(text, field)
    except (ValueError, IndexError) as exc:
        raise ProtocolError(f"cannot parse {field} body: {exc}") from None


def _parse_mq_map(text: str, field: str) -> tuple[dict[str, Any], list[tuple[MessageQueue, Any]]]:
    dec = json.JSONDecoder()
    ws = " \t\r\n"

    def skip(i: int) -> int:
        while i < len(text) and text[i] in ws:
            i += 1
        return i

    def expect(i: int, ch: str) -> int:
        i = skip(i)
        if i >= len(text) or text[i] != ch:
            raise ValueError(f"expected {ch!r} at {i}")
        return i + 1

    others: dict[str, Any] = {}
    entries: list[tuple[MessageQueue, Any]] = []
    i = expect(0, "{")
    i = skip(i)
    if text[i] == "}":
        return others, entries
    while True:
        name, i = dec.raw_decode(text, skip(i))
        i = expect(i, ":")
        i = skip(i)
        if name == field and text[i] == "{":
            i = skip(i + 1)
            if text[i] == "}":
                i += 1
            else:
                while True:
                    key, i = dec.raw_decode(text, skip(i))
                    i = expect(i, ":")
                    value, i = dec.raw_decode(text, skip(i))
                    entries.append((_mq(key), value))
                    i = skip(i)
                    if text[i] == ",":
                        i += 1
                        continue
                    i = expect(i, "}")
                    break
        else:
            others[str(name)], i = dec.raw_decode(text, i)
        i = skip(i)
        if text[i] == ",":
            i += 1
            continue
        i = expect(i, "}")
        if skip(i) != len(text):
            raise ValueError(f"trailing data at {i}")
        return others, entries


def _int(value: Any, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ProtocolError(f"{what} is not an integer: {value!r}") from None


# --- requests --------------------------------------------------------------------------------


class AdminAPI(RequestHelpers):
    """Stateless admin requests over a RemotingClient (all they need is `invoke`)."""

    async def broker_runtime_info(self, addr: str, *, timeout: float) -> dict[str, str]:
        resp = await self._call_ok(addr, RequestCode.GET_BROKER_RUNTIME_INFO, timeout=timeout)
        try:
            table = loads(resp.body_bytes()).get("table")
        except (ValueError, AttributeError) as exc:
            raise ProtocolError(
                f"{addr} sent a runtime info body that is not a KVTable: {exc}"
            ) from None
        if not isinstance(table, dict):
            raise ProtocolError(f"{addr} sent a runtime info body without a table")
        return {str(k): str(v) for k, v in table.items()}

    async def offset_topics_by_group(self, addr: str, *, timeout: float) -> dict[str, set[str]]:
        """group -> the topics it has a consumer offset for on the broker at `addr`, from
        GET_ALL_CONSUMER_OFFSET (ConsumerOffsetSerializeWrapper, keyed `topic@group`)."""
        resp = await self._call_ok(addr, RequestCode.GET_ALL_CONSUMER_OFFSET, timeout=timeout)
        try:
            table = loads(resp.body_bytes() or b"{}").get("offsetTable") or {}
        except (ValueError, AttributeError) as exc:
            raise ProtocolError(
                f"{addr} sent a bad ConsumerOffsetSerializeWrapper: {exc}"
            ) from None
        groups: dict[str, set[str]] = {}
        for key, queues in table.items():
            topic, at, group = str(key).rpartition("@")
            if at and queues:
                groups.setdefault(group, set()).add(topic)
        return groups

    async def subscription_groups(self, addr: str, *, timeout: float) -> list[str]:
        """Group names of GET_ALL_SUBSCRIPTIONGROUP_CONFIG (SubscriptionGroupWrapper)."""
        resp = await self._call_ok(
            addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, timeout=timeout
        )
        try:
            table = loads(resp.body_bytes()).get("subscriptionGroupTable") or {}
        except (ValueError, AttributeError) as exc:
            raise ProtocolError(f"{addr} sent a bad SubscriptionGroupWrapper: {exc}") from None
        return sorted(str(g) for g in table)

    async def consume_stats(
        self, addr: str, group: str, topic: str | None, *, timeout: float
    ) -> tuple[float, list[QueueConsumeStats]]:
        ext: dict[str, object] = {"consumerGroup": group}
        if topic:
            ext["topic"] = topic
        resp = await self._call_ok(addr, RequestCode.GET_CONSUME_STATS, ext, timeout=timeout)
        others, entries = parse_mq_map(resp.body_bytes(), "offsetTable")
        try:
            tps = float(others.get("consumeTps") or 0.0)
        except (TypeError, ValueError):
            tps = 0.0
        out = []
        for mq, v in entries:
            if not isinstance(v, dict):
                raise ProtocolError(f"consume stats value of {mq} is not an object: {v!r}")
            out.append(
                QueueConsumeStats(
                    mq,
                    _int(v.get("brokerOffset", 0), "brokerOffset"),
                    _int(v.get("consumerOffset", 0), "consumerOffset"),
                    _int(v.get("lastTimestamp", 0), "lastTimestamp"),
                )
            )
        return tps, out

    async def topic_stats(self, addr: str, topic: str, *, timeout: float) -> list[QueueStats]:
        resp = await self._call_ok(
            addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}, timeout=timeout
        )
        _, entries = parse_mq_map(resp.body_bytes(), "offsetTable")
        out = []
        for mq, v in entries:
            if not isinstance(v, dict):
                raise ProtocolError(f"topic stats value of {mq} is not an object: {v!r}")
            out.append(
                QueueStats(
                    mq,
                    _int(v.get("minOffset", 0), "minOffset"),
                    _int(v.get("maxOffset", 0), "maxOffset"),
                    _int(v.get("lastUpdateTimestamp", 0), "lastUpdateTimestamp"),
                )
            )
        return out

    async def consumer_connections(
        self, addr: str, group: str, *, timeout: float
    ) -> list[ConsumerConnection]:
        """The group's clients on this broker; [] when CONSUMER_NOT_ONLINE (206)."""
        resp = await self._call(
            addr,
            RequestCode.GET_CONSUMER_CONNECTION_LIST,
            {"consumerGroup": group},
            timeout=timeout,
        )
        if resp.code == ResponseCode.CONSUMER_NOT_ONLINE:
            return []
        if resp.code != ResponseCode.SUCCESS:
            raise error_for_response(resp.code, resp.remark)
        try:
            doc = loads(resp.body_bytes())
            subs = {
                str(t): str((s or {}).get("subString", "*"))
                for t, s in (doc.get("subscriptionTable") or {}).items()
            }
            return [
                ConsumerConnection(
                    str(c.get("clientId", "")),
                    str(c.get("clientAddr", "")),
                    str(c.get("language", "")),
                    _int(c.get("version", 0), "version"),
                    subs,
                    str(doc.get("consumeType") or ""),
                    str(doc.get("messageModel") or ""),
                    str(doc.get("consumeFromWhere") or ""),
                )
                for c in doc.get("connectionSet") or []
            ]
        except (ValueError, AttributeError) as exc:
            raise ProtocolError(f"{addr} sent a bad ConsumerConnection body: {exc}") from None

    async def delete_topic_in_broker(self, addr: str, topic: str, *, timeout: float) -> None:
        await self._call_ok(
            addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic}, timeout=timeout
        )

    async def delete_topic_in_namesrv(
        self, addr: str, topic: str, cluster: str | None, *, timeout: float
    ) -> None:
        ext: dict[str, object] = {"topic": topic}
        if cluster:
            ext["clusterName"] = cluster
        await self._call_ok(addr, RequestCode.DELETE_TOPIC_IN_NAMESRV, ext, timeout=timeout)

    async def query_message(
        self,
        addr: str,
        topic: str,
        key: str,
        max_num: int,
        *,
        unique: bool = False,
        begin: int = 0,
        end: int = END_OF_TIME,
        timeout: float,
    ) -> list[MessageExt]:
        """QUERY_MESSAGE: records indexed under `key` (or the UNIQ_KEY with `unique`)."""
        ext = {
            "topic": topic,
            "key": key,
            "maxNum": max_num,
            "beginTimestamp": begin,
            "endTimestamp": end,
            "_UNIQUE_KEY_QUERY": "true" if unique else "false",
        }
        resp = await self._call(addr, RequestCode.QUERY_MESSAGE, ext, timeout=timeout)
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return []
        if resp.code != ResponseCode.SUCCESS:
            raise error_for_response(resp.code, resp.remark)
        body = resp.body_bytes()
        return decode_records(body) if body else []

    async def view_message(self, addr: str, phys_offset: int, *, timeout: float) -> MessageExt:
        """VIEW_MESSAGE_BY_ID: the record at CommitLog offset `phys_offset`."""
        resp = await self._call_ok(
            addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": phys_offset}, timeout=timeout
        )
        records = decode_records(resp.body_bytes())
        if not records:
            raise ProtocolError(f"{addr} answered VIEW_MESSAGE_BY_ID with no record")
        return records[0]
