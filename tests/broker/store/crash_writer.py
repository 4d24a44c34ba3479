"""Writer for test_crash.py: puts messages under SYNC_FLUSH and prints each acknowledged one.

Run as ``python crash_writer.py <store root> <seed>``.  After ``ready`` it loops forever; every
line ``ack <queueId> <queueOffset> <physOffset> <body length> <body crc32>`` is printed (and
flushed) only after the store answered PUT_OK.  The test SIGKILLs this process at random moments.
"""

from __future__ import annotations

import random
import sys
import zlib
from typing import Any

import trio

from broker.store import MessageStoreConfig, PutMessageStatus, run_message_store
from common.message import MessageExtBrokerInner

CONFIG: dict[str, Any] = dict(
    flush_disk_type="SYNC_FLUSH",
    mapped_file_size_commit_log=16 * 1024,
    mapped_file_size_consume_queue=20 * 64,
    max_hash_slot_num=32,
    max_index_num=64,
    flush_interval_consume_queue=0.05,
)


def message(rng: random.Random, qid: int, n: int) -> MessageExtBrokerInner:
    body = (b"%d-" % n) + rng.randbytes(rng.randrange(1, 1500))
    return MessageExtBrokerInner(
        topic="CrashT",
        queue_id=qid,
        body=body,
        properties={"KEYS": f"k{n}", "TAGS": rng.choice(["a", "b"])},
        born_host=("127.0.0.1", 1),
        store_host=("127.0.0.1", 10911),
    )


async def main(root: str, seed: int) -> None:
    rng = random.Random(seed)
    cfg = MessageStoreConfig(store_path_root_dir=root, **CONFIG)
    out = sys.stdout
    async with trio.open_nursery() as nursery:
        store = await nursery.start(run_message_store, cfg)
        out.write("ready\n")
        out.flush()
        n = seed * 1_000_000
        while True:
            qid = rng.randrange(3)
            if rng.random() < 0.3:
                msgs = [message(rng, qid, n + i) for i in range(rng.randrange(2, 5))]
                n += len(msgs)
                r = await store.put_messages(msgs)
            else:
                msgs = [message(rng, qid, n)]
                n += 1
                r = await store.put_message(msgs[0])
            if r.status is not PutMessageStatus.PUT_OK:
                continue
            # each member's physical offset is the tail of its offset msgId
            ids = r.append.msg_id.split(",")
            lines = [
                f"ack {qid} {r.append.logics_offset + i} {int(ids[i][-16:], 16)}"
                f" {len(m.body)} {zlib.crc32(m.body)}\n"
                for i, m in enumerate(msgs)
            ]
            out.write("".join(lines))
            out.flush()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
