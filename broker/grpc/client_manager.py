"""5.x clients: Heartbeat, Telemetry (settings, check-backs, client answers) and termination.

RocketMQ 5's ``ClientActivity`` (``proxy/.../grpc/v2/client``) in our terms:

* every call names its client by the ``x-mq-client-id`` header; a call without it answers
  CLIENT_ID_REQUIRED. Each client id has one :class:`GrpcClientChannel` (client_channel.py);
* **Telemetry** is the client's long-lived bidirectional stream. The client writes its
  ``Settings`` (again every 5 minutes); we keep them, register the client (a producer under a
  producer group named after each topic it publishes to, as the proxy does, so the transaction
  check of a half message finds it by PGROUP = topic; a consumer in its group with its
  subscriptions) and answer ``TelemetryCommand{status OK, settings}`` merged as the proxy's
  ``GrpcClientSettingsManager`` does: for producers the backoff policy (3 attempts, exponential
  10 ms .. 1 s, x2), ``publishing.max_body_size`` (the broker's maxMessageSize) and
  ``validate_message_type``; for consumers ``receive_batch_size`` 32, ``long_polling_timeout``
  20 s, ``fifo`` from the group's consumeMessageOrderly and a customized backoff of the 4.x
  delay levels with ``max_attempts`` = retryMaxTimes + 1; ``metric.on`` false. The server
  pushes ``RecoverOrphanedTransactionCommand`` on this stream (client_channel.py) and may ask
  ``PrintThreadStackTrace`` / ``VerifyMessage``, whose answers (``ThreadStackTrace``,
  ``VerifyMessageResult``) come back on it and are handed to whoever asked, by nonce;
* **Heartbeat** refreshes the registration (the managers drop a client silent for 120 s);
* **NotifyClientTermination** unregisters it at once.

Memory: one channel per client id; a channel with no telemetry stream that has not been seen for
``CLIENT_EXPIRY`` is dropped by :meth:`GrpcClientManager.sweep`, as are the managers' entries.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

import trio

from broker.consumer_manager import ClientChannelInfo
from broker.grpc.client_channel import GrpcClientChannel
from broker.grpc.converter import duration_of_ms, wrap_namespace
from broker.grpc.local_broker import LocalBroker
from broker.grpc.status import OK, ActivityError, status
from broker.subscription import build_subscription_data
from common.grpc.service import CallContext, Send
from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import service_pb2 as spb
from common.model import ConsumeFromWhere, ConsumeType, MessageModel, SubscriptionData

log = logging.getLogger(__name__)

CLIENT_EXPIRY = 120.0
# RocketMQ 5 ProxyConfig defaults
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_MS = 10
PRODUCER_BACKOFF_MAX_MS = 1000
PRODUCER_BACKOFF_MULTIPLIER = 2.0
CONSUMER_BATCH_SIZE = 32
CONSUMER_LONG_POLLING_MS = 20_000
# CustomizedRetryPolicy's default: the 4.x delay levels from 1 s on (ms)
RETRY_DELAYS_MS = (
    1_000,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    180_000,
    240_000,
    300_000,
    360_000,
    420_000,
    480_000,
    540_000,
    600_000,
    1_200_000,
    1_800_000,
    3_600_000,
    7_200_000,
)
_LANGUAGE = {
    pb.JAVA: "JAVA",
    pb.CPP: "CPP",
    pb.DOT_NET: "DOTNET",
    pb.GOLANG: "GO",
    pb.RUST: "RUST",
    pb.PYTHON: "PYTHON",
    pb.PHP: "PHP",
    pb.NODE_JS: "NODE_JS",
    pb.RUBY: "RUBY",
    pb.OBJECTIVE_C: "OBJECTIVE_C",
    pb.DART: "DART",
    pb.KOTLIN: "KOTLIN",
}


def client_id_of(ctx: CallContext) -> str:
    client_id = ctx.metadata.get("x-mq-client-id", "")
    if not client_id:
        raise ActivityError(pb.CLIENT_ID_REQUIRED, "client id is required")
    return client_id


class GrpcClientManager:
    def __init__(self, local: LocalBroker) -> None:
        self.local = local
        self.channels: dict[str, GrpcClientChannel] = {}
        # nonce -> where the client's answer to a command of ours goes
        self._answers: dict[str, trio.MemorySendChannel[spb.TelemetryCommand]] = {}

    def channel(self, ctx: CallContext) -> GrpcClientChannel:
        client_id = client_id_of(ctx)
        channel = self.channels.get(client_id)
        if channel is None:
            namespace = ctx.metadata.get("x-mq-namespace", "")
            channel = GrpcClientChannel(client_id, ctx.peer, namespace)
            self.channels[client_id] = channel
        channel.last_seen = trio.current_time()
        return channel

    # --- registration ------------------------------------------------------------------------

    def _register(self, channel: GrpcClientChannel) -> None:
        settings = channel.settings
        if settings is None:
            return
        b = self.local.controller
        language = _LANGUAGE.get(settings.user_agent.language, "OTHER")
        if settings.HasField("publishing"):
            for topic in settings.publishing.topics:
                group = wrap_namespace(topic)
                info = ClientChannelInfo(channel, channel.client_id, language)
                b.producer_manager.register_producer(group, info)
                channel.producer_groups.add(group)
        if settings.HasField("subscription") and settings.subscription.group.name:
            group = wrap_namespace(settings.subscription.group)
            subs = [_subscription_data(s) for s in settings.subscription.subscriptions]
            push = settings.client_type == pb.PUSH_CONSUMER
            b.consumer_manager.register_consumer(
                group,
                ClientChannelInfo(channel, channel.client_id, language),
                ConsumeType.CONSUME_PASSIVELY if push else ConsumeType.CONSUME_ACTIVELY,
                MessageModel.CLUSTERING,
                ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                subs,
            )
            channel.consumer_group = group

    def _unregister(self, channel: GrpcClientChannel) -> None:
        b = self.local.controller
        for group in channel.producer_groups:
            b.producer_manager.unregister_producer(group, channel)
        channel.producer_groups.clear()
        if channel.consumer_group is not None:
            b.consumer_manager.unregister_consumer(channel.consumer_group, channel)
            channel.consumer_group = None

    def sweep(self) -> None:
        """Drop clients gone quiet (no telemetry stream, no call for CLIENT_EXPIRY)."""
        cutoff = trio.current_time() - CLIENT_EXPIRY
        for client_id, channel in list(self.channels.items()):
            if channel.telemetry is None and channel.last_seen < cutoff:
                self._forget(client_id, channel)

    def _forget(self, client_id: str, channel: GrpcClientChannel) -> None:
        self._unregister(channel)
        channel.close()
        self.channels.pop(client_id, None)

    # --- settings ----------------------------------------------------------------------------

    def merged_settings(self, settings: pb.Settings) -> pb.Settings:
        """The settings the server answers with (GrpcClientSettingsManager; module doc)."""
        merged = pb.Settings()
        merged.CopyFrom(settings)
        b = self.local.controller
        if settings.HasField("publishing"):
            merged.backoff_policy.Clear()
            merged.backoff_policy.max_attempts = PRODUCER_MAX_ATTEMPTS
            merged.backoff_policy.exponential_backoff.CopyFrom(
                pb.ExponentialBackoff(
                    initial=duration_of_ms(PRODUCER_BACKOFF_INITIAL_MS),
                    max=duration_of_ms(PRODUCER_BACKOFF_MAX_MS),
                    multiplier=PRODUCER_BACKOFF_MULTIPLIER,
                )
            )
            merged.publishing.validate_message_type = True
            merged.publishing.max_body_size = b.config.store.max_message_size
        elif settings.HasField("subscription"):
            group = wrap_namespace(settings.subscription.group)
            cfg = b.subscription_group_manager.find_subscription_group_config(group)
            sub = merged.subscription
            sub.receive_batch_size = CONSUMER_BATCH_SIZE
            sub.long_polling_timeout.CopyFrom(duration_of_ms(CONSUMER_LONG_POLLING_MS))
            sub.fifo = cfg is not None and cfg.consumeMessageOrderly
            merged.backoff_policy.Clear()
            merged.backoff_policy.max_attempts = (cfg.retryMaxTimes if cfg else 16) + 1
            merged.backoff_policy.customized_backoff.CopyFrom(
                pb.CustomizedBackoff(next=[duration_of_ms(ms) for ms in RETRY_DELAYS_MS])
            )
        merged.metric.Clear()
        merged.metric.on = False
        return merged

    # --- activities --------------------------------------------------------------------------

    async def heartbeat(self, req: spb.HeartbeatRequest, ctx: CallContext) -> spb.HeartbeatResponse:
        try:
            channel = self.channel(ctx)
        except ActivityError as exc:
            return spb.HeartbeatResponse(status=exc.status)
        if req.client_type == pb.CLIENT_TYPE_UNSPECIFIED:
            return spb.HeartbeatResponse(
                status=status(pb.UNRECOGNIZED_CLIENT_TYPE, "unrecognized client type")
            )
        self._register(channel)
        return spb.HeartbeatResponse(status=OK)

    async def notify_client_termination(
        self, req: spb.NotifyClientTerminationRequest, ctx: CallContext
    ) -> spb.NotifyClientTerminationResponse:
        client_id = ctx.metadata.get("x-mq-client-id", "")
        if not client_id:
            return spb.NotifyClientTerminationResponse(
                status=status(pb.CLIENT_ID_REQUIRED, "client id is required")
            )
        channel = self.channels.get(client_id)
        if channel is not None:
            self._forget(client_id, channel)
        return spb.NotifyClientTerminationResponse(status=OK)

    async def telemetry(
        self,
        requests: AsyncIterator[spb.TelemetryCommand],
        ctx: CallContext,
        send: Send[spb.TelemetryCommand],
    ) -> None:
        try:
            channel = self.channel(ctx)
        except ActivityError as exc:
            await send(spb.TelemetryCommand(status=exc.status))
            return
        channel.telemetry = send
        try:
            async for command in requests:
                channel.last_seen = trio.current_time()
                await self._on_command(channel, command, send)
        finally:
            if channel.telemetry is send:
                channel.telemetry = None

    async def _on_command(
        self,
        channel: GrpcClientChannel,
        command: spb.TelemetryCommand,
        send: Send[spb.TelemetryCommand],
    ) -> None:
        kind = command.WhichOneof("command")
        if kind == "settings":
            channel.settings = command.settings
            self._register(channel)
            await send(
                spb.TelemetryCommand(status=OK, settings=self.merged_settings(command.settings))
            )
        elif kind == "thread_stack_trace":
            self._answer(command.thread_stack_trace.nonce, command)
        elif kind == "verify_message_result":
            self._answer(command.verify_message_result.nonce, command)
        else:
            await send(
                spb.TelemetryCommand(
                    status=status(pb.NOT_IMPLEMENTED, f"command {kind} is not supported")
                )
            )

    def _answer(self, nonce: str, command: spb.TelemetryCommand) -> None:
        waiter = self._answers.pop(nonce, None)
        if waiter is not None:
            try:
                waiter.send_nowait(command)
            except (trio.WouldBlock, trio.BrokenResourceError):
                pass

    async def ask(
        self, client_id: str, command: spb.TelemetryCommand, *, timeout: float = 3.0
    ) -> spb.TelemetryCommand | None:
        """Send a PrintThreadStackTrace / VerifyMessage command (its nonce is set here) and wait
        for the client's answer; None when it has no stream or does not answer in time."""
        channel = self.channels.get(client_id)
        if channel is None or channel.telemetry is None:
            return None
        nonce = uuid.uuid4().hex
        kind = command.WhichOneof("command")
        if kind == "print_thread_stack_trace_command":
            command.print_thread_stack_trace_command.nonce = nonce
        elif kind == "verify_message_command":
            command.verify_message_command.nonce = nonce
        else:
            raise ValueError(f"not a command a client answers: {kind}")
        send, receive = trio.open_memory_channel[spb.TelemetryCommand](1)
        self._answers[nonce] = send
        try:
            with trio.move_on_after(timeout):
                await channel.telemetry(command)
                return await receive.receive()
            return None
        finally:
            self._answers.pop(nonce, None)


def _subscription_data(entry: pb.SubscriptionEntry) -> SubscriptionData:
    expression = entry.expression.expression or "*"
    topic = wrap_namespace(entry.topic)
    if entry.expression.type == pb.SQL:
        return SubscriptionData(topic=topic, subString=expression, expressionType="SQL92")
    try:
        return build_subscription_data(topic, expression)
    except ValueError:
        return SubscriptionData(topic=topic, subString=expression)
