"""Every code block of README.md runs, as written, so the README cannot drift from the code.

How each kind of block runs:

* The Quickstart `make` block: `make -n` shows each target exists and runs what the README says
  (`make test` cannot run inside `make test`); `make up` is `rmq up`, which runs below.
* Everything else that needs a cluster runs in ONE session, in order, as a reader would follow
  the README: in a network namespace of its own (the README's fixed ports 9876, 10911, ... are
  free there, whatever else runs on the machine) and a PID namespace (whatever is left running
  dies with it). `tests/readme_netns.py` runs the steps and hands back a transcript:
  1. `rmq up` in the foreground (what `make up` runs) until `ready`;
  2. the "Using it" commands, line by line (`-f` is followed until a new message shows up,
     then Ctrl-C);
  3. the Python blocks, each with the venv's `python`; the RocketMQ 5 client's block with the
     python of that client's own venv (tests/interop/py5_venv.py: it and the C++ client both
     install a `rocketmq` module), against broker-a's gRPC endpoint;
  4. Ctrl-C to the foreground cluster;
  5. the tour's `$ ` commands, each checked against the output lines the README shows
     (pids are wildcards, `...` matches anything);
  6. the TOML block as `cluster.toml`, started with `rmq up --config cluster.toml --detach`.
* The Spark block runs in the shared Spark test session: tests/pipeline/test_readme_spark.py.

A block no runner claims fails `test_every_block_is_run`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import readme_blocks as readme
from tests.interop.py5_venv import ensure_py5_python

ROOT = Path(__file__).resolve().parents[1]

BLOCKS = readme.blocks()
FOLLOW_PROBE = "readme-follow-probe"


def kind(block: readme.Block) -> str | None:
    if readme.is_spark(block):
        return "spark"  # tests/pipeline/test_readme_spark.py
    if block.lang == "sh" and block.text.lstrip().startswith("make "):
        return "quickstart"
    if block.lang == "sh" and block.text.lstrip().startswith("rmq "):
        return "commands"
    if block.lang == "console" and block.text.lstrip().startswith("$ "):
        return "tour"
    if block.lang == "toml":
        return "topology"
    if block.lang == "python" and "from rocketmq import" in block.text:
        return "python5"  # the official RocketMQ 5 client, `rocketmq-python-client`
    if block.lang == "python":
        return "python"
    if block.lang == "yaml" and "scrape_configs:" in block.text:
        return "prometheus"
    return None


def of_kind(k: str) -> list[readme.Block]:
    return [b for b in BLOCKS if kind(b) == k]


def test_every_block_is_run() -> None:
    unclaimed = [str(b) for b in BLOCKS if kind(b) is None]
    assert not unclaimed, f"no test runs these README blocks: {unclaimed}"
    kinds = ("quickstart", "commands", "topology", "spark", "python5")
    counts = {k: len(of_kind(k)) for k in kinds}
    assert counts == {"quickstart": 1, "commands": 1, "topology": 1, "spark": 1, "python5": 1}
    assert len(of_kind("tour")) >= 3 and len(of_kind("python")) >= 2


def test_prometheus_config_is_valid(tmp_path: Path) -> None:
    # Prometheus's own checker (Debian's prometheus package, installed by .ci/run)
    (block,) = of_kind("prometheus")
    config = tmp_path / "prometheus.yml"
    config.write_text(block.text)
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (.ci/run installs Debian's prometheus)"
    r = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_readme_links_stay_inside_the_repository() -> None:
    # a clone has only its own files: every path the README links to must exist
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_no_tracked_file_points_outside_the_repository() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30
    ).stdout.split(b"\0")
    needle = "../" + "shared"  # spelled apart so this file does not match itself
    bad = []
    for name in filter(None, listed):
        path = ROOT / name.decode()
        if path.is_file() and needle.encode() in path.read_bytes():
            bad.append(name.decode())
    assert not bad, f"tracked files mention {needle}: {bad}"


def test_quickstart_make_targets_run_what_the_readme_says() -> None:
    (block,) = of_kind("quickstart")
    targets = [
        line.split("#")[0].split()[1]
        for line in block.text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert targets == ["up", "test"]
    for target, recipe in (("up", ".venv/bin/rmq up"), ("test", ".venv/bin/pytest")):
        done = subprocess.run(
            ["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert recipe in done.stdout


# --- the session in namespaces --------------------------------------------------------------


def _tour_steps() -> list[dict]:
    steps = []
    for block in of_kind("tour"):
        for line in block.text.splitlines():
            if line.startswith("$ "):
                steps.append({"op": "run", "cmd": line[2:], "timeout": 120})
    return steps


def _command_steps() -> list[dict]:
    (block,) = of_kind("commands")
    steps = []
    for line in block.text.splitlines():
        if not line.strip():
            continue
        if re.search(r"\s-f(\s|$)", line.split("#")[0]):
            probe = f"rmq produce --topic Orders {FOLLOW_PROBE}"
            steps.append(
                {
                    "op": "follow",
                    "cmd": line.split("#")[0].strip(),
                    "probe": probe,
                    "expect": FOLLOW_PROBE,
                    "timeout": 30,
                }
            )
        else:
            # 100,000 lines through `rmq produce` is the slow one
            steps.append({"op": "run", "cmd": line, "timeout": 240})
    return steps


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.fail("the README test needs root and unshare (network + PID namespaces)")
    work = tmp_path_factory.mktemp("readme")
    python_blocks = of_kind("python")
    (python5,) = of_kind("python5")
    (topology,) = of_kind("topology")
    # built (or found cached) out here: the session's namespace has no network for pip
    py5_python = ensure_py5_python()
    steps: list[dict] = [
        {"op": "start", "cmd": "rmq up", "until": "ready", "timeout": 60, "stop_on_failure": 1},
        *_command_steps(),
        *(
            {"op": "run", "cmd": "python -", "stdin": b.text, "timeout": 120, "block": b.line}
            for b in python_blocks
        ),
        {
            "op": "run",
            "cmd": f"{py5_python} -",
            "stdin": python5.text,
            "timeout": 120,
            "block": python5.line,
        },
        {"op": "stop", "signal": "SIGINT"},
        *_tour_steps(),
        {"op": "write", "path": "cluster.toml", "text": topology.text},
        {
            "op": "run",
            "cmd": "rmq up --config cluster.toml --detach --data-dir toml-cluster",
            "timeout": 90,
        },
        {"op": "run", "cmd": "rmq down --data-dir toml-cluster", "timeout": 60},
    ]
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(work),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "160",
        # a worktree run with PYTHONPATH=$PWD tests its own code, not the venv's editable one
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
    }
    proc = subprocess.run(
        [
            "unshare",
            "--net",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "--",
            sys.executable,
            str(ROOT / "tests" / "readme_netns.py"),
        ],
        input=json.dumps({"workdir": str(work), "env": env, "steps": steps}),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    transcript = json.loads(proc.stdout)
    report = "\n".join(
        f"{e['seconds']:7.2f} s  rc={e['rc']}  {e.get('cmd', e['op'])}" for e in transcript
    )
    print("README session:\n" + report)
    return {"steps": transcript, "work": work}


def _entry(session: dict, cmd: str) -> dict:
    found = [e for e in session["steps"] if e.get("cmd") == cmd]
    assert found, f"step {cmd!r} did not run (an earlier step failed?)"
    return found[0]


def _ok(session: dict, cmd: str) -> str:
    e = _entry(session, cmd)
    assert e["rc"] == 0, f"`{cmd}` exited {e['rc']}:\n{e['out'][-3000:]}"
    return e["out"]


def _pattern(expected: str) -> re.Pattern:
    """A README output line as a regex: pids vary, `...` is elided text, spacing is free, and
    a path under `.rmq/` may be printed relative or absolute."""
    parts = re.split(r"(\.\.\.|pid \d+|\.rmq/\S*|\s+)", expected.strip())
    rx = []
    for part in parts:
        if part == "...":
            rx.append(".*")
        elif part.startswith("pid "):
            rx.append(r"pid \d+")
        elif part.startswith(".rmq/"):
            rx.append(r"(\S*/)?" + re.escape(part))
        elif part and part.isspace():
            rx.append(r"\s+")
        else:
            rx.append(re.escape(part))
    return re.compile("".join(rx))


@pytest.mark.integration
@pytest.mark.slow
def test_foreground_cluster_starts_and_stops_on_ctrl_c(session: dict[str, Any]) -> None:
    start = session["steps"][0]
    assert start["op"] == "start" and start["rc"] == 0, start["out"]
    for node in ("namesrv", "broker-a", "broker-a-s1"):
        assert node in start["out"]
    stop = next(e for e in session["steps"] if e["op"] == "stop")
    assert stop["rc"] == 130, stop["out"][-3000:]  # Ctrl-C's status, after a clean stop


@pytest.mark.integration
@pytest.mark.slow
def test_using_it_commands(session: dict[str, Any]) -> None:
    (block,) = of_kind("commands")
    lines = [line for line in block.text.splitlines() if line.strip()]
    outs = {}
    for line in lines:
        if re.search(r"\s-f(\s|$)", line.split("#")[0]):
            continue
        outs[line.split("#")[0].strip()] = _ok(session, line)
    by_start = {k.split(" --")[0].split(" '")[0]: v for k, v in outs.items()}
    assert "Orders" in by_start["rmq topic create Orders"]
    # the consume example shows the messages the README's produce example sent, all of them,
    # nothing else, in the order sent (one batch, one queue), as the README says
    [sent] = [ln for ln in lines if ln.startswith("rmq produce") and "'" in ln]
    bodies = re.findall(r"'([^']*)'", sent.split("#")[0])
    [reader] = [ln for ln in lines if ln.startswith("rmq consume") and "--group billing" in ln]
    consumed = outs[reader.split("#")[0].strip()]
    assert [ln for ln in consumed.splitlines() if ln.strip()] == bodies, consumed
    assert (
        "billing" in outs["rmq group progress billing"]
        or "Orders" in outs["rmq group progress billing"]
    )
    assert (
        "order-1" in outs["rmq message query --topic Orders --key order-1"]
        or '"id": 1' in outs["rmq message query --topic Orders --key order-1"]
    )
    json.loads(outs["rmq broker status 127.0.0.1:10911 --json"])
    assert "broker-a" in outs["rmq cluster"]


@pytest.mark.integration
@pytest.mark.slow
def test_follow_waits_for_new_messages_only(session: dict[str, Any]) -> None:
    e = next(e for e in session["steps"] if e["op"] == "follow")
    assert e["probe_rc"] == 0, e["probe_out"]
    assert e["seen"], f"`{e['cmd']}` did not print the new message:\n{e['out'][-2000:]}"
    # "follow: wait for new messages": the topic's earlier messages are not printed first
    assert '{"id": 1}' not in e["out"], e["out"][:2000]
    assert e["rc"] in (0, 130, -2), e["out"][-2000:]


@pytest.mark.integration
@pytest.mark.slow
def test_python_blocks(session: dict[str, Any]) -> None:
    for block in of_kind("python"):
        e = next(x for x in session["steps"] if x.get("block") == block.line)
        assert e["rc"] == 0, f"{block} failed:\n{e['out'][-3000:]}"
        assert "SEND_OK" in e["out"], f"{block}:\n{e['out']}"
        if "send_in_transaction" in block.text:  # no listener: the local transaction's outcome
            assert "SEND_OK LocalTransactionState.COMMIT_MESSAGE" in e["out"], e["out"]
            print(f"{block}:\n{e['out']}")
            continue
        # the listener printed what the block itself sent
        bodies = re.findall(r'Message\("Payments", (b"[^"]*")', block.text)
        assert bodies
        assert f"Payments paid {bodies[0].replace(chr(34), chr(39))}" in e["out"], e["out"]
        print(f"{block}:\n{e['out']}")


@pytest.mark.integration
@pytest.mark.slow
def test_tour_commands_print_what_the_readme_shows(session: dict[str, Any]) -> None:
    for block in of_kind("tour"):
        cmd = None
        expected: dict[str, list[str]] = {}
        for line in block.text.splitlines():
            if line.startswith("$ "):
                cmd = line[2:]
                expected[cmd] = []
            elif line.strip():
                assert cmd is not None, f"output before the first `$ ` line of {block}"
                expected[cmd].append(line)
        for cmd, lines in expected.items():
            out = _ok(session, cmd)
            for want in lines:
                rx = _pattern(want)
                assert any(rx.search(got) for got in out.splitlines()), (
                    f"`{cmd}` did not print a line like {want!r}:\n{out[-3000:]}"
                )


@pytest.mark.integration
@pytest.mark.slow
def test_topology_file_starts_its_cluster(session: dict[str, Any]) -> None:
    out = _ok(session, "rmq up --config cluster.toml --detach --data-dir toml-cluster")
    for want in (
        "broker-a ",
        "broker-b ",
        "broker-a-s1",
        "broker-b-s1",
        "127.0.0.1:20911",
        "127.0.0.1:10911",
        "SYNC_MASTER",
        "ready",
    ):
        assert want in out, f"{want!r} missing:\n{out}"
    _ok(session, "rmq down --data-dir toml-cluster")


@pytest.mark.integration
@pytest.mark.slow
def test_python5_block_sends_receives_and_acks(session: dict[str, Any]) -> None:
    (block,) = of_kind("python5")
    e = next(x for x in session["steps"] if x.get("block") == block.line)
    assert e["rc"] == 0, f"{block} failed:\n{e['out'][-3000:]}"
    # what the block sent is what it received, by the client-made message id and the body
    sent = re.findall(r"^sent (\S+)$", e["out"], re.M)
    got = re.findall(r"^received Coupons issued (b'[^']*') (\S+)$", e["out"], re.M)
    assert len(sent) == 1 and len(got) == 1, e["out"]
    body = re.search(r'msg\.body, msg\.tag = "Coupons", (b"[^"]*")', block.text)
    assert body, block.text
    assert got[0] == (body.group(1).replace(chr(34), chr(39)), sent[0]), e["out"]
    print(f"{block}:\n{e['out']}")
