"""The Grafana dashboard (examples/grafana/trio-rmq.json): it imports anywhere (a datasource
input, no fixed datasource uid), has the rows the operator reads, and every PromQL expression
in it names only metrics docs/metrics.md documents and is one a real Prometheus accepts.

The syntax check runs each expression (Grafana's variables filled in) through the query API of
a real Prometheus server with an empty TSDB: it answers 400 `bad_data` for a malformed query.
The server comes from Debian's `prometheus` package (.ci/run installs it); without it the test
fails, it does not skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.local.prometheus import free_port

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "examples" / "grafana" / "trio-rmq.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"
DATASOURCE = "${DS_PROMETHEUS}"
# series Prometheus makes itself for every scrape target
PROMETHEUS_OWN = frozenset({"up"})
# the words of PromQL that are neither functions (always followed by "(") nor metric names
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan"})
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")

pytestmark = pytest.mark.timeout(120)


def _dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def _panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in doc["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # a collapsed row holds its panels
    return out


def _exprs(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel."""
    return [(p["title"], t["expr"]) for p in _panels(doc) for t in p.get("targets", [])]


def _variable_selectors(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(variable name, series selector) of each `label_values(selector, label)` variable."""
    out = []
    for var in doc["templating"]["list"]:
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert m, f"variable {var['name']}: not a label_values(selector, label) query: {query}"
        out.append((var["name"], m.group(1)))
    return out


def documented_metrics() -> dict[str, str]:
    """name -> type (counter, gauge, histogram, or process) from docs/metrics.md."""
    text = METRICS_DOC.read_text()
    found = {m[0]: m[1] for m in re.findall(r"^\| `(\w+)` \| (\w+) \|", text, re.M)}
    process = re.search(r"^## Process.*?\n\n(.*?)\n\n", text, re.M | re.S)
    assert process, "docs/metrics.md has no Process section"
    found.update({name: "process" for name in re.findall(r"`(process_\w+)`", process.group(1))})
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: what is left once strings, label matchers,
    ranges, grouping clauses and numbers are taken out, minus functions and keywords."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"(?<![\w:])\d+(\.\d+)?([eE][+-]?\d+)?", " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][\w:]*", s):
        if s[m.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation
        if m.group(0).lower() not in KEYWORDS:
            names.add(m.group(0))
    return names


def unknown_metrics(expr: str, documented: dict[str, str]) -> set[str]:
    def known(name: str) -> bool:
        if name in documented or name in PROMETHEUS_OWN:
            return True
        base = next((name[: -len(s)] for s in HISTOGRAM_SERIES if name.endswith(s)), None)
        return base is not None and documented.get(base) == "histogram"

    return {n for n in metric_names(expr) if not known(n)}


def test_it_imports_anywhere() -> None:
    doc = _dashboard()
    assert doc["schemaVersion"] >= 39  # Grafana 10.4 and later
    assert doc["uid"] and doc["id"] is None
    [ds_input] = doc["__inputs"]
    assert ds_input["name"] == "DS_PROMETHEUS" and ds_input["pluginId"] == "prometheus"
    sources = [p["datasource"] for p in _panels(doc) if p["type"] != "row"]
    sources += [t["datasource"] for p in _panels(doc) for t in p.get("targets", [])]
    sources += [v["datasource"] for v in doc["templating"]["list"]]
    assert sources and all(s == {"type": "prometheus", "uid": DATASOURCE} for s in sources)


def test_it_has_the_rows_an_operator_reads() -> None:
    doc = _dashboard()
    rows = [p["title"] for p in doc["panels"] if p["type"] == "row"]
    assert rows == [
        "Cluster overview",
        "Topics",
        "Consumer lag",
        "Replication: HA slaves and DLedger",
        "Disk",
        "Processes",
    ]
    ids = [p["id"] for p in _panels(doc)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    text = json.dumps(doc)
    for needed in (
        "rocketmq_messages_in_total",
        "rocketmq_messages_out_total",
        "rocketmq_consumer_lag_messages",
        "rocketmq_consumer_lag_latency",
        "rocketmq_ha_slave_lag_bytes",
        "rocketmq_dledger_role",
        "rocketmq_dledger_term",
        "rocketmq_dledger_committed_index",
        "rocketmq_storage_disk_used_ratio",
        "rocketmq_storage_put_refused",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ):
        assert needed in text, f"no panel shows {needed}"


def test_every_expression_names_only_documented_metrics() -> None:
    documented = documented_metrics()
    assert "rocketmq_consumer_lag_messages" in documented  # the doc was read
    doc = _dashboard()
    queries = _exprs(doc) + _variable_selectors(doc)
    assert len(queries) > 40
    bad = {}
    for title, expr in queries:
        names = metric_names(expr)
        assert names, f"{title}: no metric found in {expr}"
        unknown = unknown_metrics(expr, documented)
        if unknown:
            bad[title] = sorted(unknown)
    assert not bad, f"metrics docs/metrics.md does not document: {bad}"


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (topic) (rate(rocketmq_messages_in_total{topic=~"$t"}[1m]))', {"x"}),
        ("histogram_quantile(0.99, sum by (le) (rate(rocketmq_message_size_bucket[5m])))", {"x"}),
        ("rocketmq_dledger_ledger_end_index - rocketmq_dledger_committed_index", {"x", "y"}),
        ("count(up == 0) or vector(0)", {"x"}),
        ("rocketmq_consumer_lag_mesages > 1e3", {"rocketmq_consumer_lag_mesages"}),
        ("rate(rocketmq_message_size_total[1m])", {"rocketmq_message_size_total"}),
        ("sum(rocketmq_rpc_latency_bucket) by (le) + process_open_fd", {"process_open_fd"}),
    ],
)
def test_the_name_check_finds_what_is_not_documented(expr: str, names: set[str]) -> None:
    """The check catches a misspelt name and a histogram suffix on a counter, and passes
    the shapes the dashboard uses; `names == {"x"...}` means: nothing unknown."""
    unknown = unknown_metrics(expr, documented_metrics())
    assert unknown == (set() if names <= {"x", "y"} else names)


# --- syntax, by a real Prometheus -------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus server with an empty TSDB on a free loopback port; its base URL."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: apt-get install prometheus (as .ci/run does)"
    work = tmp_path_factory.mktemp("prometheus")
    (work / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\n")
    addr = f"127.0.0.1:{free_port('127.0.0.1')}"
    with open(work / "log", "wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address={addr}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (work / "log").read_text()
            try:
                with urllib.request.urlopen(f"http://{addr}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "prometheus not ready in 60 s"
            time.sleep(0.1)
        yield f"http://{addr}"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def grafana_filled(expr: str) -> str:
    """`expr` as Grafana sends it with every variable at All and a 1 m rate interval."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def query_status(base: str, expr: str) -> tuple[int, str]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_prometheus_accepts_every_expression(prometheus: str) -> None:
    doc = _dashboard()
    refused = {}
    for title, expr in _exprs(doc) + _variable_selectors(doc):
        code, body = query_status(prometheus, grafana_filled(expr))
        if code != 200:
            refused[title] = f"{code}: {body[:300]}"
    assert not refused, refused


def test_prometheus_refuses_a_malformed_expression(prometheus: str) -> None:
    """The syntax check can fail: Prometheus answers 400 to what is not PromQL."""
    code, body = query_status(prometheus, grafana_filled("sum by (topic (rocketmq_topic_number)"))
    assert code == 400 and "bad_data" in body
    code, _ = query_status(prometheus, grafana_filled('rate(rocketmq_topic_number{job=~"$job"})'))
    assert code == 400  # rate() of an instant vector
