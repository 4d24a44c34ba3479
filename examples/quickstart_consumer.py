"""Read every queue of a topic from the beginning with the synchronous client.

python examples/quickstart_consumer.py
"""

from __future__ import annotations

import os

from rmq import PullStatus
from rmq.sync import PullConsumer


def main() -> None:
    namesrv = os.environ.get("RMQ_NAMESRV", "127.0.0.1:9876")
    with PullConsumer("quickstart-consumer", namesrv) as consumer:
        for mq in consumer.fetch_queues("TopicTest"):
            offset = max(consumer.query_offset(mq), consumer.min_offset(mq))
            while True:
                result = consumer.pull(mq, offset, tags="*")
                for msg in result.messages:
                    print(f"{mq.brokerName}:{mq.queueId}@{msg.queue_offset}", msg.body.decode())
                offset = result.next_begin_offset
                if result.status is not PullStatus.FOUND:
                    break
            consumer.commit_offset(mq, offset)  # the next run continues from here


if __name__ == "__main__":
    main()
