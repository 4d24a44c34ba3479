"""Spark's Python workers run an interpreter that has the project, venv activated or not.

A driver started as `.venv/bin/python job.py` from a shell where `python3` is the system one
must get workers on the driver's interpreter: on the system one they fail on
`No module named 'cattrs'`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, cast

import attrs
import pytest

from pipeline import spark_session
from rmq.sync import Admin

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.conftest import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"

JOB = textwrap.dedent(
    """
    import sys
    import pipeline

    namesrv, topic = sys.argv[1], sys.argv[2]
    spark = pipeline.session("session-test", master="local[1]",
                             **{"spark.ui.enabled": "false"})
    try:
        df = spark.createDataFrame([(f"m{i}".encode(), "t") for i in range(5)], "body binary, tags string")
        df.write.format("rocketmq").option("namesrv", namesrv).option("topic", topic).mode("append").save()
        got = spark.read.format("rocketmq").option("namesrv", namesrv).option("topic", topic).load()
        print("ROWS", sorted(bytes(r.body).decode() for r in got.collect()))
        print("WORKER", spark.sparkContext.pythonExec)
    finally:
        spark.stop()
    """
)


def test_system_python3_cannot_run_the_pipeline() -> None:
    # the premise of the subprocess test below: PATH's python3 there is not a usable worker
    assert Path(SYSTEM_PYTHON).exists()
    assert not spark_session.worker_python_ok(SYSTEM_PYTHON)
    assert spark_session.worker_python_ok(sys.executable)


@pytest.mark.spark
@pytest.mark.integration
@pytest.mark.slow
def test_session_runs_workers_on_this_interpreter_without_venv_on_path(
    module_cluster: LocalCluster,
) -> None:
    topic = f"Session_{uuid.uuid4().hex[:8]}"
    with Admin(module_cluster.namesrv_addr) as admin:
        admin.create_topic(topic, queues=2)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/bin:/bin"  # python3 here is the system one, without cattrs
    proc = subprocess.run(
        [sys.executable, "-c", JOB, module_cluster.namesrv_addr, topic],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "ROWS ['m0', 'm1', 'm2', 'm3', 'm4']" in proc.stdout
    assert f"WORKER {sys.executable}" in proc.stdout


@attrs.define
class _Context:
    pythonExec: str
    master: str


@attrs.define
class _Session:
    sparkContext: _Context


def _as_spark(fake: _Session) -> SparkSession:
    # check_worker_python reads sparkContext.master and .pythonExec only, which the fake has
    return cast("SparkSession", fake)


def test_register_check_switches_a_local_session_to_this_interpreter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spark = _Session(_Context(SYSTEM_PYTHON, "local[2]"))
    with caplog.at_level(logging.WARNING, logger="pipeline.spark_session"):
        assert spark_session.check_worker_python(_as_spark(spark)) == sys.executable
    assert spark.sparkContext.pythonExec == sys.executable
    assert "cannot import the pipeline" in caplog.text


def test_register_check_only_warns_on_a_cluster_master(caplog: pytest.LogCaptureFixture) -> None:
    spark = _Session(_Context(SYSTEM_PYTHON, "spark://somewhere:7077"))
    with caplog.at_level(logging.WARNING, logger="pipeline.spark_session"):
        assert spark_session.check_worker_python(_as_spark(spark)) == SYSTEM_PYTHON
    assert spark.sparkContext.pythonExec == SYSTEM_PYTHON
    assert "PYSPARK_PYTHON" in caplog.text


def test_register_check_keeps_a_good_interpreter(caplog: pytest.LogCaptureFixture) -> None:
    spark = _Session(_Context(sys.executable, "local[2]"))
    with caplog.at_level(logging.WARNING, logger="pipeline.spark_session"):
        assert spark_session.check_worker_python(_as_spark(spark)) == sys.executable
    assert not caplog.text
