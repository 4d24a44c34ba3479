"""The alert rules (cli/local/alerts.yml, linked from examples/prometheus/alerts.yml) and the
Prometheus configuration `rmq up --metrics` writes, checked by Prometheus's own promtool.

promtool comes with Debian's `prometheus` package (.ci/run installs it); without it these
tests fail, they do not skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cli.local import prometheus as local_prometheus
from cli.local.up import plan_cluster

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "examples" / "prometheus" / "alerts.yml"
RULE_TESTS = Path(__file__).with_name("alerts_test.yml")
METRICS_DOC = ROOT / "docs" / "metrics.md"

pytestmark = pytest.mark.timeout(60)


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: apt-get install prometheus (as .ci/run does)"
    return subprocess.run(
        [tool, *args], capture_output=True, text=True, timeout=30, cwd=cwd, check=False
    )


def test_the_example_is_the_file_rmq_up_loads() -> None:
    assert RULES.resolve() == local_prometheus.ALERT_RULES.resolve()


def test_promtool_accepts_the_rules() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 11 rules found" in done.stdout


def test_every_alert_fires_on_its_case_and_only_there() -> None:
    """promtool evaluates the rules over alerts_test.yml's series: each alert must fire with
    exactly the labels and annotations written there, and no other alert of its name."""
    done = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    defined = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert tested == defined, f"alerts without a promtool case: {defined - tested}"


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """The rule tests can fail: the same cases against a rule file whose disk threshold moved."""
    rules = tmp_path / "alerts.yml"
    rules.write_text(RULES.read_text().replace("used_ratio > 0.75", "used_ratio > 0.9"))
    cases = tmp_path / "alerts_test.yml"
    cases.write_text(RULE_TESTS.read_text().replace("../../cli/local/alerts.yml", str(rules)))
    done = promtool("test", "rules", cases.name, cwd=tmp_path)
    assert done.returncode != 0
    assert "RocketMQDiskAboveMaxUsedRatio" in done.stdout + done.stderr


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(rocketmq_\w+|process_\w+)\b", expr))


def test_the_rules_use_only_documented_metrics() -> None:
    documented = set(re.findall(r"`((?:rocketmq|process)_\w+)`", METRICS_DOC.read_text()))
    used: set[str] = set()
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            used |= _metric_names(rule["expr"])
    assert used and used <= documented, sorted(used - documented)


def test_the_generated_config_scrapes_every_node_and_promtool_accepts_it(tmp_path: Path) -> None:
    plan = local_prometheus.with_prometheus(
        plan_cluster(slaves=2), Path("/usr/bin/prometheus"), port=19090
    )
    path = local_prometheus.write_config(plan, tmp_path)
    config = yaml.safe_load(path.read_text())
    [job] = config["scrape_configs"]
    assert job["job_name"] == "trio-rmq"
    targets = {c["labels"]["rmq_node"]: c["targets"] for c in job["static_configs"]}
    # docs/metrics.md's port rule: a broker's listen port + 3, the nameserver's + 1
    assert targets == {
        "namesrv": ["127.0.0.1:9877"],
        "broker-a": ["127.0.0.1:10914"],
        "broker-a-s1": ["127.0.0.1:10924"],
        "broker-a-s2": ["127.0.0.1:10934"],
    }
    assert config["global"]["scrape_interval"] == "2s"
    [rules] = config["rule_files"]
    assert Path(rules).read_text() == RULES.read_text()
    # promtool also loads and checks the rule file the config names
    done = promtool("check", "config", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 11 rules found" in done.stdout


def test_promtool_rejects_a_broken_config(tmp_path: Path) -> None:
    """`check config` can fail: the same config with a target that is no host:port."""
    plan = local_prometheus.with_prometheus(plan_cluster(), Path("/usr/bin/prometheus"), port=19090)
    path = local_prometheus.write_config(plan, tmp_path)
    path.write_text(path.read_text().replace('"127.0.0.1:9877"', '"http://127.0.0.1:9877/x"'))
    done = promtool("check", "config", str(path))
    assert done.returncode != 0
