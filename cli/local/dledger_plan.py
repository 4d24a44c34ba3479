"""DLedger groups for `rmq up --dledger N`: node names, ports, peers, timing and readiness.

Theory of operation: `rmq up --dledger N` replaces each master and its slaves by one DLedger
group of N members that share a Raft log (`broker/dledger/`). Group g is named like a master
(broker-a, broker-b, ...) and is both the brokerName and the dLegerGroup of its members; member
k is `n<k>` (dLegerSelfId) and its node is `<group>-n<k>` (broker-a-n0, broker-a-n1, ...),
the name `rmq kill` / `rmq restart` take. No member is master by configuration: the Raft
leader serves as master (brokerId 0), a follower n<k> as slave k+1, and they swap at run time.

Ports: every member takes one broker block of 10 ports from `--broker-port`, groups in order
and members in order inside a group (broker-a-n0 10911, broker-a-n1 10921, broker-a-n2 10931,
broker-b-n0 10941, ...). Inside its block a member listens on P (clients), P-2 (VIP channel)
and P+2 (DLedger: the Raft RPCs between members); P+1, RocketMQ's HA port, is left free (DLedger
mode has no HA connection). A member moved with `[nodes.<name>] port` takes its DLedger port
along. The peers string (`dLegerPeers`, `n0-host:P0+2;n1-host:P1+2;...`) is built once every
port is final, so all members of a group are given the same one. No `preferredLeaderId` is
set; a user may set one through `[broker_conf]`.

Timing: RocketMQ's defaults (a heartbeat every 2 s, a follower gives up on its leader after 3
missed ones, a vote 300-1000 ms later) take 7 s or more to replace a dead leader. `rmq up`
runs a laptop cluster, so it sets `LAPTOP_TIMING` unless `[broker_conf]` says otherwise:
heartbeats every 500 ms, a leader is given up after 3 x 500 = 1.5 s, a candidate waits a
random 150-400 ms before it asks for votes. A kill is then followed by a new leader in about
2 s and by its first acknowledged write soon after (the new leader first commits a no-op
entry of its term and registers as master).

Readiness (`dledger_ready`, pure over the answers the probe collected): every member answers
GET_BROKER_RUNTIME_INFO as LEADER or FOLLOWER (not CANDIDATE, not yet elected) and is
registered with the nameserver under its group's name (at whatever brokerId its role gives
it); and for a group whose members are all being waited for, the nameserver's brokerId 0 is
the address of the member that says it leads. A restarted member alone is ready once it
follows (or leads) and is registered again.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from cli.local.up import (  # never the other way: readiness (dledger_ready) lives in cli.local.up
    PORT_BLOCK,
    ClusterPlan,
    NodeSpec,
    PlanError,
    broker_name_for,
    check_ports,
    customised,
)

DLEDGER_ROLE = "DLEDGER"  # NodeSpec.role of a member: its broker role is decided by Raft
DLEDGER_PORT_OFFSET = 2  # a member's DLedger port is its listen port + 2
MAX_GROUP_SIZE = 9  # n0..n8: more members than a laptop runs usefully
UNKNOWN_BROKER_ID = -1  # RocketMQ's brokerId of a DLedger member before its first role

# RocketMQ DLedgerConfig keys -> what `rmq up --dledger` sets (see the module doc);
# [broker_conf] / [nodes.<name>].broker_conf override any of them
LAPTOP_TIMING: dict[str, str] = {
    "heartBeatTimeIntervalMs": "500",
    "maxHeartBeatLeak": "3",
    "minVoteIntervalMs": "150",
    "maxVoteIntervalMs": "400",
    # several entries per APPEND push (DLedger's default is one): 2.5x the throughput of a
    # 3-member group here (docs/benchmarks.md); the simulator runs both ways
    "isEnableBatchPush": "true",
}
# broker.conf properties `rmq up` sets on every member itself (a user may not)
PLANNED_DLEDGER_PROPERTIES = frozenset(
    {"enableDLegerCommitLog", "dLegerGroup", "dLegerPeers", "dLegerSelfId"}
)


def member_id(k: int) -> str:
    return f"n{k}"


def member_node_name(group: str, self_id: str) -> str:
    return f"{group}-{self_id}"


def planned_dledger_names(groups: int, size: int) -> list[str]:
    """The broker node names of `groups` groups of `size` members, in port order."""
    return [
        member_node_name(broker_name_for(g), member_id(k))
        for g in range(groups)
        for k in range(size)
    ]


def check_group_size(size: int) -> None:
    if not 1 <= size <= MAX_GROUP_SIZE:
        raise PlanError(
            f"--dledger takes a group size from 1 to {MAX_GROUP_SIZE} (usually 3 or 5), "
            f"or 0 for master/slave replication; not {size}"
        )


def plan_dledger_cluster(
    *,
    host: str = "127.0.0.1",
    namesrv_port: int,
    broker_port: int,
    groups: int,
    size: int,
    cluster: str = "DefaultCluster",
    ports: Mapping[str, int] | None = None,
    properties: Mapping[str, Mapping[str, str]] | None = None,
) -> ClusterPlan:
    """A nameserver and `groups` DLedger groups of `size` members (see the module doc).

    `ports` moves single nodes (by node name), `properties` gives a node (by name) extra
    broker.conf properties over `LAPTOP_TIMING`; names that are not nodes of the plan are an
    error, as are properties the plan sets itself.
    """
    if groups < 1:
        raise PlanError("a cluster needs at least one DLedger group")
    check_group_size(size)
    for name, props in (properties or {}).items():
        planned = sorted(PLANNED_DLEDGER_PROPERTIES.intersection(props))
        if planned:
            raise PlanError(f"{name}: {planned[0]} is set by rmq up --dledger itself")
    namesrv = NodeSpec("namesrv", "namesrv", host, namesrv_port, cluster=cluster)
    brokers: list[NodeSpec] = []
    for g in range(groups):
        group = broker_name_for(g)
        for k in range(size):
            brokers.append(
                NodeSpec(
                    member_node_name(group, member_id(k)),
                    "broker",
                    host,
                    broker_port + PORT_BLOCK * len(brokers),
                    cluster,
                    group,
                    UNKNOWN_BROKER_ID,
                    DLEDGER_ROLE,
                    dledger_self_id=member_id(k),
                )
            )
    plan = customised(ClusterPlan(namesrv, tuple(brokers)), ports or {}, properties or {})
    plan = attrs.evolve(
        plan, brokers=tuple(_with_dledger_properties(plan, b) for b in plan.brokers)
    )
    check_ports(plan)
    return plan


def peers_of(plan: ClusterPlan, group: str) -> str:
    """dLegerPeers of `group`: every member as `n<k>-host:dledgerPort`, in member order."""
    members = [b for b in plan.brokers if b.broker_name == group and b.is_dledger]
    return ";".join(f"{b.dledger_self_id}-{b.host}:{b.dledger_port}" for b in members)


def _with_dledger_properties(plan: ClusterPlan, node: NodeSpec) -> NodeSpec:
    group = node.broker_name or ""
    props = {
        **LAPTOP_TIMING,
        **dict(node.properties),  # the user's, over the laptop timing
        "enableDLegerCommitLog": "true",
        "dLegerGroup": group,
        "dLegerPeers": peers_of(plan, group),
        "dLegerSelfId": node.dledger_self_id or "",
    }
    return attrs.evolve(node, properties=tuple(sorted(props.items())))
