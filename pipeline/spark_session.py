"""Which Python runs Spark's Python workers, and a SparkSession whose workers can run ours.

Theory of operation: the "rocketmq" data sources are Python classes that Spark pickles on the
driver and unpickles in Python worker processes, which the JVM starts. PySpark (classic, 4.x)
decides that worker interpreter once, when the SparkContext is made: `sc.pythonExec`, taken
from the environment variable PYSPARK_PYTHON, else plain `python3` looked up on PATH. Every
Python function Spark wraps later (a UDF, a data source registration) carries that string
to the JVM. So a driver run as `.venv/bin/python job.py` without the venv activated gets
workers running the system `python3`, which cannot import this project (`No module named
'cattrs'`), and the job fails only when the first task runs.

Two remedies, both here:

* `session()` sets PYSPARK_PYTHON to this interpreter (`sys.executable`) before it builds the
  SparkSession, unless the caller set PYSPARK_PYTHON or a SparkContext exists already.
* `check_worker_python(spark)` (called by `register`, which is `pipeline.register`) asks
  whether the context's worker interpreter can import the pipeline. If it cannot and the
  master is local (the workers run on this machine, so this interpreter is a valid
  choice), it points `sc.pythonExec` at `sys.executable`, which every function wrapped
  from then on carries, the data sources registered right after included, and logs a
  warning. On a cluster master it only warns: only the cluster knows which Python its nodes
  have. spark-submit users set PYSPARK_PYTHON (docs/pipeline.md).

The check runs the candidate interpreter once (about 0.3 s) unless it is this very
interpreter, and remembers the answer per path.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pyspark (and its JVM gateway) loads only when a session is asked for
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# what a worker must be able to import to run our data sources and sink
_PROBE = "import cattrs, pyarrow, trio, pipeline.data_source"


def session(
    app: str = "trio-rmq-pipeline", *, master: str | None = None, **conf: str
) -> SparkSession:
    """A SparkSession with the "rocketmq" formats registered, whose workers run this
    interpreter (see the module docstring). `conf` entries are Spark settings, e.g.
    `session(**{"spark.sql.shuffle.partitions": "4"})`; `master` defaults to Spark's own
    default (local[*] outside spark-submit)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is None:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app).config("spark.sql.session.timeZone", "UTC")
    if master is not None:
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def register(spark: SparkSession) -> None:
    """Register the "rocketmq" and "rocketmq-store" formats with `spark`.

    First makes sure the session's Python workers can import this project (a local session
    whose workers would run another `python3` is switched to this interpreter, with a warning;
    see `check_worker_python`): the data sources are registered with that interpreter.
    """
    from pipeline.data_source import RocketMQDataSource

    check_worker_python(spark)

    spark.dataSource.register(RocketMQDataSource)
    try:
        from pipeline.store_source import RocketMQStoreDataSource
    except ModuleNotFoundError as exc:
        if exc.name != "pipeline.store_source":
            raise
        # a checkout without the store reader still serves live topics
        log.warning("pipeline.store_source missing: no rocketmq-store")
        return
    spark.dataSource.register(RocketMQStoreDataSource)


def check_worker_python(spark: SparkSession) -> str:
    """The interpreter the session's Python workers run, fixed to `sys.executable` when it
    cannot import the pipeline and the master is local; a warning either way."""
    sc = spark.sparkContext
    exe = sc.pythonExec
    if worker_python_ok(exe):
        return exe
    # a running context always has spark.master; without one it is not known to be local
    if (sc.master or "").startswith("local"):
        log.warning(
            "Spark's Python workers would run %r, which cannot import the pipeline; using %s "
            "instead (set PYSPARK_PYTHON to choose)",
            exe,
            sys.executable,
        )
        sc.pythonExec = sys.executable
        return sys.executable
    log.warning(
        "Spark's Python workers run %r, which cannot import the pipeline on this machine; "
        "set PYSPARK_PYTHON to an interpreter with trio-rmq installed on every node",
        exe,
    )
    return exe


@functools.lru_cache(maxsize=8)
def worker_python_ok(exe: str) -> bool:
    """Whether the interpreter `exe` (a path, or a name looked up on PATH) can import the
    pipeline's modules."""
    path = shutil.which(exe)
    if path is None:
        return False
    # not realpath: a venv's python is a symlink to a base interpreter without the venv
    if os.path.abspath(path) == os.path.abspath(sys.executable):
        return True
    try:
        done = subprocess.run(
            [path, "-c", _PROBE], capture_output=True, timeout=60, cwd=os.getcwd(), check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
