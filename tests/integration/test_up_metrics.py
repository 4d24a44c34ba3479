"""`rmq up --metrics`: a real Prometheus (Debian's `prometheus`, installed by .ci/run) started by
the supervisor scrapes every node of a real cluster, with the alert rules loaded, and stops with
it.

Free loopback ports in tmp_path; every process a test started is killed by pid in a `finally`.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cli.chaos.port_blocks import free_port_block
from tests.examples.test_dashboard import DASHBOARD, grafana_filled
from tests.integration.test_local_json import alive, kill_leftovers, rmq

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


def api(base: str, path: str, **params: str) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{base}/api/v1/{path}{query}", timeout=10) as resp:
        doc = json.load(resp)
    assert doc["status"] == "success", doc
    return doc["data"]


def wait_for(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout:g} s (last: {last!r})")


def dashboard_queries() -> dict[str, list[str]]:
    """panel title -> its expressions, as Grafana sends them with every variable at All."""
    out: dict[str, list[str]] = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            out.setdefault(panel["title"], []).append(grafana_filled(target["expr"]))
    return out


def values(base: str, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
    """An instant query's result: each series' labels -> its value."""
    result = api(base, "query", query=expr)["result"]
    return {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in result}


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


@pytest.mark.parametrize(
    ("topology", "scraped"),
    [
        (["--slaves", "1"], ["namesrv", "broker-a", "broker-a-s1"]),
        (
            ["--dledger", "3"],
            ["namesrv", "broker-a-n0", "broker-a-n1", "broker-a-n2"],
        ),
    ],
    ids=["master-slave", "dledger-3"],
)
def test_up_metrics_scrapes_every_node(
    tmp_path: Path, topology: list[str], scraped: list[str]
) -> None:
    data = tmp_path / "rmq"
    base = free_port_block(40)
    seen: list[int] = []
    try:
        r = rmq(
            "up",
            "--detach",
            "--json",
            "--metrics",
            *topology,
            "--data-dir",
            str(data),
            "--namesrv-port",
            str(base + 35),
            "--broker-port",
            str(base),
            "--prometheus-port",
            str(base + 37),
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        up = json.loads(r.stdout)
        seen += [up["supervisor_pid"], *(n["pid"] for n in up["nodes"])]
        nodes = {n["name"]: n for n in up["nodes"]}
        assert list(nodes) == [*scraped, "prometheus"]
        prom = nodes["prometheus"]
        assert (prom["kind"], prom["status"], prom["port"]) == ("prometheus", "alive", base + 37)
        base_url = up["prometheus"]
        assert base_url == f"http://127.0.0.1:{base + 37}"
        [prometheus_pid] = children(prom["pid"])  # the server itself, under tether
        seen.append(prometheus_pid)

        # `rmq status --json` lists it the same way
        status = json.loads(rmq("status", "--json", "--data-dir", str(data)).stdout)
        assert status["prometheus"] == base_url
        assert [n["name"] for n in status["nodes"]][-1] == "prometheus"

        # every node is a target, at the metrics URL status shows, and every one is up
        def targets_up() -> dict[str, str] | None:
            active = api(base_url, "targets")["activeTargets"]
            got = {t["labels"]["rmq_node"]: t for t in active}
            if sorted(got) != sorted(scraped) or any(t["health"] != "up" for t in got.values()):
                return None
            return {name: t["scrapeUrl"] for name, t in got.items()}

        urls = wait_for("every target up", targets_up)
        assert urls == {name: nodes[name]["metrics"] for name in scraped}
        assert all(t["scrapePool"] == "trio-rmq" for t in api(base_url, "targets")["activeTargets"])

        # the alert rules are loaded
        [group] = api(base_url, "rules")["groups"]
        assert group["name"] == "trio-rmq" and len(group["rules"]) == 11
        assert {r["name"] for r in group["rules"]} >= {
            "RocketMQNodeDown",
            "RocketMQConsumerLagGrowing",
            "RocketMQNoDLedgerLeader",
        }

        # the scraped series carry the nodes' own labels: history a browser can show
        def node_types() -> set[tuple[str, str]] | None:
            result = api(base_url, "query", query="rocketmq_server_connections")["result"]
            got = {(s["metric"]["rmq_node"], s["metric"]["node_type"]) for s in result}
            return got if len(got) == len(scraped) else None

        assert wait_for("every node's series", node_types) == {
            (name, "nameserver" if name == "namesrv" else "broker") for name in scraped
        }

        # the dashboard on live data: every query is answered, and the panels an operator
        # reads first show this cluster; the lag panel counts each queue once (masters and
        # slaves both report it), so it equals `rmq group progress`
        namesrv = f"127.0.0.1:{base + 35}"
        r = rmq("produce", "-n", namesrv, "-t", "Dash", *[f"m{i}" for i in range(30)])
        assert r.returncode == 0, r.stderr
        r = rmq("consume", "-n", namesrv, "-t", "Dash", "-g", "dash-g", "--from-beginning")
        assert r.returncode == 0 and len(r.stdout.splitlines()) >= 30, r.stderr
        r = rmq("produce", "-n", namesrv, "-t", "Dash", *[f"n{i}" for i in range(12)])
        assert r.returncode == 0, r.stderr
        queries = dashboard_queries()
        for exprs in queries.values():
            for expr in exprs:
                api(base_url, "query", query=expr)  # status "success", or it raises
        brokers = len(scraped) - 1
        [[nodes_up]] = [list(values(base_url, e).values()) for e in queries["Nodes up"]]
        assert nodes_up == len(scraped)

        def lag_panel() -> float | None:
            [expr] = queries["Lag per group (messages)"]
            got = values(base_url, expr).get((("consumer_group", "dash-g"),))
            return got if got == 12 else None

        assert wait_for("the lag panel", lag_panel) == 12
        progress = rmq("group", "progress", "-n", namesrv, "dash-g", "--topic", "Dash", "--json")
        assert json.loads(progress.stdout)["total"]["lag"] == 12
        [expr] = queries["Disk used ratio"]
        assert len(values(base_url, expr)) == brokers
        if "--dledger" in topology:
            [expr] = queries["DLedger leader per group"]
            [leader] = values(base_url, expr)
            assert dict(leader)["dledger_group"] == "broker-a"
        else:
            [expr] = queries["Slaves connected"]
            assert values(base_url, expr) == {(("node_id", "broker-a"),): 1.0}

        # a node that dies shows as a target that is down (RocketMQNodeDown's input)
        victim = scraped[-1]
        r = rmq("kill", victim, "--data-dir", str(data))
        assert r.returncode == 0, r.stderr

        def victim_down() -> bool:
            result = api(base_url, "query", query='up{job="trio-rmq"} == 0')["result"]
            return [s["metric"]["rmq_node"] for s in result] == [victim]

        wait_for(f"{victim} down", victim_down, timeout=30)

        # `rmq down` stops Prometheus with the nodes
        r = rmq("down", "--json", "--data-dir", str(data))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["stopped"] == [*scraped, "prometheus"]
        assert not alive(prometheus_pid)
        assert not any(alive(p) for p in seen)
        # its history stays in the data dir, as the nodes' stores do
        assert (data / "prometheus" / "wal").is_dir()
    finally:
        kill_leftovers(data, seen)
