"""`rmq up --metrics`: a local Prometheus server that scrapes every node of the cluster.

Theory of operation:

* The server is one more node of the plan (`ClusterPlan.prometheus`, kind `prometheus`), so
  the supervisor spawns, watches, lists (`rmq status`), kills, restarts and stops it as it does
  the nameserver and the brokers, and `rmq down` waits for it too. It is not one of ours: it
  cannot watch its stdin, so it runs under `cli/local/tether.py`, which can, and which stops it
  when the supervisor is gone.
* The binary is the `--prometheus PATH` given, else `prometheus` on PATH; without one `rmq up
  --metrics` refuses to start with one line saying how to install it (`PrometheusMissing`).
  Its web port is `--prometheus-port`, or by default one the kernel reports free when the
  plan is made; it is printed with the other nodes' ports.
* Its configuration is generated (`prometheus_config`) and written at every spawn into
  `<data-dir>/conf/prometheus.yml`, beside a copy of the alert rules (`ALERT_RULES`,
  the file `examples/prometheus/alerts.yml` links to): one scrape job, `trio-rmq`, whose
  targets are every node's metrics address (`NodeSpec.metrics_port`: the port rule of
  docs/metrics.md), each labelled `rmq_node` with the node's name, scraped and evaluated
  every `SCRAPE_INTERVAL`. Its TSDB lives in `<data-dir>/prometheus/` like a node's store, so a
  cluster started again in the same data dir keeps its history.
* It is ready when `GET /-/ready` answers 200 (Prometheus's own readiness endpoint: the TSDB
  is open and the rules are loaded), probed with the nodes' readiness (`cli/local/up.py`).
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import attrs

from cli.local.up import ClusterPlan, NodeSpec, PlanError, node_command, probe_cluster

PROMETHEUS_NODE = "prometheus"  # its node name and kind
PROMETHEUS_ROLE = "PROMETHEUS"  # what `rmq status` shows in the role column
JOB = "trio-rmq"  # the scrape job (the dashboard's $job variable offers it)
SCRAPE_INTERVAL = "2s"  # scrape and rule evaluation; `rate(...[$__rate_interval])` needs >= 4
ALERT_RULES = Path(__file__).with_name("alerts.yml")
INSTALL_HINT = (
    "install Prometheus (Debian/Ubuntu: `apt-get install prometheus`; others: "
    "https://prometheus.io/download/) or give its binary with --prometheus PATH"
)


class PrometheusMissing(PlanError):
    """`rmq up --metrics` without a Prometheus binary to run."""


def find_prometheus(given: Path | None) -> Path:
    """The Prometheus binary: `given` (must be an executable file) or `prometheus` on PATH."""
    if given is not None:
        found = shutil.which(str(given))
        if found is None:
            raise PrometheusMissing(f"--prometheus {given}: not an executable file; {INSTALL_HINT}")
        return Path(found).absolute()
    found = shutil.which("prometheus")
    if found is None:
        raise PrometheusMissing(f"--metrics needs a `prometheus` binary on PATH; {INSTALL_HINT}")
    return Path(found)


def free_port(host: str) -> int:
    """A port nothing listens on now (the kernel's pick); the plan reserves it from here on."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def with_prometheus(plan: ClusterPlan, binary: Path, *, port: int = 0) -> ClusterPlan:
    """`plan` plus a Prometheus node serving on `port` (0: a free one)."""
    host = plan.namesrv.host
    node = NodeSpec(
        PROMETHEUS_NODE,
        PROMETHEUS_NODE,
        host,
        port or free_port(host),
        cluster=plan.namesrv.cluster,
        role=PROMETHEUS_ROLE,
        executable=str(binary),
    )
    taken = {p: n.name for n in plan.nodes for p in n.ports()}
    if node.port in taken:
        raise PlanError(f"prometheus and {taken[node.port]} both need port {node.port}")
    if not 1 <= node.port <= 65535:
        raise PlanError(f"prometheus: port {node.port} is outside 1..65535")
    return attrs.evolve(plan, prometheus=node)


def metrics_addr(node: NodeSpec) -> str:
    """host:port of a node's metrics server (docs/metrics.md, "Port rule")."""
    return f"{node.host}:{node.metrics_port}"


def scraped(plan: ClusterPlan) -> tuple[NodeSpec, ...]:
    return tuple(n for n in plan.nodes if n.kind != PROMETHEUS_NODE)


def config_path(data_dir: Path) -> Path:
    return data_dir / "conf" / "prometheus.yml"


def rules_path(data_dir: Path) -> Path:
    return data_dir / "conf" / "prometheus-alerts.yml"


def prometheus_config(plan: ClusterPlan, rules: Path) -> dict[str, Any]:
    """The server's configuration: every node of `plan` a target of job `JOB`, each with a
    `rmq_node` label naming it, and the rule file `rules`. The cluster name rides along as
    an external label (what Alertmanager and federation see), not on every series."""
    return {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "scrape_timeout": SCRAPE_INTERVAL,
            "evaluation_interval": SCRAPE_INTERVAL,
            "external_labels": {"rmq_cluster": plan.namesrv.cluster},
        },
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": JOB,
                "metrics_path": "/metrics",
                "static_configs": [
                    {"targets": [metrics_addr(n)], "labels": {"rmq_node": n.name}}
                    for n in scraped(plan)
                ],
            }
        ],
    }


def write_config(plan: ClusterPlan, data_dir: Path) -> Path:
    """Write the configuration and the rules under `<data-dir>/conf/`; the config's path."""
    path = config_path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    rules = rules_path(data_dir)
    shutil.copyfile(ALERT_RULES, rules)
    # JSON is YAML: no emitter needed, and the file says where it came from
    text = json.dumps(prometheus_config(plan, rules.absolute()), indent=2)
    path.write_text(f"# written by `rmq up --metrics` at every start; edits are lost\n{text}\n")
    return path


def prometheus_command(node: NodeSpec, plan: ClusterPlan, data_dir: Path) -> list[str]:
    """The Prometheus server of `node`, run under tether (module doc)."""
    import sys

    assert node.executable is not None
    return [
        sys.executable,
        "-m",
        "cli.local.tether",
        node.executable,
        f"--config.file={config_path(data_dir).absolute()}",
        f"--storage.tsdb.path={(data_dir / node.name).absolute()}",
        f"--web.listen-address={node.addr}",
        # a laptop's history: a week is plenty, and the data dir does not grow without end
        "--storage.tsdb.retention.time=7d",
        "--log.level=warn",
    ]


def command_for(node: NodeSpec, plan: ClusterPlan, data_dir: Path) -> list[str]:
    """The supervisor's `command_for` for a plan with a Prometheus node: that node's command
    line, after (re)writing its configuration (the supervisor asks right before each spawn);
    every other node's as `rmq up` has it."""
    if node.kind == PROMETHEUS_NODE:
        write_config(plan, data_dir)
        return prometheus_command(node, plan, data_dir)
    return node_command(node, plan, data_dir)


async def probe(plan: ClusterPlan, nodes: tuple[NodeSpec, ...]) -> bool:
    """The supervisor's readiness probe for a plan with a Prometheus node: the cluster's
    nodes as `rmq up` probes them, and Prometheus once it answers `GET /-/ready`."""
    ours = tuple(n for n in nodes if n.kind != PROMETHEUS_NODE)
    if not await probe_cluster(plan, ours):
        return False
    for node in nodes:
        if node.kind == PROMETHEUS_NODE and not await prometheus_ready(node):
            return False
    return True


def url(node: NodeSpec) -> str:
    return f"http://{node.addr}"


async def prometheus_ready(node: NodeSpec, *, timeout: float = 1.0) -> bool:
    """Whether the server at `node` answers `GET /-/ready` with 200 within `timeout`."""
    import urllib.error
    import urllib.request

    import trio

    def get() -> bool:
        try:
            with urllib.request.urlopen(f"{url(node)}/-/ready", timeout=timeout) as resp:
                return int(resp.status) == 200
        except (OSError, urllib.error.URLError):
            return False  # not listening yet, or 503 while it opens its TSDB

    return await trio.to_thread.run_sync(get)
