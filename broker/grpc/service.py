"""The broker's gRPC endpoint: RocketMQ 5's ``apache.rocketmq.v2.MessagingService``.

Theory of operation
-------------------
RocketMQ 5 puts a proxy in front of its brokers to speak gRPC to 5.x clients, or runs that proxy
inside the broker ("local" mode). We do the latter: ``run_grpc_service`` binds
``grpcServerPort`` (8081 as RocketMQ's proxy; an ephemeral port in tests) beside the remoting
port, in the broker's nursery, and serves the method table below over the gRPC transport of
``common/grpc`` (HTTP/2 on Trio). The activities, one module per RocketMQ 5 activity group:

* route.py: QueryRoute, QueryAssignment (which queues, at which endpoint);
* client_manager.py: Heartbeat, Telemetry, NotifyClientTermination (clients, settings,
  check-backs pushed over telemetry);
* producer.py: SendMessage, EndTransaction, through the broker's own 4.x send and end
  processors (local_broker.py), so they share every check, the store and the replication;
* consumer.py: ReceiveMessage, AckMessage, ChangeInvisibleDuration,
  ForwardMessageToDeadLetterQueue over pop (``broker/pop``);
* offsets.py: GetOffset, QueryOffset, UpdateOffset, PullMessage.

Every outcome a client should act on is a ``Status`` in the response (gRPC status OK), as the
proxy answers; gRPC statuses other than OK only come from the transport (unknown method,
deadline, oversized or malformed messages) or from a bug (INTERNAL, logged). Methods the
clients of this version do not call (RecallMessage, SyncLiteSubscription) answer UNIMPLEMENTED.
"""

from __future__ import annotations

import logging

import attrs
import trio

from broker.controller import BrokerController
from broker.grpc.auth import guard_services
from broker.grpc.client_manager import GrpcClientManager
from broker.grpc.cluster_route import ClusterRoute
from broker.grpc.consumer import ConsumerActivity
from broker.grpc.local_broker import LocalBroker
from broker.grpc.master_pop import MasterPop
from broker.grpc.offsets import OffsetActivity
from broker.grpc.producer import ProducerActivity
from broker.grpc.route import RouteActivity
from broker.pop.api import PopService
from common.grpc.limits import GrpcServerLimits
from common.grpc.server import GrpcServerHandle, serve_grpc
from common.grpc.service import Method, ServiceTable, bidi_streaming, server_streaming, unary
from common.grpc.v2 import method_path
from common.grpc.v2 import service_pb2 as spb
from common.remoting.client import RemotingClient
from common.remoting.network import TCP, Network
from common.remoting.server import RequestDispatcher
from common.tls import PLAIN, TlsPolicy

log = logging.getLogger(__name__)

SWEEP_INTERVAL = 10.0


class MessagingService:
    def __init__(self, local: LocalBroker) -> None:
        self.local = local
        self.clients = GrpcClientManager(local)
        self.route = RouteActivity(local)
        self.producer = ProducerActivity(local, self.clients)
        self.consumer = ConsumerActivity(local, self.clients)
        self.offsets = OffsetActivity(local, self.clients)

    def table(self) -> ServiceTable:
        methods: dict[str, Method] = {
            "QueryRoute": unary(spb.QueryRouteRequest, self.route.query_route),
            "Heartbeat": unary(spb.HeartbeatRequest, self.clients.heartbeat),
            "SendMessage": unary(spb.SendMessageRequest, self.producer.send_message),
            "QueryAssignment": unary(spb.QueryAssignmentRequest, self.route.query_assignment),
            "ReceiveMessage": server_streaming(
                spb.ReceiveMessageRequest, self.consumer.receive_message
            ),
            "AckMessage": unary(spb.AckMessageRequest, self.consumer.ack_message),
            "ForwardMessageToDeadLetterQueue": unary(
                spb.ForwardMessageToDeadLetterQueueRequest,
                self.consumer.forward_message_to_dead_letter_queue,
            ),
            "PullMessage": server_streaming(spb.PullMessageRequest, self.offsets.pull_message),
            "UpdateOffset": unary(spb.UpdateOffsetRequest, self.offsets.update_offset),
            "GetOffset": unary(spb.GetOffsetRequest, self.offsets.get_offset),
            "QueryOffset": unary(spb.QueryOffsetRequest, self.offsets.query_offset),
            "EndTransaction": unary(spb.EndTransactionRequest, self.producer.end_transaction),
            "Telemetry": bidi_streaming(spb.TelemetryCommand, self.clients.telemetry),
            "NotifyClientTermination": unary(
                spb.NotifyClientTerminationRequest, self.clients.notify_client_termination
            ),
            "ChangeInvisibleDuration": unary(
                spb.ChangeInvisibleDurationRequest, self.consumer.change_invisible_duration
            ),
        }
        return {method_path(name): method for name, method in methods.items()}

    async def sweep_clients(self) -> None:
        while True:
            await trio.sleep(SWEEP_INTERVAL)
            self.clients.sweep()
            renewal = self.consumer.renewal
            if renewal is not None:
                live = set(self.clients.channels)
                for client_id in {k[0] for k in renewal.held} - live:
                    renewal.forget_client(client_id)


async def run_grpc_service(
    controller: BrokerController,
    dispatcher: RequestDispatcher,
    pop: PopService | None,
    *,
    remoting: RemotingClient | None = None,
    host: str,
    port: int,
    network: Network = TCP,
    limits: GrpcServerLimits | None = None,
    tls: TlsPolicy = PLAIN,
    task_status: trio.TaskStatus[GrpcServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the MessagingService on ``host:port`` until cancelled; reports the bound port."""
    if pop is not None and remoting is not None:
        # a slave's endpoint serves pop from the master, as RocketMQ 5's proxy routes it
        pop = MasterPop(pop, controller, remoting)
    local = LocalBroker(controller, dispatcher, pop, host=controller.config.broker_ip1)
    if remoting is not None and controller.config.namesrv_addrs:
        local.cluster = ClusterRoute(remoting, controller.config.namesrv_addrs)
    service = MessagingService(local)
    table = service.table()
    if controller.acl is not None:
        # aclEnable: every call judged by the same plain_acl.yml as the remoting port (auth.py)
        table = guard_services(table, controller.acl)
    async with trio.open_nursery() as nursery:
        handle: GrpcServerHandle = await nursery.start(
            lambda task_status: serve_grpc(
                table,
                host,
                port,
                network=network,
                limits=limits,
                tls=tls,
                task_status=task_status,
            )
        )
        local.port = handle.port
        if controller.config.grpc_server_port != handle.port:
            # an ephemeral port: GET_BROKER_CONFIG reports the bound one (cluster_route.py)
            controller.config = attrs.evolve(controller.config, grpc_server_port=handle.port)
        nursery.start_soon(service.sweep_clients)
        if service.consumer.renewal is not None:
            nursery.start_soon(service.consumer.renewal.run)
        log.info("gRPC MessagingService on %s:%d", host, handle.port)
        task_status.started(handle)
