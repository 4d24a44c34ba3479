"""QueryRoute and QueryAssignment: which queues a 5.x client uses, and where it reaches them.

**Decision (endpoints).** RocketMQ 5's proxy answers a topic's whole route, every broker's
queues, each with the endpoints where that broker is served; in local mode each broker serves
itself. We do the same across the cluster: the queues are the nameserver's route of the topic
(GET_ROUTEINFO_BY_TOPIC), every broker name with its master's (or DLedger leader's) gRPC
endpoint, learned once from that master (cluster_route.py), and broker id 0. So whichever node a
client asks (a slave, a follower, another master), it is told of every queue and reaches each at
the node that stores it, with no forwarding between brokers; after a failover the next route
refresh (every 30 s in the clients) names the new master. A client lists several nodes as its
access point (``host1:8081;host2:8082``) to survive the loss of one. Without a nameserver (a
lone broker) or when it cannot be asked, a broker answers its own queues under its own id.

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
from common.model import PermName
from common.topic_message_type import topic_message_type


def _permission(readable: bool, writable: bool) -> pb.Permission:
    if readable and writable:
        return pb.READ_WRITE
    if readable:
        return pb.READ
    if writable:
        return pb.WRITE
    return pb.NONE


def _endpoints(host: str, port: int) -> pb.Endpoints:
    return pb.Endpoints(
        scheme=pb.IPv6 if ":" in host else pb.IPv4,
        addresses=[pb.Address(host=host, port=port)],
    )


class RouteActivity:
    def __init__(self, local: LocalBroker) -> None:
        self.local = local

    def _queues(
        self,
        topic: pb.Resource,
        broker: pb.Broker,
        read: int,
        write: int,
        perm: int,
        accepted: list[pb.MessageType],
    ) -> list[pb.MessageQueue]:
        out = []
        for qid in range(max(read, write)):
            readable = qid < read and PermName.is_readable(perm)
            writable = qid < write and PermName.is_writeable(perm)
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

    async def queues(self, res: pb.Resource) -> list[pb.MessageQueue] | None:
        """The topic's queues, cluster-wide when the nameserver answers (module docstring);
        None when the topic is unknown."""
        b = self.local.controller
        name = wrap_namespace(res)
        topic = resource(name, res.resource_namespace)
        tc = b.topic_config_manager.select_topic_config(name)
        attributes = (tc.attributes if tc is not None else None) or {}
        accepted = [PB_MESSAGE_TYPE[t] for t in topic_message_type(attributes).accepted]
        cluster = self.local.cluster
        if cluster is not None:
            route = await cluster.topic_route(name)
            if route is not None and route.queueDatas:
                masters = await cluster.masters(route)
                out: list[pb.MessageQueue] = []
                for qd in sorted(route.queueDatas, key=lambda q: q.brokerName):
                    if qd.brokerName == b.config.broker_name and b.broker_id == 0:
                        endpoints = self.local.endpoints
                    elif qd.brokerName in masters:
                        m = masters[qd.brokerName]
                        endpoints = _endpoints(m.host, m.grpc_port)
                    else:
                        continue
                    broker = pb.Broker(name=qd.brokerName, id=0, endpoints=endpoints)
                    out += self._queues(
                        topic, broker, qd.readQueueNums, qd.writeQueueNums, qd.perm, accepted
                    )
                if out:
                    return out
        if tc is None:
            return None
        broker = pb.Broker(
            name=b.config.broker_name, id=b.broker_id, endpoints=self.local.endpoints
        )
        perm = tc.perm & b.config.broker_permission
        return self._queues(topic, broker, tc.readQueueNums, tc.writeQueueNums, perm, accepted)

    async def query_route(
        self, req: spb.QueryRouteRequest, ctx: CallContext
    ) -> spb.QueryRouteResponse:
        if not req.topic.name:
            return spb.QueryRouteResponse(status=status(pb.ILLEGAL_TOPIC, "topic name is empty"))
        queues = await self.queues(req.topic)
        if queues is None:
            return spb.QueryRouteResponse(
                status=status(pb.TOPIC_NOT_FOUND, f"topic {req.topic.name} not found")
            )
        return spb.QueryRouteResponse(status=OK, message_queues=queues)

    async def query_assignment(
        self, req: spb.QueryAssignmentRequest, ctx: CallContext
    ) -> spb.QueryAssignmentResponse:
        queues = await self.queues(req.topic)
        if queues is None:
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
            q for q in queues if q.broker.id == 0 and q.permission in (pb.READ, pb.READ_WRITE)
        ]
        if cfg.consumeMessageOrderly:
            chosen = readable
        else:
            # one per broker: pop from any of its queues (queue id -1)
            chosen = []
            seen: set[str] = set()
            for q in readable:
                if q.broker.name in seen:
                    continue
                seen.add(q.broker.name)
                any_queue = pb.MessageQueue()
                any_queue.CopyFrom(q)
                any_queue.id = -1
                any_queue.permission = pb.READ_WRITE
                chosen.append(any_queue)
        return spb.QueryAssignmentResponse(
            status=OK, assignments=[pb.Assignment(message_queue=q) for q in chosen]
        )
