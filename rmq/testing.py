"""Fault injection for client tests that run against the real in-process servers.

There is no fake server here: client tests use the real nameserver and broker on the in-memory
network (the ``memory_cluster`` fixture of ``tests/conftest.py``).  What this module adds is a
way to make that path misbehave on purpose, and to see what crossed it.

Theory of operation: :class:`Tap` is a :class:`common.remoting.network.Network` to hand to one
client (``Producer(..., network=tap)``).  Each connection that client opens goes through a small
proxy: two tasks in the test's nursery copy frames between the client and the real server.  The
client->server direction is decoded frame by frame, so the tap can

* record every request with the address it went to (``sent``, oneway ones included);
* answer chosen request codes to a chosen address with a chosen response code instead of the
  server (:meth:`Tap.fail`: a broker answering SERVICE_NOT_AVAILABLE, MESSAGE_ILLEGAL, ...);
* swallow them, so the client meets its own timeout (:meth:`Tap.hang`: a broker that stalls);
* edit the server's answers to them (:meth:`Tap.rewrite`: e.g. a master suggesting its slave).

Frames toward the client are written whole, under one lock, so an injected answer never lands
inside a server frame.  Refused and dropped connections are the network's business:
``MemoryNetwork.refused`` and ``MemoryNetwork.cut``.

:meth:`Tap.deliver` sends the client a server->client request and returns its answer.  It is
kept because our broker never sends GET_CONSUMER_RUNNING_INFO or CONSUME_MESSAGE_DIRECTLY on its
own (it forwards no admin call to clients), yet the client must answer them as Java's does.
"""

from __future__ import annotations

import errno
import itertools
import time
from collections.abc import Callable, Collection
from typing import Any

import attrs
import trio
import trio.testing

from common.errors import RemotingConnectError, RemotingTimeoutError
from common.message import (
    MessageConst,
    MessageExtBrokerInner,
    create_offset_msg_id,
    decode_batch_body,
    decode_properties,
    decode_record,
    encode_record,
    java_string_hash,
    tags_code,
)
from common.model import (
    BrokerData,
    ClusterInfo,
    GetConsumerListByGroupResponseBody,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    PermName,
    QueueData,
    TopicList,
    TopicRouteData,
    UnlockBatchRequestBody,
)
from common.remoting.codec import FrameDecoder, encode
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.network import Bound, Network
from common.serde import from_json, to_json

__all__ = ["SENDS", "Tap"]

SENDS = frozenset({RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE})
_COPY_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)


@attrs.define(eq=False)
class _Rule:
    addr: str
    codes: Collection[int] | None  # request codes it applies to; None: every code
    answers: list[int] | None  # response codes, one per matching request; None: no answer
    forever: bool  # an answer rule that is never used up


@attrs.define(eq=False)
class _Link:
    """One proxied connection: ``client`` is our end of the client's stream."""

    addr: str
    client: trio.abc.Stream
    server: trio.abc.Stream
    lock: trio.Lock = attrs.Factory(trio.Lock)
    # opaque of a forwarded request -> its code (to find the answers `rewrite` edits)
    codes: dict[int, int] = attrs.Factory(dict)
    # opaque of a `deliver`ed request -> where its answer goes
    waiting: dict[int, trio.MemorySendChannel[RemotingCommand]] = attrs.Factory(dict)

    async def to_client(self, cmd: RemotingCommand) -> None:
        async with self.lock:
            await self.client.send_all(encode(cmd))


@attrs.define(eq=False)
class Tap:
    network: Network
    nursery: trio.Nursery
    # every request the client sent, with the address it was sent to
    sent: list[tuple[str, RemotingCommand]] = attrs.Factory(list)
    # the client's answers to `deliver`
    answers: list[RemotingCommand] = attrs.Factory(list)
    _rules: list[_Rule] = attrs.Factory(list)
    _rewrites: list[tuple[str, int, Callable[[RemotingCommand], None]]] = attrs.Factory(list)
    _links: list[_Link] = attrs.Factory(list)
    vanished: bool = False  # set by `cut`
    # addresses this client cannot connect to now (a broker down for it alone)
    refused: set[str] = attrs.Factory(set)
    # opaques of injected requests: far above the client's own counter, never reused
    _opaques: itertools.count[int] = attrs.Factory(lambda: itertools.count(1 << 30))

    # --- the rules -------------------------------------------------------------------------

    def fail(
        self, addr: str, *answers: int, requests: Collection[int] = SENDS, forever: bool = False
    ) -> None:
        """Answer the next requests of codes ``requests`` to ``addr`` with ``answers`` (one
        response code each, in order); ``forever``: answer every one with ``answers[0]``."""
        self._rules.append(_Rule(addr, requests, list(answers), forever))

    def hang(self, addr: str, requests: Collection[int] | None = None) -> None:
        """Never pass on requests to or from ``addr`` (of codes ``requests``, default all)."""
        self._rules.append(_Rule(addr, requests, None, True))

    def rewrite(self, addr: str, request: int, edit: Callable[[RemotingCommand], None]) -> None:
        """Call ``edit(response)`` on every answer from ``addr`` to a request of code
        ``request`` before the client sees it."""
        self._rewrites.append((addr, request, edit))

    def clear(self) -> None:
        self._rules.clear()
        self._rewrites.clear()

    def requests(self, code: int | Collection[int], addr: str | None = None) -> list:
        """The requests of ``code`` (or codes) sent (to ``addr``), in order."""
        codes = {code} if isinstance(code, int) else set(code)
        return [c for a, c in self.sent if c.code in codes and addr in (None, a)]

    def _rule_for(self, addr: str, cmd: RemotingCommand) -> _Rule | None:
        for rule in self._rules:
            if rule.addr == addr and (rule.codes is None or cmd.code in rule.codes):
                return rule
        return None

    # --- the Network -----------------------------------------------------------------------

    async def listen(self, host: str, port: int) -> Bound:
        return await self.network.listen(host, port)

    def peer_addr(self, stream: trio.abc.Stream) -> str:
        return self.network.peer_addr(stream)

    async def connect(self, addr: str) -> trio.abc.Stream:
        if self.vanished or addr in self.refused:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"connection refused: {addr}")
        server = await self.network.connect(addr)
        theirs, ours = trio.testing.memory_stream_pair()
        link = _Link(addr, ours, server)
        self._links.append(link)
        self.nursery.start_soon(self._client_to_server, link)
        self.nursery.start_soon(self._server_to_client, link)
        return theirs

    async def _client_to_server(self, link: _Link) -> None:
        decoder = FrameDecoder()
        try:
            while data := await link.client.receive_some():
                for cmd in decoder.feed(data):
                    await self._from_client(link, cmd)
        except _COPY_ERRORS:
            pass
        finally:
            await self._close(link)

    async def _from_client(self, link: _Link, cmd: RemotingCommand) -> None:
        if cmd.is_response:
            answer = link.waiting.pop(cmd.opaque, None)
            if answer is not None:
                answer.send_nowait(cmd)
                return
        else:
            self.sent.append((link.addr, cmd))
            rule = self._rule_for(link.addr, cmd)
            if rule is not None:
                if rule.answers is None:
                    return  # swallowed: the client times out
                code = rule.answers[0] if rule.forever else rule.answers.pop(0)
                if not rule.answers:
                    self._rules.remove(rule)
                if not cmd.is_oneway:
                    await link.to_client(cmd.response(code, f"injected: answer {code}"))
                return
            link.codes[cmd.opaque] = cmd.code
        await link.server.send_all(encode(cmd))

    async def _server_to_client(self, link: _Link) -> None:
        decoder = FrameDecoder()
        try:
            while data := await link.server.receive_some():
                for cmd in decoder.feed(data):
                    if cmd.is_response:
                        code = link.codes.pop(cmd.opaque, None)
                        for addr, request, edit in self._rewrites:
                            if addr == link.addr and request == code:
                                edit(cmd)
                    elif (rule := self._rule_for(link.addr, cmd)) and rule.answers is None:
                        continue  # a hung code is dropped toward the client too (lost notify)
                    await link.to_client(cmd)
        except _COPY_ERRORS:
            pass
        finally:
            await self._close(link)

    async def _close(self, link: _Link) -> None:
        if link in self._links:
            self._links.remove(link)
        for stream in (link.client, link.server):
            await trio.aclose_forcefully(stream)

    async def cut(self) -> None:
        """The client's host vanishes: every connection it made through this tap closes (the
        servers see the channels close) and it cannot connect again."""
        self.vanished = True
        for link in list(self._links):
            await self._close(link)

    # --- server->client requests -----------------------------------------------------------

    async def deliver(self, addr: str, cmd: RemotingCommand) -> RemotingCommand:
        """Send ``cmd`` to the client over its connection to ``addr``; its answer."""
        link = next(link for link in self._links if link.addr == addr)
        cmd.opaque = next(self._opaques)
        send, recv = trio.open_memory_channel[RemotingCommand](1)
        link.waiting[cmd.opaque] = send
        await link.to_client(cmd)
        answer = await recv.receive()
        self.answers.append(answer)
        return answer


# --- the old fake cluster: goes once no test uses it ---------------------------------------

AUTO_CREATE_TOPIC = "TBW102"


def wire_roundtrip(cmd: RemotingCommand) -> RemotingCommand:
    """What the peer decodes from `cmd`: encode a frame, decode it back."""
    [out] = FrameDecoder().feed(encode(cmd))
    return out


@attrs.define(eq=False)
class FakeTopic:
    read: int
    write: int
    perm: int = PermName.READ | PermName.WRITE


@attrs.define(eq=False)
class FakeBroker:
    name: str
    addr: str
    broker_id: int = 0
    cluster: str = "DefaultCluster"
    topics: dict[str, FakeTopic] = attrs.Factory(dict)
    # (topic, queue_id) -> encoded records; the list index is the logical queue offset
    queues: dict[tuple[str, int], list[tuple[bytes, int]]] = attrs.Factory(dict)
    offsets: dict[tuple[str, str, int], int] = attrs.Factory(dict)
    fail_next_sends: list[int] = attrs.Factory(list)
    down: bool = False
    hang: bool = False
    requests: list[RemotingCommand] = attrs.Factory(list)
    # next commitlog offset; increases by each record's size like a real CommitLog
    phys_offset: int = 0
    # commitlog offset -> (topic, queue id, queue offset) of each record
    by_phys: dict[int, tuple[str, int, int]] = attrs.Factory(dict)
    # answer CONSUMER_SEND_MSG_BACK with SYSTEM_ERROR (storing nothing)
    refuse_send_back: bool = False
    # called after each append (the cluster wakes held pulls)
    on_append: Callable[[], None] | None = None

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.addr.rpartition(":")
        return host, int(port)

    def append(self, topic: str, queue_id: int, flag: int, body: bytes, props, born_ts: int):
        q = self.queues.setdefault((topic, queue_id), [])
        inner = MessageExtBrokerInner(
            topic=topic,
            queue_id=queue_id,
            flag=flag,
            body=body,
            properties=dict(props),
            born_timestamp=born_ts,
            born_host=("127.0.0.1", 50000),
            store_host=self.host_port,
        )
        record = encode_record(inner, len(q), self.phys_offset, int(time.time() * 1000))
        q.append((record, tags_code(props.get(MessageConst.TAGS))))
        msg_id = create_offset_msg_id(self.host_port, self.phys_offset)
        self.by_phys[self.phys_offset] = (topic, queue_id, len(q) - 1)
        self.phys_offset += len(record)
        if self.on_append is not None:
            self.on_append()
        return msg_id, len(q) - 1

    def append_inner(self, inner: MessageExtBrokerInner):
        """Append a prepared message (send-back): keeps reconsume times and flags."""
        q = self.queues.setdefault((inner.topic, inner.queue_id), [])
        record = encode_record(inner, len(q), self.phys_offset, int(time.time() * 1000))
        q.append((record, tags_code(inner.properties.get(MessageConst.TAGS))))
        self.by_phys[self.phys_offset] = (inner.topic, inner.queue_id, len(q) - 1)
        self.phys_offset += len(record)
        if self.on_append is not None:
            self.on_append()
        return len(q) - 1

    def messages(self, topic: str, queue_id: int) -> list[bytes]:
        return [r for r, _ in self.queues.get((topic, queue_id), [])]


@attrs.define(eq=False)
class FakeCluster:
    namesrv_addrs: list[str] = attrs.Factory(lambda: ["127.0.0.1:9876"])
    brokers: list[FakeBroker] = attrs.Factory(list)
    auto_create: bool = True
    namesrv_down: set[str] = attrs.Factory(set)
    namesrv_requests: list[RemotingCommand] = attrs.Factory(list)
    # called with (broker, request, response) before a broker answer leaves; may edit it
    response_hook: Callable[[FakeBroker, RemotingCommand, RemotingCommand], None] | None = None
    # group -> {client id: the FakeRemoting its heartbeats came through}, in join order
    groups: dict[str, dict[str, Any]] = attrs.Factory(dict)
    # (group, MessageQueue) -> (client id, Trio time of the last lock)
    locks: dict[tuple[str, Any], tuple[str, float]] = attrs.Factory(dict)
    lock_max_live_time: float = 60.0
    # SEARCH_OFFSET_BY_TIMESTAMP answers 3 (not supported) unless enabled (older tests rely on it)
    search_offset_enabled: bool = False
    # (remoting, NOTIFY command) waiting to be delivered
    pending_notifies: list[tuple[Any, RemotingCommand]] = attrs.Factory(list)
    # every CONSUMER_SEND_MSG_BACK: (group, original offset msgId, target topic)
    send_backs: list[tuple[str, str, str]] = attrs.Factory(list)
    # the FakeRemoting whose request is being handled (set around each broker request)
    current_remoting: Any = None
    # replaced on every append: held pulls wait on it
    arrival: trio.Event = attrs.Factory(trio.Event)

    def _arrived(self) -> None:
        self.arrival.set()
        self.arrival = trio.Event()

    def members(self, group: str) -> list[str]:
        return list(self.groups.get(group, {}))

    def _notify_group(self, group: str) -> None:
        for remoting in self.groups.get(group, {}).values():
            cmd = RemotingCommand.request(
                RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group}, oneway=True
            )
            self.pending_notifies.append((remoting, cmd))

    async def deliver_notifies(self) -> None:
        while self.pending_notifies:
            remoting, cmd = self.pending_notifies.pop(0)
            await remoting.deliver(cmd)

    async def disconnect(self, client_id: str) -> None:
        """The client's connections closed: it leaves every group and the rest are told."""
        for group, members in self.groups.items():
            if members.pop(client_id, None) is not None:
                self._notify_group(group)
        await self.deliver_notifies()

    def add_broker(self, name: str, addr: str, broker_id: int = 0, **kw) -> FakeBroker:
        broker = FakeBroker(name, addr, broker_id, **kw)
        broker.on_append = self._arrived
        if self.auto_create and broker_id == 0:
            broker.topics[AUTO_CREATE_TOPIC] = FakeTopic(8, 8, 7)
        self.brokers.append(broker)
        return broker

    def broker(self, addr: str) -> FakeBroker | None:
        return next((b for b in self.brokers if b.addr == addr), None)

    def create_topic(self, topic: str, queues: int = 4, *, brokers=None, perm: int = 6) -> None:
        for b in brokers or [b for b in self.brokers if b.broker_id == 0]:
            b.topics[topic] = FakeTopic(queues, queues, perm)

    # --- nameserver ------------------------------------------------------------------------

    def route(self, topic: str) -> TopicRouteData | None:
        masters = [b for b in self.brokers if b.broker_id == 0 and topic in b.topics]
        if not masters:
            return None
        names = {b.name for b in masters}
        qds = [
            QueueData(b.name, b.topics[topic].read, b.topics[topic].write, b.topics[topic].perm)
            for b in masters
        ]
        bds = []
        for name in sorted(names):
            # a broker that is `down` stays in the route: the nameserver has not noticed yet
            nodes = [b for b in self.brokers if b.name == name]
            bds.append(BrokerData(nodes[0].cluster, name, {b.broker_id: b.addr for b in nodes}))
        return TopicRouteData(queueDatas=qds, brokerDatas=bds)

    def handle_namesrv(self, cmd: RemotingCommand) -> RemotingCommand:
        self.namesrv_requests.append(cmd)
        if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            topic = cmd.get_str("topic")
            route = self.route(topic)
            if route is None:
                return cmd.response(
                    ResponseCode.TOPIC_NOT_EXIST,
                    f"No topic route info in name server for the topic: {topic}",
                )
            return cmd.response(body=to_json(route))
        if cmd.code == RequestCode.GET_BROKER_CLUSTER_INFO:
            info = ClusterInfo()
            for b in self.brokers:
                if b.down:
                    continue
                bd = info.brokerAddrTable.setdefault(b.name, BrokerData(b.cluster, b.name, {}))
                bd.brokerAddrs[b.broker_id] = b.addr
                names = info.clusterAddrTable.setdefault(b.cluster, [])
                if b.name not in names:
                    names.append(b.name)
            return cmd.response(body=to_json(info))
        if cmd.code == RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER:
            topics = sorted({t for b in self.brokers for t in b.topics})
            return cmd.response(body=to_json(TopicList(topics)))
        return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"code {cmd.code}")

    # --- broker ----------------------------------------------------------------------------

    def handle_broker(self, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand | None:
        b.requests.append(cmd)
        handler = _BROKER_HANDLERS.get(cmd.code)
        if handler is None:
            return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"code {cmd.code}")
        resp = handler(self, b, cmd)
        if self.response_hook is not None:
            self.response_hook(b, cmd, resp)
        return resp


def _send(cluster: FakeCluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    if b.fail_next_sends:
        code = b.fail_next_sends.pop(0)
        return cmd.response(code, f"injected failure {code}")
    if b.broker_id != 0:
        return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE, "service not available now")
    topic = cmd.get_str("b")
    cfg = b.topics.get(topic)
    if cfg is None:
        default = b.topics.get(cmd.get_str("c"))
        if default is None or not PermName.is_inherited(default.perm):
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        n = min(cmd.get_int("d"), default.write)
        cfg = b.topics[topic] = FakeTopic(n, n)
    queue_id = cmd.get_int("e")
    if queue_id >= max(cfg.read, cfg.write):
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"queueId {queue_id} out of range")
    born = cmd.get_int("g")
    props = decode_properties(cmd.ext_fields.get("i", ""))
    if cmd.get_bool("m", False):
        items = decode_batch_body(cmd.body_bytes())
        results = [
            b.append(topic, queue_id, flag, body, {**p, **props}, born) for flag, body, p in items
        ]
        msg_id = ",".join(r[0] for r in results)
        offset = results[0][1]
    else:
        msg_id, offset = b.append(topic, queue_id, cmd.get_int("h"), cmd.body_bytes(), props, born)
    return cmd.response(
        ext_fields={
            "msgId": msg_id,
            "queueId": queue_id,
            "queueOffset": offset,
            "MSG_REGION": "DefaultRegion",
            "TRACE_ON": "true",
        }
    )


def _pull(cluster: FakeCluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    topic = cmd.get_str("topic")
    if topic not in b.topics and not any(t == topic for t, _ in b.queues):
        return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
    queue_id = cmd.get_int("queueId")
    offset = cmd.get_int("queueOffset")
    max_nums = cmd.get_int("maxMsgNums")
    if cmd.get_int("sysFlag") & 0x1 and b.broker_id == 0:
        b.offsets[(cmd.get_str("consumerGroup"), topic, queue_id)] = cmd.get_int("commitOffset")
    q = b.queues.get((topic, queue_id), [])
    sub = cmd.ext_fields.get("subscription", "*").strip()
    codes = None if sub in ("", "*") else {java_string_hash(t.strip()) for t in sub.split("||")}
    ext = {"minOffset": 0, "maxOffset": len(q), "suggestWhichBrokerId": 0}
    if offset > len(q):
        return cmd.response(
            ResponseCode.PULL_OFFSET_MOVED,
            "OFFSET_OVERFLOW_BADLY",
            {**ext, "nextBeginOffset": len(q)},
        )
    if offset == len(q):
        return cmd.response(
            ResponseCode.PULL_NOT_FOUND, "OFFSET_OVERFLOW_ONE", {**ext, "nextBeginOffset": offset}
        )
    found, pos = [], offset
    while pos < len(q) and len(found) < max_nums:
        record, code = q[pos]
        pos += 1
        if codes is None or code in codes:
            found.append(record)
    if not found:
        return cmd.response(
            ResponseCode.PULL_RETRY_IMMEDIATELY,
            "NO_MATCHED_MESSAGE",
            {**ext, "nextBeginOffset": pos},
        )
    return cmd.response(body=b"".join(found), ext_fields={**ext, "nextBeginOffset": pos})


def _query_offset(cluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    key = (cmd.get_str("consumerGroup"), cmd.get_str("topic"), cmd.get_int("queueId"))
    if key not in b.offsets:
        return cmd.response(ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe...")
    return cmd.response(ext_fields={"offset": b.offsets[key]})


def _update_offset(cluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    key = (cmd.get_str("consumerGroup"), cmd.get_str("topic"), cmd.get_int("queueId"))
    b.offsets[key] = cmd.get_int("commitOffset")
    return cmd.response()


def _max_offset(cluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    q = b.queues.get((cmd.get_str("topic"), cmd.get_int("queueId")), [])
    return cmd.response(ext_fields={"offset": len(q)})


def _min_offset(cluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(ext_fields={"offset": 0})


def _create_topic(cluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    b.topics[cmd.get_str("topic")] = FakeTopic(
        cmd.get_int("readQueueNums"), cmd.get_int("writeQueueNums"), cmd.get_int("perm")
    )
    return cmd.response()


def _runtime_info(cluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(body=b'{"table":{}}')


def _heart_beat(cluster: FakeCluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    hb = from_json(cmd.body_bytes(), HeartbeatData)
    for cd in hb.consumerDataSet:
        retry = "%RETRY%" + cd.groupName
        if b.broker_id == 0 and retry not in b.topics:
            b.topics[retry] = FakeTopic(1, 1)
        members = cluster.groups.setdefault(cd.groupName, {})
        if hb.clientID not in members:
            members[hb.clientID] = cluster.current_remoting
            cluster._notify_group(cd.groupName)
    return cmd.response()


def _unregister(cluster: FakeCluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    group = cmd.ext_fields.get("consumerGroup")
    if group and cluster.groups.get(group, {}).pop(cmd.get_str("clientID"), None) is not None:
        cluster._notify_group(group)
    return cmd.response()


def _consumer_list(cluster: FakeCluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    group = cmd.get_str("consumerGroup")
    ids = cluster.members(group)
    if not ids:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
    return cmd.response(body=to_json(GetConsumerListByGroupResponseBody(ids)))


def _lock(cluster: FakeCluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    body = from_json(cmd.body_bytes(), LockBatchRequestBody)
    now = trio.current_time()
    ok = []
    for mq in body.mqSet:
        held = cluster.locks.get((body.consumerGroup, mq))
        if held is None or held[0] == body.clientId or now - held[1] > cluster.lock_max_live_time:
            cluster.locks[(body.consumerGroup, mq)] = (body.clientId, now)
            ok.append(mq)
    return cmd.response(body=to_json(LockBatchResponseBody(ok)))


def _unlock(cluster: FakeCluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    body = from_json(cmd.body_bytes(), UnlockBatchRequestBody)
    for mq in body.mqSet:
        held = cluster.locks.get((body.consumerGroup, mq))
        if held is not None and held[0] == body.clientId:
            del cluster.locks[(body.consumerGroup, mq)]
    return cmd.response()


def _send_back(cluster: FakeCluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    if b.refuse_send_back:
        return cmd.response(ResponseCode.SYSTEM_ERROR, "injected: send back refused")
    group = cmd.get_str("group")
    phys = cmd.get_int("offset")
    delay = cmd.get_int("delayLevel")
    where = b.by_phys.get(phys)
    if where is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {phys}")
    topic, qid, idx = where
    orig = decode_record(b.queues[(topic, qid)][idx][0])
    props = dict(orig.properties)
    props.setdefault(MessageConst.RETRY_TOPIC, orig.topic)
    props.setdefault(MessageConst.ORIGIN_MESSAGE_ID, orig.msg_id)
    max_times = cmd.get_int("maxReconsumeTimes", 16)
    if orig.reconsume_times >= max_times or delay < 0:
        target = "%DLQ%" + group
        props.pop(MessageConst.DELAY, None)
    else:
        target = "%RETRY%" + group
        props[MessageConst.DELAY] = str(delay or 3 + orig.reconsume_times)
    b.topics.setdefault(target, FakeTopic(1, 1))
    inner = MessageExtBrokerInner(
        topic=target,
        queue_id=0,
        flag=orig.flag,
        body=orig.body,
        properties=props,
        born_timestamp=orig.born_timestamp,
        born_host=orig.born_host,
        store_host=b.host_port,
        reconsume_times=orig.reconsume_times + 1,
    )
    b.append_inner(inner)
    cluster.send_backs.append((group, orig.msg_id, target))
    return cmd.response()


def _search_offset(cluster, b: FakeBroker, cmd: RemotingCommand) -> RemotingCommand:
    if not cluster.search_offset_enabled:
        return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"code {cmd.code}")
    q = b.queues.get((cmd.get_str("topic"), cmd.get_int("queueId")), [])
    ts = cmd.get_int("timestamp")
    for i, (record, _) in enumerate(q):
        if decode_record(record).store_timestamp >= ts:
            return cmd.response(ext_fields={"offset": i})
    return cmd.response(ext_fields={"offset": len(q)})


_BROKER_HANDLERS: dict[int, Callable] = {
    RequestCode.HEART_BEAT: _heart_beat,
    RequestCode.UNREGISTER_CLIENT: _unregister,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: _consumer_list,
    RequestCode.LOCK_BATCH_MQ: _lock,
    RequestCode.UNLOCK_BATCH_MQ: _unlock,
    RequestCode.CONSUMER_SEND_MSG_BACK: _send_back,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: _search_offset,
    RequestCode.SEND_MESSAGE_V2: _send,
    RequestCode.SEND_BATCH_MESSAGE: _send,
    RequestCode.PULL_MESSAGE: _pull,
    RequestCode.QUERY_CONSUMER_OFFSET: _query_offset,
    RequestCode.UPDATE_CONSUMER_OFFSET: _update_offset,
    RequestCode.GET_MAX_OFFSET: _max_offset,
    RequestCode.GET_MIN_OFFSET: _min_offset,
    RequestCode.UPDATE_AND_CREATE_TOPIC: _create_topic,
    RequestCode.GET_BROKER_RUNTIME_INFO: _runtime_info,
}


@attrs.define(eq=False)
class FakeRemoting:
    """Stands in for common.remoting.client.RemotingClient over a FakeCluster."""

    cluster: FakeCluster
    # every (addr, request) in order, oneway ones included
    sent: list[tuple[str, RemotingCommand]] = attrs.Factory(list)
    # the client's handler of broker->client requests (set_request_handler)
    handler: Callable | None = None
    # answers the client gave to broker->client requests
    answers: list[RemotingCommand] = attrs.Factory(list)

    def set_request_handler(self, handler) -> None:
        self.handler = handler

    async def deliver(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """A broker->client request reaches this client (through the codec)."""
        if self.handler is None:
            return None
        resp = await self.handler(wire_roundtrip(cmd), None)
        if resp is not None:
            resp = wire_roundtrip(resp)
            self.answers.append(resp)
        return resp

    def _handle(self, addr: str, cmd: RemotingCommand) -> RemotingCommand | None:
        if addr in self.cluster.namesrv_addrs:
            if addr in self.cluster.namesrv_down:
                raise RemotingConnectError(f"connect to {addr} failed: connection refused")
            return self.cluster.handle_namesrv(cmd)
        broker = self.cluster.broker(addr)
        if broker is None or broker.down:
            raise RemotingConnectError(f"connect to {addr} failed: connection refused")
        if broker.hang:
            broker.requests.append(cmd)
            return None
        self.cluster.current_remoting = self
        try:
            return self.cluster.handle_broker(broker, cmd)
        finally:
            self.cluster.current_remoting = None

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0):
        await trio.lowlevel.checkpoint()
        req = wire_roundtrip(cmd)
        self.sent.append((addr, req))
        resp = self._handle(addr, req)
        if resp is None:
            await trio.sleep(timeout)
            raise RemotingTimeoutError(f"wait response on {addr} timeout {timeout} s")
        if (
            req.code == RequestCode.PULL_MESSAGE
            and resp.code == ResponseCode.PULL_NOT_FOUND
            and req.get_int("sysFlag") & 0x2
        ):
            # long polling: hold until a message arrives or the suspend time is up
            with trio.move_on_after(min(timeout, req.get_int("suspendTimeoutMillis") / 1000)):
                while resp.code == ResponseCode.PULL_NOT_FOUND:
                    await self.cluster.arrival.wait()
                    resp = self._handle(addr, req)
                    if resp is None:
                        await trio.sleep(timeout)
                        raise RemotingTimeoutError(f"wait response on {addr} timeout {timeout} s")
        await self.cluster.deliver_notifies()
        # A real response wakes the waiting task without a cancellation check (the reader task
        # reschedules it); yield the same way so callers meet the same interleavings.
        await trio.lowlevel.cancel_shielded_checkpoint()
        return wire_roundtrip(resp)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        await trio.lowlevel.checkpoint()
        req = wire_roundtrip(cmd)
        assert req.is_oneway
        self.sent.append((addr, req))
        self._handle(addr, req)
        await self.cluster.deliver_notifies()
