"""The README's Spark block runs as written, in the shared Spark test session.

Only the cluster's address and store directory differ from the README: the block's
`127.0.0.1:9876` and `.rmq/broker-a` are replaced by this module's cluster's (each replacement
must find its target, so a README edit cannot slip past). `pipeline.session()` in the block
returns the session of the test run (getOrCreate). tests/test_readme.py runs the other blocks.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rmq.sync import Admin, PullConsumer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.conftest import LocalCluster

ROOT = Path(__file__).resolve().parents[2]


def _spark_block():
    spec = importlib.util.spec_from_file_location(
        "readme_blocks", ROOT / "tests" / "readme_blocks.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (block,) = [b for b in module.blocks() if module.is_spark(b)]
    return block


def _read_all(namesrv: str, topic: str, timeout: float = 20.0) -> list:
    deadline = time.monotonic() + timeout
    with PullConsumer("readme-spark-check", namesrv) as consumer:
        while True:
            msgs = []
            for mq in consumer.fetch_queues(topic):
                offset = 0
                while batch := consumer.pull(mq, offset, 256).messages:
                    msgs.extend(batch)
                    offset += len(batch)
            if msgs or time.monotonic() > deadline:
                return msgs
            time.sleep(0.2)


@pytest.mark.spark
@pytest.mark.integration
def test_readme_spark_block(spark: SparkSession, module_cluster: LocalCluster) -> None:
    block = _spark_block()
    code = block.text
    for readme_value, ours in (
        ("127.0.0.1:9876", module_cluster.namesrv_addr),
        (".rmq/broker-a", str(module_cluster.data_dir / "broker-a")),
    ):
        assert readme_value in code, f"{block} no longer uses {readme_value}: update this test"
        code = code.replace(readme_value, ours)
    with Admin(module_cluster.namesrv_addr) as admin:
        admin.create_topic("Orders", queues=2)  # the README's "Using it" made it
    ns: dict = {"__name__": "readme_spark"}
    exec(compile(code, str(block), "exec"), ns)

    assert ns["spark"] is spark  # pipeline.session() reuses the running session
    assert ns["orders"].isStreaming
    written = _read_all(module_cluster.namesrv_addr, "Totals")
    assert [(m.tags, m.body) for m in written] == [("daily", b'{"orders": 3}')]
    # the store source reads the broker's files: the Totals message is in them
    rows = ns["audit"].where("topic = 'Totals'").collect()
    assert [bytes(r.body) for r in rows] == [b'{"orders": 3}']
