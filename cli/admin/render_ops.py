"""What the operations commands print (`rmq broker config|perm`, `rmq producer list`,
`rmq stats`, `rmq group create|delete|describe`): tables for people, one JSON document with
`--json`, built from one `*_doc` per command as in `render.py`, whose helpers these share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cli.admin.render import _json, _table, iso_ms
from cli.render import _console, _line, rate

if TYPE_CHECKING:
    from rmq.admin import StatsRow
    from rmq.admin_api import ConsumerConnection, ConsumerRunningInfo, ProducerInfo


# --- broker config and write permission ----------------------------------------------------


def broker_config(
    addr: str, props: dict[str, str], version: str, keys: list[str], *, as_json: bool = False
) -> None:
    shown = {k: props[k] for k in keys} if keys else props
    if as_json:
        _json({"addr": addr, "version": version, "config": shown})
        return
    if keys:
        for k in keys:
            _line(f"{k}={shown[k]}")
        return
    _console(min_width=100).print(
        _table(f"broker {addr} config", ("key", "value"), sorted(shown.items()))
    )


def broker_config_set(
    props: dict[str, str], results: list[tuple[str, str | None]], *, as_json: bool = False
) -> None:
    if as_json:
        _json(
            {
                "set": props,
                "brokers": [{"addr": addr, "note": remark} for addr, remark in results],
            }
        )
        return
    keys = ", ".join(f"{k}={v}" for k, v in props.items())
    for addr, remark in results:
        _line(f"updated {keys} on {addr}" + (f" ({remark})" if remark else ""))


def write_perm(
    action: str, broker_name: str, results: list[tuple[str, int]], *, as_json: bool = False
) -> None:
    if as_json:
        _json(
            {
                "broker": broker_name,
                "action": action,
                "nameservers": [{"addr": ns, "topics": n} for ns, n in results],
            }
        )
        return
    for ns, n in results:
        _line(f"{action} write permission of broker {broker_name} on nameserver {ns}: {n} topics")


# --- producers ------------------------------------------------------------------------------


def producer_list(producers: list[ProducerInfo], *, as_json: bool = False) -> None:
    doc = {
        "producers": [
            {
                "group": p.group,
                "client_id": p.client_id,
                "client_addr": p.client_addr,
                "language": p.language,
                "version": p.version,
                "last_heartbeat_ms": p.last_update_timestamp,
                "last_heartbeat": iso_ms(p.last_update_timestamp),
                "protocol": p.protocol,  # GRPC_V2: a RocketMQ 5 client
            }
            for p in producers
        ]
    }
    if as_json:
        _json(doc)
        return
    if not producers:
        _line("no producer online")
        return
    rows = [
        (
            p["group"],
            p["client_id"],
            p["client_addr"],
            p["language"],
            p["version"],
            p["last_heartbeat"] or "-",
            p["protocol"],
        )
        for p in doc["producers"]
    ]
    _console(min_width=110).print(
        _table(
            "producers",
            (
                "group",
                "client id",
                "address",
                "language",
                "version",
                "last heartbeat (UTC)",
                "protocol",
            ),
            rows,
        )
    )


# --- stats ------------------------------------------------------------------------------------


def stats(rows: list[StatsRow], *, as_json: bool = False) -> None:
    doc = {
        "rows": [
            {
                "topic": r.topic,
                "group": r.group or None,
                "accumulation": r.accumulation,
                "in_tps": round(r.in_tps, 2),
                "out_tps": round(r.out_tps, 2) if r.group else None,
                "in_msg_24h": r.in_msg_24h,
                "out_msg_24h": r.out_msg_24h if r.group else None,
            }
            for r in rows
        ]
    }
    if as_json:
        _json(doc)
        return
    if not rows:
        _line("no topic")
        return
    table_rows = [
        (
            r.topic,
            r.group or "NO_CONSUMER",
            r.accumulation,
            rate(r.in_tps),
            rate(r.out_tps) if r.group else "-",
            r.in_msg_24h,
            r.out_msg_24h if r.group else "-",
        )
        for r in rows
    ]
    _console(min_width=110).print(
        _table(
            "topics and consumer groups",
            ("topic", "group", "accumulation", "in TPS", "out TPS", "in 24h", "out 24h"),
            table_rows,
        )
    )


# --- groups -------------------------------------------------------------------------------------


def group_changed(action: str, group: str, addrs: list[str], *, as_json: bool = False) -> None:
    if as_json:
        _json({"group": group, "action": action, "brokers": addrs})
        return
    for addr in addrs:
        _line(f"{action} group {group} on {addr}")


def running_info_doc(info: ConsumerRunningInfo) -> dict[str, Any]:
    """A member's ConsumerRunningInfo as `group describe --running` shows it."""
    return {
        "properties": dict(sorted(info.properties.items())),
        "subscriptions": {
            str(s.get("topic")): str(s.get("subString", "*")) for s in info.subscriptions
        },
        "queues": [
            {"topic": mq.topic, "broker": mq.brokerName, "queue": mq.queueId, **pq}
            for mq, pq in sorted(
                info.mq_table, key=lambda e: (e[0].topic, e[0].brokerName, e[0].queueId)
            )
        ],
        "status": info.status_table,
    }


def group_describe_doc(
    group: str,
    config: dict[str, Any] | None,
    connections: list[ConsumerConnection],
    running: dict[str, Any] | None,
) -> dict[str, Any]:
    first = connections[0] if connections else None
    return {
        "group": group,
        "config": config,
        "online": bool(connections),
        "consume_type": first.consume_type if first else None,
        "message_model": first.message_model if first else None,
        "consume_from_where": first.consume_from_where if first else None,
        "subscriptions": dict(sorted(first.subscriptions.items())) if first else {},
        "members": [
            {
                "client_id": c.client_id,
                "client_addr": c.client_addr,
                "language": c.language,
                "version": c.version,
                "protocol": c.protocol,  # GRPC_V2: a RocketMQ 5 client
            }
            for c in connections
        ],
        "running_info": running,
    }


def group_describe(
    group: str,
    config: dict[str, Any] | None,
    connections: list[ConsumerConnection],
    running: dict[str, Any] | None,
    *,
    as_json: bool = False,
) -> None:
    doc = group_describe_doc(group, config, connections, running)
    if as_json:
        _json(doc)
        return
    if config is None:
        _line(f"group {group}: no subscription group config on any master")
    else:
        settings = ", ".join(
            f"{k}={config[k]}"
            for k in (
                "consumeEnable",
                "consumeBroadcastEnable",
                "retryMaxTimes",
                "retryQueueNums",
                "consumeMessageOrderly",
            )
            if k in config
        )
        _line(f"group {group}: {settings}")
    if not connections:
        _line("no member online")
    else:
        _line(
            f"{len(connections)} member(s) online, {doc['message_model']}, "
            f"{doc['consume_type']}, {doc['consume_from_where']}"
        )
        console = _console(min_width=100)
        console.print(
            _table(
                "members",
                ("client id", "address", "language", "version", "protocol"),
                [
                    (m["client_id"], m["client_addr"], m["language"], m["version"], m["protocol"])
                    for m in doc["members"]
                ],
            )
        )
        console.print(
            _table("subscriptions", ("topic", "expression"), sorted(doc["subscriptions"].items()))
        )
    if running is not None:
        for client_id, info in running.items():
            if "error" in info:
                _line(f"running info of {client_id}: {info['error']}")
                continue
            props = info["properties"]
            _line(
                f"running info of {client_id}: {props.get('PROP_CLIENT_VERSION', '?')}, "
                f"{props.get('PROP_CONSUME_TYPE', '?')}, orderly "
                f"{props.get('PROP_CONSUMEORDERLY', '?')}, threads "
                f"{props.get('PROP_THREADPOOL_CORE_SIZE', '?')}"
            )
            _console(min_width=100).print(
                _table(
                    f"queues held by {client_id}",
                    ("topic", "broker", "queue", "commit offset", "cached", "locked"),
                    [
                        (
                            q["topic"],
                            q["broker"],
                            q["queue"],
                            q.get("commitOffset", "-"),
                            q.get("cachedMsgCount", "-"),
                            q.get("locked", "-"),
                        )
                        for q in info["queues"]
                    ],
                )
            )
