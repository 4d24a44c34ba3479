"""QueryRoute and QueryAssignment: which queues a 5.x client uses, and where it reaches them.

**Decision (endpoints).** RocketMQ 5's proxy answers a topic's whole route, every broker's
queues, each with the endpoints of the proxy that serves that broker; in local mode that is the
broker's own address. We serve the local mode only, so a broker answers *its own* queues with
*its own* gRPC endpoint (brokerIP1 : the bound gRPC port): a client reaches every queue it is
told of at the node that stores it, with no forwarding between brokers. A client of a
multi-broker cluster lists every broker's gRPC endpoint as its access point (the 5.x clients
take several, ``host1:8081;host2:8082``); each QueryRoute then answers the queues of whichever
broker it reached, which the client refreshes every 30 s. The client only sends to and
receives from queues whose broker id is 0, so a slave answers its queues under its own broker
id: a client that asked a slave uses none of them (TOPIC_NOT_FOUND would make it fail
outright; an empty list of writable queues makes it retry the next access point).

Queue permissions follow the 4.x topic config: queue i is readable when i < readQueueNums and
the topic and broker are readable, writable likewise (``QueryRouteActivity
.genMessageQueueFromQueueData``); ``accept_message_types`` comes from the topic's
``message.type`` attribute (common/topic_message_type.py).

QueryAssignment (push consumers): one assignment per broker with queue id -1 (pop from any
queue of the broker), or, for a group that consumes orderly (FIFO), one per readable queue, as
``QueryAssignmentActivity`` hands them out.
"""

from __future__ import annotations

from broker.grpc.converter import PB_MESSAGE_TYPE, resource, wrap_namespace
from broker.grpc.local_broker import LocalBroker
from broker.grpc.status import OK, status
from common.grpc.service import CallContext
from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import service_pb2 as spb
from common.model import PermName, TopicConfig
from common.topic_message_type import topic_message_type


def _permission(readable: bool, writable: bool) -> pb.Permission:
    if readable and writable:
        return pb.READ_WRITE
    if readable:
        return pb.READ
    if writable:
        return pb.WRITE
    return pb.NONE


class RouteActivity:
    def __init__(self, local: LocalBroker) -> None:
        self.local = local

    def _broker(self) -> pb.Broker:
        b = self.local.controller
        return pb.Broker(name=b.config.broker_name, id=b.broker_id, endpoints=self.local.endpoints)

    def queues(self, tc: TopicConfig, namespace: str = "") -> list[pb.MessageQueue]:
        b = self.local.controller
        broker = self._broker()
        accepted = [PB_MESSAGE_TYPE[t] for t in topic_message_type(tc.attributes or {}).accepted]
        perm = tc.perm & b.config.broker_permission
        topic = resource(tc.topicName, namespace)
        out = []
        for qid in range(max(tc.readQueueNums, tc.writeQueueNums)):
            readable = qid < tc.readQueueNums and PermName.is_readable(perm)
            writable = qid < tc.writeQueueNums and PermName.is_writeable(perm)
            out.append(
                pb.MessageQueue(
                    topic=topic,
                    id=qid,
                    permission=_permission(readable, writable),
                    broker=broker,
                    accept_message_types=accepted,
                )
            )
        return out

    def _topic(self, res: pb.Resource) -> TopicConfig | None:
        return self.local.controller.topic_config_manager.select_topic_config(wrap_namespace(res))

    async def query_route(
        self, req: spb.QueryRouteRequest, ctx: CallContext
    ) -> spb.QueryRouteResponse:
        if not req.topic.name:
            return spb.QueryRouteResponse(status=status(pb.ILLEGAL_TOPIC, "topic name is empty"))
        tc = self._topic(req.topic)
        if tc is None:
            return spb.QueryRouteResponse(
                status=status(pb.TOPIC_NOT_FOUND, f"topic {req.topic.name} not found")
            )
        return spb.QueryRouteResponse(
            status=OK, message_queues=self.queues(tc, req.topic.resource_namespace)
        )

    async def query_assignment(
        self, req: spb.QueryAssignmentRequest, ctx: CallContext
    ) -> spb.QueryAssignmentResponse:
        tc = self._topic(req.topic)
        if tc is None:
            return spb.QueryAssignmentResponse(
                status=status(pb.TOPIC_NOT_FOUND, f"topic {req.topic.name} not found")
            )
        b = self.local.controller
        group = wrap_namespace(req.group)
        cfg = b.subscription_group_manager.find_subscription_group_config(group)
        if cfg is None:
            return spb.QueryAssignmentResponse(
                status=status(pb.CONSUMER_GROUP_NOT_FOUND, f"group {req.group.name} not found")
            )
        readable = [
            q
            for q in self.queues(tc, req.topic.resource_namespace)
            if q.permission in (pb.READ, pb.READ_WRITE)
        ]
        if b.broker_id != 0 or not readable:
            return spb.QueryAssignmentResponse(status=OK)
        if cfg.consumeMessageOrderly:
            chosen = readable
        else:
            any_queue = pb.MessageQueue()
            any_queue.CopyFrom(readable[0])
            any_queue.id = -1
            any_queue.permission = pb.READ_WRITE
            chosen = [any_queue]
        return spb.QueryAssignmentResponse(
            status=OK, assignments=[pb.Assignment(message_queue=q) for q in chosen]
        )
