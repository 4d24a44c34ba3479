"""What the gRPC activities reach of the broker they run in (RocketMQ 5's "local" proxy mode).

RocketMQ 5's proxy in local mode calls the broker's own processors with remoting commands it
builds (``LocalMessageService``); we do the same through the broker's
:class:`~common.remoting.server.RequestDispatcher` (``dispatch_guarded``: the ACL guard judges
4.x requests only), so a 5.x send is checked, stored, replicated and answered exactly as a 4.x
send is. Pop consumption is called directly (``broker/pop/api.py``).
"""

from __future__ import annotations

import attrs

from broker.controller import BrokerController
from broker.grpc.client_channel import GrpcClientChannel
from broker.grpc.cluster_route import ClusterRoute
from broker.pop.api import PopService
from common.grpc.v2 import definition_pb2 as pb
from common.remoting.codes import ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.server import RequestDispatcher


@attrs.define(eq=False)
class LocalBroker:
    controller: BrokerController
    dispatcher: RequestDispatcher
    pop: PopService | None = None
    # the cluster's route with every master's gRPC endpoint; None: this broker alone
    cluster: ClusterRoute | None = None
    # this broker's gRPC endpoint as clients reach it (host = brokerIP1); set once bound
    host: str = "127.0.0.1"
    port: int = 0

    @property
    def endpoints(self) -> pb.Endpoints:
        return pb.Endpoints(
            scheme=pb.IPv6 if ":" in self.host else pb.IPv4,
            addresses=[pb.Address(host=self.host, port=self.port)],
        )

    @property
    def broker_name(self) -> str:
        return self.controller.config.broker_name

    async def call(self, cmd: RemotingCommand, channel: GrpcClientChannel) -> RemotingCommand:
        """Run a 4.x request through the broker's processors; a oneway-style None answer (an
        END_TRANSACTION that leaves the state unknown) reads as SUCCESS."""
        answer = await self.dispatcher.dispatch_guarded(cmd, channel)
        return answer if answer is not None else cmd.response(ResponseCode.SUCCESS)
