"""`rmq up --metrics` without processes: the plan with a Prometheus node, its command line and
configuration, the missing-binary error, and tether (the stand-in that stops Prometheus with
the supervisor), which runs `sleep` here, not Prometheus."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cli.local import prometheus as local_prometheus
from cli.local.dledger_plan import plan_dledger_cluster
from cli.local.prometheus import PrometheusMissing, find_prometheus, with_prometheus
from cli.local.render import spec_detail
from cli.local.up import PlanError, node_command, plan_cluster
from cli.local.up_arguments import fast_up_arguments

BINARY = Path("/opt/prom/bin/prometheus")

pytestmark = pytest.mark.timeout(60)


def test_prometheus_is_one_more_node_of_the_plan() -> None:
    plan = with_prometheus(plan_cluster(), BINARY, port=19090)
    assert [n.name for n in plan.nodes] == ["namesrv", "broker-a", "broker-a-s1", "prometheus"]
    prom = plan.nodes[-1]
    assert (prom.kind, prom.role, prom.addr) == ("prometheus", "PROMETHEUS", "127.0.0.1:19090")
    assert prom.executable == str(BINARY)
    # its own metrics are on its web port: it takes no other port
    assert prom.ports() == [19090] and prom.metrics_port == 19090
    assert "prometheus, web UI and API on port 19090" in spec_detail(prom)
    # the brokers' plan is what it was
    assert plan.brokers == plan_cluster().brokers


def test_a_free_port_by_default_and_never_one_the_cluster_uses() -> None:
    plan = with_prometheus(plan_cluster(), BINARY)
    assert plan.prometheus is not None
    assert plan.prometheus.port not in {p for n in plan_cluster().nodes for p in n.ports()}
    with pytest.raises(PlanError, match="prometheus and broker-a both need port 10914"):
        with_prometheus(plan_cluster(), BINARY, port=10914)  # broker-a's metrics port
    with pytest.raises(PlanError, match="outside"):
        with_prometheus(plan_cluster(), BINARY, port=70000)


def test_the_command_runs_prometheus_under_tether_and_writes_its_config(tmp_path: Path) -> None:
    plan = with_prometheus(plan_cluster(slaves=0, master_role="ASYNC_MASTER"), BINARY, port=19090)
    assert plan.prometheus is not None
    cmd = local_prometheus.command_for(plan.prometheus, plan, tmp_path)
    assert cmd[:4] == [sys.executable, "-m", "cli.local.tether", str(BINARY)]
    assert f"--config.file={tmp_path / 'conf' / 'prometheus.yml'}" in cmd
    assert f"--storage.tsdb.path={tmp_path / 'prometheus'}" in cmd
    assert "--web.listen-address=127.0.0.1:19090" in cmd
    config = yaml.safe_load((tmp_path / "conf" / "prometheus.yml").read_text())
    assert config["rule_files"] == [str(tmp_path / "conf" / "prometheus-alerts.yml")]
    targets = [c["targets"] for c in config["scrape_configs"][0]["static_configs"]]
    assert targets == [["127.0.0.1:9877"], ["127.0.0.1:10914"]]
    # every other node's command line is `rmq up`'s own
    broker = plan.brokers[0]
    assert local_prometheus.command_for(broker, plan, tmp_path) == node_command(
        broker, plan, tmp_path
    )


def test_a_dledger_cluster_is_scraped_member_by_member(tmp_path: Path) -> None:
    plan = with_prometheus(
        plan_dledger_cluster(namesrv_port=9876, broker_port=10911, groups=1, size=3),
        BINARY,
        port=19090,
    )
    doc = local_prometheus.prometheus_config(plan, tmp_path / "rules.yml")
    got = {
        c["labels"]["rmq_node"]: c["targets"] for c in doc["scrape_configs"][0]["static_configs"]
    }
    assert got == {
        "namesrv": ["127.0.0.1:9877"],
        "broker-a-n0": ["127.0.0.1:10914"],
        "broker-a-n1": ["127.0.0.1:10924"],
        "broker-a-n2": ["127.0.0.1:10934"],
    }


def test_find_prometheus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "prometheus"
    fake.write_text("#!/bin/sh\n")
    with pytest.raises(PrometheusMissing, match="not an executable file"):
        find_prometheus(fake)
    fake.chmod(0o755)
    assert find_prometheus(fake) == fake
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_prometheus(None) == fake
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(PrometheusMissing, match="apt-get install prometheus"):
        find_prometheus(None)


def test_up_reads_the_metrics_options_on_its_fast_path() -> None:
    args = fast_up_arguments(
        ["up", "--metrics", "--prometheus", "/x/prom", "--prometheus-port", "9"]
    )
    assert args is not None
    assert (args["metrics"], args["prometheus"], args["prometheus_port"]) == (
        True,
        Path("/x/prom"),
        9,
    )


def test_up_without_prometheus_says_how_to_install_it(tmp_path: Path) -> None:
    """One `error:` line and exit 1, before anything starts; no traceback."""
    env = {**os.environ, "PATH": str(tmp_path / "empty")}
    for args in (["--metrics"], ["--prometheus", str(tmp_path / "nope")]):
        r = subprocess.run(
            [sys.executable, "-m", "cli.main", "up", *args, "--data-dir", str(tmp_path / "d")],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        assert r.returncode == 1, r
        [line] = r.stderr.splitlines()
        assert line.startswith("error: ") and "apt-get install prometheus" in line, line
        assert r.stdout == ""
        assert not (tmp_path / "d" / "supervisor.json").exists()


# --- tether -----------------------------------------------------------------------------------


def _tethered(tmp_path: Path, *, started: bool = True) -> tuple[subprocess.Popen[bytes], int]:
    """tether running `sleep 300`, and the pid of the sleep (with `started=False`, as soon as
    it is forked, maybe before it runs `sleep`)."""
    tether = subprocess.Popen(
        [sys.executable, "-m", "cli.local.tether", "sleep", "300"], stdin=subprocess.PIPE
    )
    children = Path(f"/proc/{tether.pid}/task/{tether.pid}/children")
    deadline = time.monotonic() + 20
    while not children.read_text().split():
        assert time.monotonic() < deadline, "tether did not start its program"
        time.sleep(0.02)
    [child] = [int(p) for p in children.read_text().split()]
    # until the child runs `sleep`, it is tether's fork, between fork and exec
    while started and Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0] != b"sleep":
        assert time.monotonic() < deadline, "tether's program did not start"
        time.sleep(0.02)
    return tether, child


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


def _cleanup(tether: subprocess.Popen[bytes], *pids: int) -> None:
    if tether.stdin is not None:
        tether.stdin.close()
    for pid in (tether.pid, *pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG")
def test_tether_stops_its_program_when_stdin_closes(tmp_path: Path) -> None:
    tether, child = _tethered(tmp_path)
    try:
        assert tether.stdin is not None
        tether.stdin.close()  # the supervisor is gone
        assert tether.wait(timeout=10) == 128 + signal.SIGTERM
        assert _gone(child)
    finally:
        _cleanup(tether, child)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG")
def test_tether_passes_sigterm_on_and_takes_its_program_along_when_killed(tmp_path: Path) -> None:
    tether, child = _tethered(tmp_path)
    try:
        tether.send_signal(signal.SIGTERM)  # `rmq down`, `rmq restart`
        assert tether.wait(timeout=10) == 128 + signal.SIGTERM
        assert _gone(child)
    finally:
        _cleanup(tether, child)
    tether, child = _tethered(tmp_path)
    try:
        tether.kill()  # `rmq kill prometheus`: the kernel sends the program SIGTERM
        tether.wait(timeout=10)
        assert _gone(child)
    finally:
        _cleanup(tether, child)


def test_status_json_names_the_prometheus_url() -> None:
    """The supervisor's snapshot carries the web URL (what `rmq status --json` prints)."""
    from cli.local.supervisor import Supervisor

    plan = with_prometheus(plan_cluster(), BINARY, port=19090)
    sup = Supervisor(plan, Path("/tmp/x"), lambda e: None, local_prometheus.probe, node_command)
    snap = sup.snapshot()
    assert snap["prometheus"] == "http://127.0.0.1:19090"
    assert [n["name"] for n in snap["nodes"]][-1] == "prometheus"
    json.dumps(snap)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_tether_stopped_while_it_starts_its_program_leaves_nothing(
    tmp_path: Path, how: signal.Signals
) -> None:
    """A signal between fork and exec: the fork must neither swallow it (it runs a copy of
    tether's handler until exec) nor miss tether's death (the kernel signals only later ones)."""
    for _ in range(5):
        tether, child = _tethered(tmp_path, started=False)
        try:
            tether.send_signal(how)
            tether.wait(timeout=10)
            assert _gone(child)
        finally:
            _cleanup(tether, child)
