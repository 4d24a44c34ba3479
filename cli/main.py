"""The `rmq` command: its command tree, and the console-script entry point (`main`).

Commands are thin: parse options, `trio.run(...)` one coroutine, hand the result to a
renderer. Imports of trio, the servers and the client happen inside the commands, so
`rmq --help` and `rmq up` start quickly. The application and what the commands share live in
`cli/app.py`; `register_commands` below is the one place that puts every command on it.
"""

from __future__ import annotations

import os
import sys

import typer

from cli.admin import (
    broker_ops,
    cluster,
    group,
    group_reset,
    message,
    message_trace,
    producer,
    stats,
    store,
    topic,
)
from cli.app import add_command, app, command_group
from cli.bench import commands as bench
from cli.chaos import commands as chaos
from cli.dledger import commands as dledger
from cli.local import commands as local
from cli.local.up_arguments import fast_up_arguments
from cli.messages import commands as messages
from cli.servers import commands as servers
from cli.top import commands as top

__all__ = ["app", "main"]


def register_commands(root: typer.Typer) -> None:
    """Every command and group of `rmq`, in the order `rmq --help` lists them.

    typer lists a group's plain commands first and its subgroups after them, each in the
    order they were registered. `rmq broker` is both a command (run a broker) and a group
    (`rmq broker status ADDR`): the group takes the command's place in the listing and hands
    anything that is not one of its subcommands to the command (`cluster.BrokerGroup`).
    """
    add_command(root, messages.produce)
    add_command(root, messages.consume)
    add_command(root, local.up)
    add_command(root, local.status)
    add_command(root, local.kill)
    add_command(root, local.restart)
    add_command(root, local.down)
    add_command(root, servers.namesrv)
    add_command(root, servers.broker)
    add_command(root, top.top, "top")
    add_command(root, chaos.chaos_cmd, "chaos")

    topic_group = command_group(
        "Create, list and inspect topics.",
        "rmq topic create T --queues 8",
        "rmq topic list",
        "rmq topic route T",
    )
    add_command(topic_group, topic.topic_create, "create")
    add_command(topic_group, topic.topic_update, "update")
    add_command(topic_group, topic.topic_delete, "delete")
    add_command(topic_group, topic.topic_list, "list")
    add_command(topic_group, topic.topic_route, "route")
    add_command(topic_group, topic.topic_status, "status")
    root.add_typer(topic_group, name="topic")

    cluster_group = command_group(
        "Brokers of the cluster with their role and replication state.",
        "rmq cluster",
        "rmq cluster list --json",
        no_args_is_help=False,
        invoke_without_command=True,  # `rmq cluster` alone lists, as `rmq cluster list`
    )
    cluster_group.callback()(cluster.cluster_default)
    add_command(cluster_group, cluster.cluster_list, "list")
    root.add_typer(cluster_group, name="cluster")

    broker_group = command_group(
        "Run a broker (`rmq broker [OPTIONS]`, see `rmq broker --help`) or ask one "
        "(`rmq broker status ADDR`).",
        no_args_is_help=False,  # `rmq broker` alone runs a broker
        cls=cluster.BrokerGroup,
    )
    add_command(broker_group, cluster.broker_status_cmd, "status")
    broker_config_group = command_group(
        "A running broker's settings (mqadmin getBrokerConfig / updateBrokerConfig).",
        "rmq broker config get 127.0.0.1:10911",
        "rmq broker config set 127.0.0.1:10911 longPollingEnable=false",
    )
    add_command(broker_config_group, broker_ops.config_get, "get")
    add_command(broker_config_group, broker_ops.config_set, "set")
    broker_group.add_typer(broker_config_group, name="config")
    perm_group = command_group(
        "A broker's write permission on the nameservers (mqadmin wipeWritePerm / addWritePerm).",
        "rmq broker perm wipe broker-a",
        "rmq broker perm add broker-a",
    )
    add_command(perm_group, broker_ops.perm_wipe, "wipe")
    add_command(perm_group, broker_ops.perm_add, "add")
    broker_group.add_typer(perm_group, name="perm")
    root.add_typer(broker_group, name="broker")

    consumer_groups = command_group(
        "Consumer groups and their progress.", "rmq group list", "rmq group progress cg1"
    )
    add_command(consumer_groups, group.group_list, "list")
    add_command(consumer_groups, group.group_progress, "progress")
    add_command(consumer_groups, group.group_create, "create")
    add_command(consumer_groups, group.group_delete, "delete")
    add_command(consumer_groups, group.group_describe, "describe")
    add_command(consumer_groups, group_reset.group_reset, "reset")
    root.add_typer(consumer_groups, name="group")

    producer_group = command_group("Producer groups and their online clients.", "rmq producer list")
    add_command(producer_group, producer.producer_list, "list")
    root.add_typer(producer_group, name="producer")

    add_command(root, stats.stats, "stats")

    message_group = command_group(
        "Find messages by key, msgId or queue offset.",
        "rmq message query --topic Orders --key order-1",
    )
    add_command(message_group, message.message_query, "query")
    add_command(message_group, message_trace.message_trace, "trace")
    root.add_typer(message_group, name="message")

    bench_group = command_group(
        "Load generator: produce or consume as fast as the cluster allows.",
        "rmq bench produce --count 100000 --size 1024 --inflight 32",
        "rmq bench produce --duration 30 --batch 32 --runs 3",
        "rmq bench consume --topic BenchTopic --count 100000",
    )
    add_command(bench_group, bench.produce, "produce")
    add_command(bench_group, bench.consume, "consume")
    root.add_typer(bench_group, name="bench")

    dledger_group = command_group(
        "DLedger groups: move a group's leader (their Raft state: `rmq cluster`, `rmq top`).",
        "rmq dledger leadership-transfer --to n1",
        "rmq dledger leadership-transfer --to broker-b-n2",
    )
    add_command(dledger_group, dledger.leadership_transfer, "leadership-transfer")
    root.add_typer(dledger_group, name="dledger")

    store_group = command_group(
        "Offline checks of broker store directories.",
        "rmq store verify .rmq/broker-a .rmq/broker-a-s1",
    )
    add_command(store_group, store.verify_cmd, "verify")
    root.add_typer(store_group, name="store")


register_commands(app)


def main() -> None:
    """Console-script entry point (`rmq`)."""
    fast = fast_up_arguments(sys.argv[1:])
    if fast is not None:
        try:
            local.up(**fast)
        except typer.Exit as exc:
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:  # before trio.run took over the signal: Ctrl-C's status
            print("Aborted!", file=sys.stderr)
            sys.exit(130)
        return
    # Tests and `rmq up` children run with the repo as cwd; nothing to set up here beyond typer.
    app(prog_name=os.path.basename(sys.argv[0]) if sys.argv[0].endswith("rmq") else "rmq")


if __name__ == "__main__":
    main()
