"""Fixtures of the Spark tests: ONE local[2] SparkSession for the whole test run.

A SparkSession costs 5-15 s to start on this 2-core machine, so every pipeline test module
shares the session (distinct topics per test keep them apart). pyspark and Java are required:
a missing one fails the run at import or session start (never a skip).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

import pipeline


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Spark starts its Python workers with `python3` from PATH unless told otherwise; they must
    # run this interpreter (the venv with the project installed), whatever PATH says.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("trio-rmq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    pipeline.register(session)
    try:
        yield session
    finally:
        session.stop()
