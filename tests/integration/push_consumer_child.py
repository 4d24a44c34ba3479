"""One push consumer as its own OS process, for tests/integration/test_push_consumer.py.

Usage: python push_consumer_child.py NAMESRV GROUP TOPIC OUT_DIR NAME

Appends one line per delivered message to OUT_DIR/NAME.log: "<wall time> <body>", flushed
after each listener call (so a SIGKILL loses at most the line being written, and offsets
are committed only after the line is flushed). Every 0.2 s it rewrites OUT_DIR/NAME.queues
with the queue ids of TOPIC it currently owns (written then renamed). SIGTERM ends it
cleanly: offsets persisted, UNREGISTER_CLIENT sent.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rmq import ConsumeFromWhere, PushConsumer


async def main(namesrv: str, group: str, topic: str, out_dir: str, name: str) -> None:
    out = Path(out_dir)
    # blocking writes on purpose: a flushed line means "consumed" before the offset moves
    log = open(out / f"{name}.log", "a", buffering=1 << 16)  # noqa: ASYNC230

    async def listener(msgs):
        now = time.time()
        for m in msgs:
            log.write(f"{now:.3f} {m.body.decode()}\n")
        log.flush()

    consumer = PushConsumer(
        group,
        namesrv,
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
        instance_name=name,
        consume_batch_max_size=16,
        rebalance_interval=20.0,
    )
    consumer.subscribe(topic)
    consumer.register_listener(listener)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with consumer:
            async with trio.open_nursery() as nursery:

                async def report() -> None:
                    path = out / f"{name}.queues"
                    while True:
                        ids = sorted(
                            f"{mq.brokerName}:{mq.queueId}"
                            for mq in consumer.assigned_queues()
                            if mq.topic == topic
                        )
                        tmp = path.with_suffix(".tmp")
                        tmp.write_text(" ".join(ids) + "\n")
                        os.replace(tmp, path)
                        await trio.sleep(0.2)

                nursery.start_soon(report)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break
    log.close()


if __name__ == "__main__":
    namesrv, group, topic, out_dir, name = sys.argv[1:6]
    trio.run(main, namesrv, group, topic, out_dir, name)
