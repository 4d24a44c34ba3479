"""Send a few messages with the async (Trio) client.

rmq up &                                   # local nameserver + broker-a
python examples/quickstart_producer.py     # RMQ_NAMESRV overrides 127.0.0.1:9876
"""

from __future__ import annotations

import os

import trio

from rmq import Message, Producer


async def main() -> None:
    namesrv = os.environ.get("RMQ_NAMESRV", "127.0.0.1:9876")
    async with Producer("quickstart-producer", namesrv) as producer:
        for i in range(10):
            msg = Message("TopicTest", f"Hello RocketMQ {i}", tags="TagA", keys=f"key-{i}")
            result = await producer.send(msg)
            print(result.status.name, result.msg_id, result.message_queue, result.queue_offset)
        batch = [Message("TopicTest", f"batch {i}") for i in range(3)]
        print("batch", (await producer.send_batch(batch)).msg_id)


if __name__ == "__main__":
    trio.run(main)
