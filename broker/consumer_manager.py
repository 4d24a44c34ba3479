"""Who is connected: consumer groups, producer groups and queue locks.

RocketMQ ``ConsumerManager`` / ``ConsumerGroupInfo``, ``ProducerManager`` and
``RebalanceLockManager``.

Theory of operation
-------------------
Clients announce themselves with HEART_BEAT (every 30 s).  Each consumer group records, per
connection (``Channel``), the client id, language and last heartbeat time, plus the group's
current subscriptions (topic -> SubscriptionData, the newest heartbeat wins).  Consumers
rebalance by asking GET_CONSUMER_LIST_BY_GROUP, so when a group's membership or subscription
changes every member is told with a oneway NOTIFY_CONSUMER_IDS_CHANGED: ``on_ids_changed`` is
called with the group and its channels, and the broker service sends the notifications from a
task of its own (this module never awaits, so its tables change atomically).

A member leaves when it sends UNREGISTER_CLIENT, when its connection closes
(:meth:`ConsumerManager.do_channel_close_event`, wired to the remoting server's close
listener) or when no heartbeat came for ``channel_expired_timeout`` (120 s), checked by
:meth:`scan_not_active_channel` every 10 s.

Orderly consumers lock queues (LOCK_BATCH_MQ): a lock belongs to one client id of the group
and lasts ``max_live_time`` (60 s) after its last renewal; an expired lock may be taken by
anyone.  All times are read from ``clock`` (Trio's clock by default) so tests can autojump.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable

import attrs
import trio

from common.model import (
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    MessageQueue,
    SubscriptionData,
)
from common.remoting.channel import Channel

log = logging.getLogger(__name__)

CHANNEL_EXPIRED_TIMEOUT = 120.0
REBALANCE_LOCK_MAX_LIVE_TIME = 60.0


@attrs.define(eq=False)
class ClientChannelInfo:
    channel: Channel  # hashable by identity
    client_id: str
    language: str = "JAVA"
    version: int = 0
    last_update: float = 0.0


@attrs.define(eq=False)
class ConsumerGroupInfo:
    group_name: str
    consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    # channel -> its client; one entry per connection of a member
    channels: dict[Channel, ClientChannelInfo] = attrs.field(factory=dict)
    # topic -> newest subscription from any member's heartbeat
    subscriptions: dict[str, SubscriptionData] = attrs.field(factory=dict)
    last_update: float = 0.0

    def client_ids(self) -> list[str]:
        seen: dict[str, None] = {}
        for info in self.channels.values():
            seen.setdefault(info.client_id, None)
        return list(seen)

    def all_channels(self) -> list[Channel]:
        return list(self.channels)

    def update_channel(
        self,
        info: ClientChannelInfo,
        consume_type: ConsumeType,
        message_model: MessageModel,
        consume_from_where: ConsumeFromWhere,
        now: float,
    ) -> bool:
        """Add or refresh a member; True when it is new (membership changed)."""
        self.consume_type = consume_type
        self.message_model = message_model
        self.consume_from_where = consume_from_where
        self.last_update = now
        old = self.channels.get(info.channel)
        info.last_update = now
        if old is None:
            self.channels[info.channel] = info
            return True
        changed = old.client_id != info.client_id
        self.channels[info.channel] = info
        return changed

    def update_subscription(self, subs: Iterable[SubscriptionData], now: float) -> bool:
        """Adopt the heartbeat's subscriptions; True when the set of topics changed."""
        changed = False
        new = {s.topic: s for s in subs}
        for topic, sub in new.items():
            old = self.subscriptions.get(topic)
            if old is None:
                self.subscriptions[topic] = sub
                changed = True
            elif sub.subVersion > old.subVersion or sub != old:
                # newest heartbeat wins; a changed expression counts as a change
                if sub.subString != old.subString:
                    changed = True
                self.subscriptions[topic] = sub
        for topic in list(self.subscriptions):
            if topic not in new:
                del self.subscriptions[topic]
                changed = True
        self.last_update = now
        return changed


@attrs.define(eq=False)
class ConsumerManager:
    channel_expired_timeout: float = CHANNEL_EXPIRED_TIMEOUT
    # (group, channels to notify) -> None; called on membership/subscription changes
    on_ids_changed: Callable[[str, list[Channel]], None] | None = None
    clock: Callable[[], float] = trio.current_time
    # group name -> group info; a group is removed when its last channel leaves
    groups: dict[str, ConsumerGroupInfo] = attrs.field(factory=dict, init=False)

    def get_consumer_group_info(self, group: str) -> ConsumerGroupInfo | None:
        return self.groups.get(group)

    def find_subscription_data(self, group: str, topic: str) -> SubscriptionData | None:
        info = self.groups.get(group)
        return None if info is None else info.subscriptions.get(topic)

    def find_channel(self, group: str, client_id: str) -> ClientChannelInfo | None:
        info = self.groups.get(group)
        if info is None:
            return None
        for c in info.channels.values():
            if c.client_id == client_id:
                return c
        return None

    def _notify(self, group: str, info: ConsumerGroupInfo | None, enabled: bool) -> None:
        if enabled and self.on_ids_changed is not None and info is not None and info.channels:
            self.on_ids_changed(group, info.all_channels())

    def register_consumer(
        self,
        group: str,
        client: ClientChannelInfo,
        consume_type: ConsumeType,
        message_model: MessageModel,
        consume_from_where: ConsumeFromWhere,
        subs: Iterable[SubscriptionData],
        notify: bool = True,
    ) -> bool:
        now = self.clock()
        info = self.groups.get(group)
        if info is None:
            info = self.groups[group] = ConsumerGroupInfo(group)
        r1 = info.update_channel(client, consume_type, message_model, consume_from_where, now)
        r2 = info.update_subscription(subs, now)
        if r1 or r2:
            self._notify(group, info, notify)
        return r1 or r2

    def unregister_consumer(self, group: str, channel: Channel, notify: bool = True) -> bool:
        info = self.groups.get(group)
        if info is None or info.channels.pop(channel, None) is None:
            return False
        if not info.channels:
            del self.groups[group]
        else:
            self._notify(group, info, notify)
        return True

    def do_channel_close_event(self, channel: Channel, notify: bool = True) -> list[str]:
        """Drop ``channel`` from every group; returns the groups it left."""
        left = []
        for group, info in list(self.groups.items()):
            if info.channels.pop(channel, None) is not None:
                left.append(group)
                if not info.channels:
                    del self.groups[group]
                else:
                    self._notify(group, info, notify)
        return left

    def scan_not_active_channel(self) -> list[tuple[str, str]]:
        """Drop members silent for longer than the expiry; returns (group, clientId) dropped."""
        now = self.clock()
        dropped = []
        for group, info in list(self.groups.items()):
            stale = [
                c
                for c in info.channels.values()
                if now - c.last_update > self.channel_expired_timeout
            ]
            for c in stale:
                del info.channels[c.channel]
                dropped.append((group, c.client_id))
                log.warning("consumer %s of %s expired; dropped", c.client_id, group)
                c.channel.close()
            if not info.channels:
                del self.groups[group]
            elif stale:
                self._notify(group, info, True)
        return dropped

    def query_topic_consume_by_who(self, topic: str) -> set[str]:
        return {g for g, info in self.groups.items() if topic in info.subscriptions}


@attrs.define(eq=False)
class ProducerManager:
    channel_expired_timeout: float = CHANNEL_EXPIRED_TIMEOUT
    clock: Callable[[], float] = trio.current_time
    # group -> channel -> client
    groups: dict[str, dict[Channel, ClientChannelInfo]] = attrs.field(factory=dict, init=False)
    # client id -> its channel (ProducerManager.clientChannelTable): where a reply to a
    # request-reply producer is pushed
    client_channels: dict[str, Channel] = attrs.field(factory=dict, init=False)

    def register_producer(self, group: str, client: ClientChannelInfo) -> None:
        client.last_update = self.clock()
        self.groups.setdefault(group, {})[client.channel] = client
        self.client_channels[client.client_id] = client.channel

    def unregister_producer(self, group: str, channel: Channel) -> None:
        chans = self.groups.get(group)
        if chans is not None:
            info = chans.pop(channel, None)
            if info is not None and self.client_channels.get(info.client_id) is channel:
                del self.client_channels[info.client_id]
            if not chans:
                del self.groups[group]

    def find_channel(self, client_id: str) -> Channel | None:
        """The live connection of the producer client `client_id`, if it sent a heartbeat."""
        channel = self.client_channels.get(client_id)
        return None if channel is None or channel.closed else channel

    def do_channel_close_event(self, channel: Channel) -> None:
        for group in list(self.groups):
            self.unregister_producer(group, channel)

    def get_available_channel(self, group: str) -> Channel | None:
        """A live connection of the group, picked at random (RocketMQ
        ``ProducerManager.getAvailableChannel``: the transaction check asks one member)."""
        live = [ch for ch in self.groups.get(group, {}) if not ch.closed]
        return random.choice(live) if live else None

    def scan_not_active_channel(self) -> list[tuple[str, str]]:
        now = self.clock()
        dropped = []
        for group, chans in list(self.groups.items()):
            for ch, c in list(chans.items()):
                if now - c.last_update > self.channel_expired_timeout:
                    del chans[ch]
                    if self.client_channels.get(c.client_id) is ch:
                        del self.client_channels[c.client_id]
                    dropped.append((group, c.client_id))
                    ch.close()
            if not chans:
                del self.groups[group]
        return dropped


@attrs.define(eq=False)
class _LockEntry:
    client_id: str
    last_update: float


@attrs.define(eq=False)
class RebalanceLockManager:
    max_live_time: float = REBALANCE_LOCK_MAX_LIVE_TIME
    clock: Callable[[], float] = trio.current_time
    # group -> queue -> holder; an entry older than max_live_time is free for anyone
    _table: dict[str, dict[MessageQueue, _LockEntry]] = attrs.field(factory=dict, init=False)

    def _expired(self, e: _LockEntry, now: float) -> bool:
        return now - e.last_update > self.max_live_time

    def is_locked(self, group: str, mq: MessageQueue, client_id: str) -> bool:
        e = self._table.get(group, {}).get(mq)
        return e is not None and e.client_id == client_id and not self._expired(e, self.clock())

    def try_lock_batch(
        self, group: str, mqs: Iterable[MessageQueue], client_id: str
    ) -> list[MessageQueue]:
        """Lock (or renew) every queue that is free, expired or already ours; return those."""
        now = self.clock()
        locks = self._table.setdefault(group, {})
        ok = []
        for mq in mqs:
            e = locks.get(mq)
            if e is None or e.client_id == client_id or self._expired(e, now):
                if e is not None and e.client_id != client_id:
                    log.info(
                        "lock on %s taken over by %s from expired %s", mq, client_id, e.client_id
                    )
                locks[mq] = _LockEntry(client_id, now)
                ok.append(mq)
        return ok

    def unlock_batch(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> None:
        locks = self._table.get(group)
        if not locks:
            return
        for mq in mqs:
            e = locks.get(mq)
            if e is not None and e.client_id == client_id:
                del locks[mq]
        if not locks:
            del self._table[group]
