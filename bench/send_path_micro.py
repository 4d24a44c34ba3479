"""The Python work of one send, per process, in one process without sockets: what the event loop
and the kernel do not account for, timed so that the host's load moves it little.

    .venv/bin/python bench/send_path_micro.py [--count 20000] [--runs 5] [--profile]

Theory of operation. Each stage is the same code the real processes run, on a real file store
in a temporary directory, called directly:

* `client build`: `Producer._prepare` + `_header` + the request's frame (`channel.encode_frame`
  path: `encode_header_and_prefix`), for a 1 KiB message to a cached queue;
* `master put`: decode the request frame (`FrameDecoder.feed`), `SendMessageProcessor.send_inline`
  on a SYNC_MASTER whose replica wait is answered at once (a fake HA), encode the answer frame;
* `master put /8`: the same over a run of 8 request frames decoded from one chunk (what one read
  delivers at 32 in flight), `send_inline` per frame; `master put x8`: that run through
  `SendMessageProcessor.send_run`, as the read loop now serves it (one CommitLog write for the
  run); both printed per send (the master stages run twice, alternated);
* `client result`: decode the answer frame, `send_response` + the SendResult;
* `slave append`: `append_to_commit_log` of the master's record bytes, then the slave's reput
  (`do_reput`) over them.

Each stage runs `--count` times per run after a warm-up; the best and the median of `--runs`
runs are printed in microseconds per send. `--profile` runs cProfile over one run of each stage.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from broker.config import BrokerConfig  # noqa: E402
from broker.controller import BrokerController  # noqa: E402
from broker.processor.send import SendMessageProcessor  # noqa: E402
from broker.store import MessageStoreConfig, PutMessageStatus, run_message_store  # noqa: E402
from common.remoting.channel import Channel  # noqa: E402
from common.remoting.codec import FrameDecoder, encode, encode_header_and_prefix  # noqa: E402
from common.remoting.command import RemotingCommand  # noqa: E402
from rmq.message import Message  # noqa: E402
from rmq.producer import Producer  # noqa: E402

TOPIC = "MicroTopic"
BODY = b"x" * 1024


class _Channel:
    remote_addr = "127.0.0.1:40000"
    closed = False
    attrs: dict[str, Any] = {}


class _HA:
    """A replica that holds everything already: watch_replica answers PUT_OK at once."""

    def watch_replica(self, end: int, on_done: Callable[[PutMessageStatus], None]) -> Any:
        return PutMessageStatus.PUT_OK


RUN = 8


def _time(fn: Callable[[], object], count: int, runs: int) -> list[float]:
    for _ in range(min(count, 2000)):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.process_time()  # CPU time: what the host's load moves least
        for _ in range(count):
            fn()
        out.append(1e6 * (time.process_time() - t0) / count)
    return out


async def main(count: int, runs: int, profile: bool) -> None:
    from common.model import MessageQueue

    with tempfile.TemporaryDirectory(prefix="rmq-micro-") as tmp:
        async with trio.open_nursery() as nursery:
            scfg = MessageStoreConfig(store_path_root_dir=Path(tmp) / "m")
            cfg = BrokerConfig(listen_port=10911, store=scfg)
            store = await nursery.start(run_message_store, cfg.store)
            store.broker_role = "SYNC_MASTER"
            broker = BrokerController(cfg, store)
            broker.load()
            broker.ha = cast(Any, _HA())
            from common.model import TopicConfig

            broker.topic_config_manager.update_topic_config(
                TopicConfig(topicName=TOPIC, readQueueNums=4, writeQueueNums=4)
            )
            sp = SendMessageProcessor(broker)
            channel = cast(Channel, _Channel())
            slave_store = await nursery.start(
                run_message_store, MessageStoreConfig(store_path_root_dir=Path(tmp) / "s")
            )
            slave_store.broker_role = "SLAVE"

            producer = Producer("micro_pg", "127.0.0.1:9")
            mq = MessageQueue(TOPIC, "broker-a", 0)
            opaque = 0

            def client_build() -> bytes:
                nonlocal opaque
                msg = Message(TOPIC, BODY)
                body, props, _uniq = producer._prepare(msg)
                header = producer._header(mq, props, msg.flag, batch=False)
                cmd = producer._request(mq, lambda _mq: (header, body))
                opaque += 1
                cmd.opaque = opaque
                return encode_header_and_prefix(cmd, len(body)) + body

            frame = client_build()
            dec = FrameDecoder()
            answers: list[bytes] = []

            def master_put() -> None:
                (req,) = dec.feed(frame)
                resp = sp.send_inline(req, channel)
                assert isinstance(resp, RemotingCommand), resp
                answers.append(encode(resp))

            master_put()
            answer = answers[-1]
            req_cmd = FrameDecoder().feed(frame)[0]
            rdec = FrameDecoder()

            def client_result() -> None:
                (resp,) = rdec.feed(answer)
                r = producer._result(resp, req_cmd, mq, "uniq")
                assert r.queue_offset >= 0

            cl = store.commit_log

            def slave_append() -> None:
                # the master's records in order, from its first (every record has one size)
                off = slave_store.get_max_phy_offset()
                data = bytes(cl.read(off, size))
                assert slave_store.append_to_commit_log(off, data)
                slave_store.reput.do_reput(limit=64)

            before = cl.max_offset
            master_put()
            size = cl.max_offset - before

            # A run of RUN frames that one socket read delivers (32 in flight): the per-frame
            # path over it (send_inline each), and send_run (issue 28: one CommitLog
            # reservation and write for the run)
            frame_run = b"".join(client_build() for _ in range(RUN))

            def master_put_run() -> None:
                for req in dec.feed(frame_run):
                    resp = sp.send_inline(req, channel)
                    assert isinstance(resp, RemotingCommand), resp
                    answers.append(encode(resp))

            def master_put_group() -> None:
                for resp in sp.send_run(dec.feed(frame_run), channel):
                    assert isinstance(resp, RemotingCommand), resp
                    answers.append(encode(resp))

            stages: dict[str, Callable[[], object]] = {
                "client build": client_build,
                "master put": master_put,
                f"master put /{RUN}": master_put_run,
                f"master put x{RUN}": master_put_group,
                "master put ": master_put,
                f"master put /{RUN} ": master_put_run,
                f"master put x{RUN} ": master_put_group,
                "client result": client_result,
                "slave append": slave_append,
            }
            print(
                f"CPU us per send, {runs} runs of {count} (best / median), Python calls per send:"
            )
            for name, fn in stages.items():
                per = RUN if name.strip().endswith(f"{RUN}") else 1  # sends per call
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(1000 // per):
                    fn()
                prof.disable()
                stats = pstats.Stats(prof)
                calls = cast(Any, stats).total_calls / 1000
                if profile:
                    print(f"--- {name}")
                    stats.sort_stats(os.environ.get("MICRO_SORT", "tottime")).print_stats(40)
                ts = [t / per for t in _time(fn, count // per, runs)]
                answers.clear()
                print(
                    f"{name:14s} {min(ts):7.1f} {statistics.median(ts):7.1f} {calls:6.0f}",
                    flush=True,
                )
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    trio.run(main, a.count, a.runs, a.profile)
