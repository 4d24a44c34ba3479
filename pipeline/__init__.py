"""PySpark data source and sink for trio-rmq topics (needs the `spark` extra).

`import pipeline` works without pyspark; `pipeline.register(spark)` imports the data source
modules and registers "rocketmq" (live topics: batch/stream read and write) and
"rocketmq-store" (CommitLog segment files of a broker's store directory) with the session.
Registrations are per SparkSession. `pipeline.session()` builds a SparkSession whose Python
workers run this interpreter, with both formats registered (`pipeline/spark_session.py`).
"""

from __future__ import annotations

import logging

__all__ = ["register", "session"]


def session(app: str = "trio-rmq-pipeline", *, master: str | None = None, **conf: str):
    """A SparkSession whose workers run this interpreter, formats registered
    (`pipeline.spark_session.session`)."""
    from pipeline.spark_session import session as _session

    return _session(app, master=master, **conf)


def register(spark) -> None:
    """Register the "rocketmq" and "rocketmq-store" formats with `spark`.

    First makes sure the session's Python workers can import this project (a local session
    whose workers would run another `python3` is switched to this interpreter, with a warning;
    see `pipeline/spark_session.py`): the data sources are registered with that interpreter.
    """
    from pipeline.data_source import RocketMQDataSource
    from pipeline.spark_session import check_worker_python

    check_worker_python(spark)

    spark.dataSource.register(RocketMQDataSource)
    try:
        from pipeline.store_source import RocketMQStoreDataSource
    except ModuleNotFoundError as exc:
        if exc.name != "pipeline.store_source":
            raise
        # a checkout without the store reader still serves live topics
        logging.getLogger(__name__).warning("pipeline.store_source missing: no rocketmq-store")
        return
    spark.dataSource.register(RocketMQStoreDataSource)
