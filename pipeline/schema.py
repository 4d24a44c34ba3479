"""The fixed row schema of every trio-rmq Spark source (live topics and store files).

One message is one row.  The schema is given twice, as Spark DDL (what ``DataSource.schema()``
returns) and as the pyarrow schema of the record batches the readers yield; Spark rejects a
batch whose Arrow types differ from the declared ones, so :func:`arrow_schema` is exactly the
Arrow form Spark expects for the DDL: ``int`` -> int32, ``long`` -> int64, ``binary`` ->
binary, ``string`` -> string (32-bit offsets), ``map<string,string>`` -> map<string, string>,
``timestamp`` -> timestamp[us, tz=UTC] (Spark's TimestampType is microseconds since the epoch
in UTC; a test runs a batch through a real session to hold this).

RocketMQ's timestamps are milliseconds since the epoch; readers multiply by 1000.
No pyspark import here: the driver-side options code and the decoder use it without Spark.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pyarrow loads only when the Arrow schema is first asked for
    import pyarrow as pa

COLUMNS = (
    "topic",
    "brokerName",
    "queueId",
    "queueOffset",
    "body",
    "tags",
    "keys",
    "properties",
    "msgId",
    "bornTimestamp",
    "storeTimestamp",
    "reconsumeTimes",
)

SPARK_SCHEMA_DDL = (
    "topic string, brokerName string, queueId int, queueOffset long, body binary, "
    "tags string, keys string, properties map<string,string>, msgId string, "
    "bornTimestamp timestamp, storeTimestamp timestamp, reconsumeTimes int"
)


@functools.cache
def arrow_schema() -> pa.Schema:
    """The pyarrow form of :data:`SPARK_SCHEMA_DDL` (all fields nullable, like Spark's DDL)."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            pa.field("topic", pa.string()),
            pa.field("brokerName", pa.string()),
            pa.field("queueId", pa.int32()),
            pa.field("queueOffset", pa.int64()),
            pa.field("body", pa.binary()),
            pa.field("tags", pa.string()),
            pa.field("keys", pa.string()),
            pa.field("properties", pa.map_(pa.string(), pa.string())),
            pa.field("msgId", pa.string()),
            pa.field("bornTimestamp", ts),
            pa.field("storeTimestamp", ts),
            pa.field("reconsumeTimes", pa.int32()),
        ]
    )
