"""Renewing the invisible time of messages a push consumer holds (``auto_renew``).

A 5.x PushConsumer receives with ``auto_renew=true`` and no invisible duration: the server keeps
the messages invisible for as long as the client holds them (RocketMQ 5's proxy,
``ReceiptHandleProcessor`` / ``DefaultReceiptHandleManager``). Each such message is recorded
under (client id, group, message id) with its current receipt handle; a task renews every
record whose invisible time ends within ``RENEW_AHEAD_MS`` by changing it again to
``RENEW_INVISIBLE_MS``, which gives a new handle that replaces the recorded one. When the
client acks, changes the invisible duration or forwards the message to the DLQ with the handle
it was given, :meth:`ReceiptRenewal.take` hands the activity the current handle instead (and
forgets the record). Renewal stops after ``MAX_RENEW_MS`` (the message then comes back, as an
abandoned one must), when the client terminates or its telemetry stream is gone for good (the
record is dropped and the message comes back at its last invisible time), and at most
``MAX_RECORDS`` are held (past that, messages are served without renewal).
"""

from __future__ import annotations

import logging

import attrs
import trio

from broker.pop.api import AckStatus, PopService

log = logging.getLogger(__name__)

RENEW_AHEAD_MS = 10_000
RENEW_INVISIBLE_MS = 60_000
MAX_RENEW_MS = 3 * 3600 * 1000
MAX_RECORDS = 100_000
SCAN_INTERVAL = 1.0


@attrs.define
class _Held:
    group: str
    topic: str
    handle: str
    # trio time (s) when the current invisible time ends, and when the message was received
    expires: float
    received: float


Key = tuple[str, str, str]  # client id, group, message id


@attrs.define(eq=False)
class ReceiptRenewal:
    pop: PopService
    held: dict[Key, _Held] = attrs.field(factory=dict)
    renew_ahead_ms: int = RENEW_AHEAD_MS
    renew_invisible_ms: int = RENEW_INVISIBLE_MS
    max_renew_ms: int = MAX_RENEW_MS
    # seconds between scans: a record is renewed between renew_ahead_ms and renew_ahead_ms
    # minus this before its invisible time ends
    scan_interval: float = SCAN_INTERVAL

    def add(
        self,
        client_id: str,
        group: str,
        topic: str,
        message_id: str,
        handle: str,
        invisible_ms: int,
    ) -> None:
        if len(self.held) >= MAX_RECORDS:
            return
        now = trio.current_time()
        self.held[(client_id, group, message_id)] = _Held(
            group, topic, handle, now + invisible_ms / 1000, now
        )

    def take(self, client_id: str, group: str, message_id: str, handle: str) -> str:
        """The handle to use for the client's ack/change/forward of a message (module doc)."""
        record = self.held.pop((client_id, group, message_id), None)
        return record.handle if record is not None else handle

    def forget_client(self, client_id: str) -> None:
        for key in [k for k in self.held if k[0] == client_id]:
            del self.held[key]

    async def renew_due(self) -> None:
        now = trio.current_time()
        for key, record in list(self.held.items()):
            if record.expires - now > self.renew_ahead_ms / 1000:
                continue
            if (now - record.received) * 1000 >= self.max_renew_ms:
                self.held.pop(key, None)
                continue
            result = await self.pop.change_invisible_time(
                record.group, record.topic, record.handle, self.renew_invisible_ms
            )
            if self.held.get(key) is not record:
                continue  # the client acked it meanwhile
            if result.status is AckStatus.OK:
                record.handle = result.receipt_handle
                record.expires = trio.current_time() + self.renew_invisible_ms / 1000
            else:
                # acked, revived or refused: nothing left to renew
                self.held.pop(key, None)

    async def run(self) -> None:
        while True:
            await trio.sleep(self.scan_interval)
            try:
                await self.renew_due()
            except Exception:
                log.exception("renewing held receipt handles failed")
