"""The Spark tests share ONE local[2] SparkSession: the ``spark`` fixture of tests/conftest.py
(the DLedger stream test of tests/integration uses it too).

A SparkSession costs 5-15 s to start on this 2-core machine, so every pipeline test module
shares the session (distinct topics per test keep them apart). pyspark and Java are required:
a missing one fails the run at import or session start (never a skip).
"""

from __future__ import annotations

import pyspark  # noqa: F401  (imported here so a missing pyspark fails collection, not a skip)
