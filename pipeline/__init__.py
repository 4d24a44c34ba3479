"""PySpark data source and sink for trio-rmq topics (needs the `spark` extra).

`import pipeline` works without pyspark; `pipeline.register(spark)` imports the data source
modules and registers "rocketmq" (live topics: batch/stream read and write) and
"rocketmq-store" (CommitLog segment files of a broker's store directory) with the session.
Registrations are per SparkSession.
"""

from __future__ import annotations

import logging

__all__ = ["register"]


def register(spark) -> None:
    """Register the "rocketmq" and "rocketmq-store" formats with `spark`."""
    from pipeline.data_source import RocketMQDataSource

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
