"""The broker's gRPC MessagingService end to end, driven by a generic gRPC client (grpcio)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
from google.protobuf.message import Message

from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import service_pb2 as spb
from tests.broker.grpc.support import GrpcClient, create_topic, grpc_broker, run_sync, start_broker

pytestmark = pytest.mark.timeout(60)


def message(topic: str, body: bytes, msg_id: str, **system: Any) -> pb.Message:
    return pb.Message(
        topic=pb.Resource(name=topic),
        body=body,
        system_properties=pb.SystemProperties(
            message_id=msg_id, body_encoding=pb.IDENTITY, **system
        ),
    )


async def test_route_send_and_message_types(tmp_path: Path) -> None:
    async with grpc_broker(tmp_path) as b:
        assert b.grpc_port
        await create_topic(b, "Plain", queues=2)
        await create_topic(b, "Fifo", queues=4, attributes="+message.type=FIFO")
        client = GrpcClient(f"127.0.0.1:{b.grpc_port}")
        try:
            route = await run_sync(
                lambda: client.unary(
                    "QueryRoute", spb.QueryRouteRequest(topic=pb.Resource(name="Plain"))
                )
            )
            assert route.status.code == pb.OK
            assert [q.id for q in route.message_queues] == [0, 1]
            q = route.message_queues[0]
            assert q.permission == pb.READ_WRITE and q.broker.id == 0
            assert q.broker.endpoints.addresses[0].port == b.grpc_port
            assert list(q.accept_message_types) == [pb.NORMAL]
            fifo = await run_sync(
                lambda: client.unary(
                    "QueryRoute", spb.QueryRouteRequest(topic=pb.Resource(name="Fifo"))
                )
            )
            assert list(fifo.message_queues[0].accept_message_types) == [pb.FIFO]
            missing = await run_sync(
                lambda: client.unary(
                    "QueryRoute", spb.QueryRouteRequest(topic=pb.Resource(name="Nope"))
                )
            )
            assert missing.status.code == pb.TOPIC_NOT_FOUND

            sent = await run_sync(
                lambda: client.unary(
                    "SendMessage",
                    spb.SendMessageRequest(
                        messages=[message("Plain", b"hello", "01ABC", tag="T", keys=["k1"])]
                    ),
                )
            )
            assert sent.status.code == pb.OK, sent
            assert len(sent.entries) == 1 and sent.entries[0].message_id == "01ABC"
            # a FIFO message to a NORMAL topic: refused as RocketMQ 5 refuses it
            wrong = await run_sync(
                lambda: client.unary(
                    "SendMessage",
                    spb.SendMessageRequest(
                        messages=[message("Plain", b"x", "01ABD", message_group="g")]
                    ),
                )
            )
            assert wrong.status.code == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
            # FIFO: one group always lands in one queue
            offsets = []
            for i in range(3):
                request = spb.SendMessageRequest(
                    messages=[message("Fifo", b"%d" % i, f"01F{i}", message_group="g1")]
                )
                r = await run_sync(partial(client.unary, "SendMessage", request))
                assert r.status.code == pb.OK
                offsets.append(r.entries[0].offset)
            assert offsets == [0, 1, 2]
            no_id = await run_sync(
                lambda: client.unary(
                    "SendMessage", spb.SendMessageRequest(messages=[message("Plain", b"x", "")])
                )
            )
            assert no_id.status.code == pb.ILLEGAL_MESSAGE_ID
            system_key = message("Plain", b"x", "01X")
            system_key.user_properties["UNIQ_KEY"] = "mine"
            refused = await run_sync(
                lambda: client.unary("SendMessage", spb.SendMessageRequest(messages=[system_key]))
            )
            assert refused.status.code == pb.ILLEGAL_MESSAGE_PROPERTY_KEY
        finally:
            client.close()


async def test_heartbeat_needs_client_id_and_telemetry_answers_settings(tmp_path: Path) -> None:
    async with grpc_broker(tmp_path) as b:
        await create_topic(b, "Tele")
        client = GrpcClient(f"127.0.0.1:{b.grpc_port}", client_id="h@1@0@x")
        try:
            hb = await run_sync(
                lambda: client.unary("Heartbeat", spb.HeartbeatRequest(client_type=pb.PRODUCER))
            )
            assert hb.status.code == pb.OK
            settings = pb.Settings(
                client_type=pb.PRODUCER,
                publishing=pb.Publishing(topics=[pb.Resource(name="Tele")]),
                user_agent=pb.UA(language=pb.PYTHON, version="5.1.2"),
            )

            def talk() -> spb.TelemetryCommand:
                responses = client.telemetry(iter([spb.TelemetryCommand(settings=settings)]))
                return next(iter(responses))

            answer = await run_sync(talk)
            assert answer.status.code == pb.OK
            assert answer.settings.publishing.max_body_size == 4 * 1024 * 1024
            assert answer.settings.backoff_policy.max_attempts == 3
            assert not answer.settings.metric.on
            # the producer is registered under a group named after its topic (PGROUP)
            assert "Tele" in b.controller.producer_manager.groups
            bye = await run_sync(
                lambda: client.unary(
                    "NotifyClientTermination", spb.NotifyClientTerminationRequest()
                )
            )
            assert bye.status.code == pb.OK
            assert "Tele" not in b.controller.producer_manager.groups
        finally:
            client.close()
        anonymous = GrpcClient(f"127.0.0.1:{b.grpc_port}", client_id="")
        try:
            hb = await run_sync(
                lambda: anonymous.unary("Heartbeat", spb.HeartbeatRequest(client_type=pb.PRODUCER))
            )
            assert hb.status.code == pb.CLIENT_ID_REQUIRED
        finally:
            anonymous.close()
        await trio.lowlevel.checkpoint()


async def test_route_names_every_master_at_its_own_grpc_endpoint(tmp_path: Path) -> None:
    """With a nameserver, any broker answers the topic's queues on every broker name, each at
    the gRPC endpoint of that name's master (the port learned from its GET_BROKER_CONFIG)."""
    from namesrv.config import NamesrvConfig
    from namesrv.service import run_namesrv

    async with trio.open_nursery() as nursery:
        ns = await nursery.start(
            run_namesrv, NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kv.json"))
        )
        addr = f"127.0.0.1:{ns.port}"
        a = await start_broker(nursery, tmp_path / "a", broker_name="broker-a", namesrv_addr=addr)
        b = await start_broker(nursery, tmp_path / "b", broker_name="broker-b", namesrv_addr=addr)
        await create_topic(a, "Both", queues=2, attributes="+message.type=MIXED")
        await create_topic(b, "Both", queues=3, attributes="+message.type=MIXED")
        client = GrpcClient(f"127.0.0.1:{b.grpc_port}")
        try:
            request = spb.QueryRouteRequest(topic=pb.Resource(name="Both"))
            with trio.fail_after(20):
                while True:
                    route = await run_sync(partial(client.unary, "QueryRoute", request))
                    names = {q.broker.name for q in route.message_queues}
                    if names == {"broker-a", "broker-b"}:
                        break
                    await trio.sleep(0.2)
            ports = {
                q.broker.name: q.broker.endpoints.addresses[0].port for q in route.message_queues
            }
            assert ports == {"broker-a": a.grpc_port, "broker-b": b.grpc_port}
            assert sorted((q.broker.name, q.id) for q in route.message_queues) == [
                ("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1), ("broker-b", 2)
            ]  # fmt: skip
            assert all(q.broker.id == 0 for q in route.message_queues)
            assert set(route.message_queues[0].accept_message_types) == {
                pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION
            }  # fmt: skip
            assignment = await run_sync(
                partial(
                    client.unary,
                    "QueryAssignment",
                    spb.QueryAssignmentRequest(
                        topic=pb.Resource(name="Both"), group=pb.Resource(name="G")
                    ),
                )
            )
            assert assignment.status.code == pb.OK
            assert sorted(
                (x.message_queue.broker.name, x.message_queue.id) for x in assignment.assignments
            ) == [("broker-a", -1), ("broker-b", -1)]
        finally:
            client.close()
        nursery.cancel_scope.cancel()


def _receive_request(topic: str, group: str, **kw: Any) -> spb.ReceiveMessageRequest:
    return spb.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=0),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        **kw,
    )


async def test_receive_ack_and_change_invisible_duration(tmp_path: Path) -> None:
    from google.protobuf.duration_pb2 import Duration

    async with grpc_broker(tmp_path) as b:
        await create_topic(b, "Pop", queues=1)
        client = GrpcClient(f"127.0.0.1:{b.grpc_port}")
        try:
            for i in range(2):
                req = spb.SendMessageRequest(
                    messages=[message("Pop", b"m%d" % i, f"01P{i}", tag="t")]
                )
                sent = await run_sync(partial(client.unary, "SendMessage", req))
                assert sent.status.code == pb.OK
            receive = _receive_request(
                "Pop",
                "G",
                batch_size=2,
                invisible_duration=Duration(seconds=20),
                long_polling_timeout=Duration(seconds=1),
            )
            answers = await run_sync(partial(client.receive, receive))
            assert answers[0].status.code == pb.OK
            assert answers[1].HasField("delivery_timestamp")
            got = [a.message for a in answers if a.HasField("message")]
            assert [m.body for m in got] == [b"m0", b"m1"]
            first, second = got
            assert first.system_properties.delivery_attempt == 1
            assert first.system_properties.tag == "t" and first.system_properties.receipt_handle
            assert first.system_properties.body_digest.type == pb.CRC32
            ack = spb.AckMessageRequest(
                group=pb.Resource(name="G"),
                topic=pb.Resource(name="Pop"),
                entries=[
                    spb.AckMessageEntry(
                        message_id=first.system_properties.message_id,
                        receipt_handle=first.system_properties.receipt_handle,
                    )
                ],
            )
            acked = await run_sync(partial(client.unary, "AckMessage", ack))
            assert acked.status.code == pb.OK and acked.entries[0].status.code == pb.OK
            again = await run_sync(partial(client.unary, "AckMessage", ack))
            assert again.entries[0].status.code == pb.INVALID_RECEIPT_HANDLE
            change = spb.ChangeInvisibleDurationRequest(
                group=pb.Resource(name="G"),
                topic=pb.Resource(name="Pop"),
                receipt_handle=second.system_properties.receipt_handle,
                invisible_duration=Duration(seconds=0),
                message_id=second.system_properties.message_id,
            )
            changed = await run_sync(partial(client.unary, "ChangeInvisibleDuration", change))
            assert changed.status.code == pb.OK and changed.receipt_handle
            # visible again at once: the next receive has it, its delivery attempt 2
            with trio.fail_after(20):
                while True:
                    answers = await run_sync(partial(client.receive, receive))
                    again_got = [a.message for a in answers if a.HasField("message")]
                    if again_got:
                        break
            assert [m.body for m in again_got] == [b"m1"]
            assert again_got[0].system_properties.delivery_attempt == 2
            # nothing more: a long poll answers MESSAGE_NOT_FOUND, not an error
            ack2 = spb.AckMessageRequest(
                group=pb.Resource(name="G"),
                topic=pb.Resource(name="Pop"),
                entries=[
                    spb.AckMessageEntry(
                        message_id=again_got[0].system_properties.message_id,
                        receipt_handle=again_got[0].system_properties.receipt_handle,
                    )
                ],
            )
            assert (await run_sync(partial(client.unary, "AckMessage", ack2))).status.code == pb.OK
            empty = await run_sync(partial(client.receive, receive))
            assert [a.status.code for a in empty] == [pb.MESSAGE_NOT_FOUND]
            bad = _receive_request("Pop", "G", invisible_duration=Duration(seconds=1))
            refused = await run_sync(partial(client.receive, bad))
            assert [a.status.code for a in refused] == [pb.ILLEGAL_INVISIBLE_TIME]
        finally:
            client.close()


async def test_telemetry_carries_server_commands_and_the_client_answers(tmp_path: Path) -> None:
    import queue

    async with grpc_broker(tmp_path) as b:
        client = GrpcClient(f"127.0.0.1:{b.grpc_port}", client_id="tele@1")
        outgoing: queue.Queue[spb.TelemetryCommand | None] = queue.Queue()

        def commands() -> Any:
            while (cmd := outgoing.get()) is not None:
                yield cmd

        settings = pb.Settings(
            client_type=pb.SIMPLE_CONSUMER,
            subscription=pb.Subscription(group=pb.Resource(name="TG")),
        )
        outgoing.put(spb.TelemetryCommand(settings=settings))
        stream = client.telemetry(commands(), timeout=30)
        first = await run_sync(partial(next, stream))
        assert first.status.code == pb.OK
        assert first.settings.subscription.receive_batch_size == 32
        assert first.settings.backoff_policy.max_attempts == 17
        assert len(first.settings.backoff_policy.customized_backoff.next) == 18
        outgoing.put(None)
        client.close()

        # a command of ours (PrintThreadStackTrace) reaches the client's stream and its answer,
        # matched by nonce, comes back to the asker
        from broker.grpc.client_manager import GrpcClientManager
        from broker.grpc.local_broker import LocalBroker
        from common.grpc.service import CallContext, Send
        from common.remoting.server import RequestDispatcher

        manager = GrpcClientManager(LocalBroker(b.controller, RequestDispatcher()))
        ctx = CallContext(path="", metadata={"x-mq-client-id": "c"}, peer="p", connection_id=1)
        channel = manager.channel(ctx)

        async def ignore(cmd: Message) -> None:
            pass

        async def client_answers(cmd: spb.TelemetryCommand) -> None:
            nonce = cmd.print_thread_stack_trace_command.nonce
            answer = spb.TelemetryCommand(
                thread_stack_trace=spb.ThreadStackTrace(nonce=nonce, thread_stack_trace="stack")
            )
            await manager._on_command(channel, answer, Send(ignore))

        channel.telemetry = client_answers
        ask = spb.TelemetryCommand(
            print_thread_stack_trace_command=spb.PrintThreadStackTraceCommand()
        )
        answer = await manager.ask("c", ask)
        assert answer is not None and answer.thread_stack_trace.thread_stack_trace == "stack"
        assert await manager.ask("nobody", ask) is None


async def test_auto_renew_keeps_a_held_message_invisible_and_the_first_handle_acks(
    tmp_path: Path,
) -> None:
    from google.protobuf.duration_pb2 import Duration

    from broker.grpc.client_manager import GrpcClientManager
    from broker.grpc.consumer import ConsumerActivity
    from broker.grpc.local_broker import LocalBroker
    from common.grpc.service import CallContext, Send
    from common.remoting.server import RequestDispatcher

    async with grpc_broker(tmp_path) as b:
        await create_topic(b, "Renew", queues=1)
        client = GrpcClient(f"127.0.0.1:{b.grpc_port}")
        req = spb.SendMessageRequest(messages=[message("Renew", b"held", "01R0")])
        assert (await run_sync(partial(client.unary, "SendMessage", req))).status.code == pb.OK
        client.close()

        local = LocalBroker(b.controller, RequestDispatcher(), b.controller.pop)
        consumer = ConsumerActivity(local, GrpcClientManager(local))
        assert consumer.renewal is not None
        consumer.default_invisible_ms = 2000
        # renewed 1.5-1.4 s before the invisible time ends (scans 0.1 s apart): a loaded host
        # may stall the renewal that long before the message shows again (the store's clock)
        consumer.renewal.renew_ahead_ms = 1500
        consumer.renewal.scan_interval = 0.1
        consumer.renewal.renew_invisible_ms = 2000
        ctx = CallContext(path="", metadata={"x-mq-client-id": "push@1"}, peer="p", connection_id=1)
        receive = _receive_request(
            "Renew", "RG", batch_size=1, auto_renew=True, long_polling_timeout=Duration(seconds=1)
        )

        async def received(receive: spb.ReceiveMessageRequest = receive) -> list[pb.Message]:
            got: list[spb.ReceiveMessageResponse] = []

            async def collect(m: Message) -> None:
                assert isinstance(m, spb.ReceiveMessageResponse)
                got.append(m)

            await consumer.receive_message(receive, ctx, Send(collect))
            return [r.message for r in got if r.HasField("message")]

        [held] = await received()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer.renewal.run)
            # three invisible times go by; renewed, the message is never served again
            peek = _receive_request("Renew", "RG", batch_size=1, auto_renew=True)
            for _ in range(3):
                await trio.sleep(2)
                assert await received(peek) == []
            ack = spb.AckMessageRequest(
                group=pb.Resource(name="RG"),
                topic=pb.Resource(name="Renew"),
                entries=[
                    spb.AckMessageEntry(
                        message_id=held.system_properties.message_id,
                        receipt_handle=held.system_properties.receipt_handle,
                    )
                ],
            )
            acked = await consumer.ack_message(ack, ctx)
            assert acked.status.code == pb.OK, acked
            assert not consumer.renewal.held
            nursery.cancel_scope.cancel()
