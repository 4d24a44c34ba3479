"""PySpark data source and sink for trio-rmq topics (needs the `spark` extra).

`import pipeline` works without pyspark; `pipeline.register(spark)` imports the data source
modules and registers "rocketmq" (live topics: batch/stream read and write) and
"rocketmq-store" (CommitLog segment files of a broker's store directory) with the session.
Registrations are per SparkSession. `pipeline.session()` builds a SparkSession whose Python
workers run this interpreter, with both formats registered (`pipeline/spark_session.py`).
"""

from __future__ import annotations

# the functions live in pipeline/spark_session.py, which imports only the standard library at
# module level, so `import pipeline` still works without pyspark
from pipeline.spark_session import register, session

__all__ = ["register", "session"]
