"""Drive the official RocketMQ C++ client (PyPI `rocketmq==0.4.4`) from the command line.

The interop tests run this file as a subprocess with HOME set to a scratch directory (the
client writes its logs under $HOME/logs) so a crash or hang inside librocketmq can never take
the test runner with it. Every event is one JSON line on stdout; the test parses them.

    produce --namesrv A --topic T --group G --count N [--tags-cycle a,b] [--prefix P]
            [--threads K] [--interval-ms M] [--retry-for S]
    consume --namesrv A --topic T --group G --expect N --timeout S [--fail-first-every K]
            [--stop-after N] [--expect-total M]

`--expect-total M` ends a consume after M deliveries, repeats included (a group whose offsets
are reset while it runs receives messages again).

Several threads sharing one producer (`--threads K`, K > 1) meet a known fault of the client:
now and then a send fails with "No route info of this topic" although the route is there
(librocketmq's transport lock times out spuriously: `GetTransport of:<addr> get timed_mutex
timeout` in its log; apache/rocketmq-client-cpp issues 224, 455, 456; about 0.4% of sends with 8
threads). Only then, and only for exactly that error, a send is retried (at most
ROUTE_RETRIES times, after a short doubling back-off); each retry is reported as a
`route_retry` event and counted in `done`, so the test can check they stay rare. Any other error is never retried. A single-threaded
producer retries nothing: there the same message would mean a real missing route.

`--retry-for S` is for failover tests (a DLedger group losing its leader): a send that fails
for any reason is retried, the same message, every 0.2 s for up to S seconds from its first
attempt, each retry a `failover_retry` event. The client learns the new master only from its
own route refresh (every 30 s in librocketmq), so sends fail in between; nothing else retries.

Importing the client is not optional: if it is missing this exits non-zero with the import
error, and the test fails (an interop test that skips proves nothing).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rocketmq.client import PushConsumer, RecvMessage

_emit_lock = threading.Lock()  # producer threads emit too: one whole line at a time


def emit(**event: object) -> None:
    line = json.dumps(event) + "\n"
    with _emit_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def _quiet(handle_setter: str, handle: object) -> None:
    # FATAL keeps librocketmq from writing log files into the scratch HOME.
    from rocketmq import ffi

    getattr(ffi.dll, handle_setter)(handle, ffi._CLogLevel.FATAL)


# the C++ client's spurious failure when threads share a producer (see the module docstring)
SHARED_PRODUCER_FAULT = "No route info of this topic"
ROUTE_RETRIES = 8


def produce(args: argparse.Namespace) -> int:
    from rocketmq.client import Message, Producer

    producer = Producer(args.group, timeout=args.send_timeout_ms)
    _quiet("SetProducerLogLevel", producer._handle)
    producer.set_namesrv_addr(args.namesrv)
    if args.access_key:
        producer.set_session_credentials(args.access_key, args.secret_key, "ALIYUN")
    producer.start()
    tags = args.tags_cycle.split(",") if args.tags_cycle else [""]
    lock = threading.Lock()
    counts = {"failures": 0, "route_retries": 0, "failover_retries": 0}
    shared = args.threads > 1

    def send_one(i: int) -> None:
        msg = Message(args.topic)
        tag = tags[i % len(tags)]
        if tag:
            msg.set_tags(tag)
        msg.set_keys(f"{args.prefix}key-{i}")
        msg.set_body(f"{args.prefix}body-{i}")
        msg.set_property("seq", str(i))
        first_try = time.monotonic()
        attempt = 0
        while True:
            try:
                result = producer.send_sync(msg)
                break
            except Exception as exc:  # reported, counted, and the test decides
                if args.retry_for and time.monotonic() - first_try < args.retry_for:
                    # failover mode: the same message again until the group has a master
                    with lock:
                        counts["failover_retries"] += 1
                    emit(event="failover_retry", i=i, error=repr(exc))
                    time.sleep(0.2)
                    continue
                if shared and SHARED_PRODUCER_FAULT in str(exc) and attempt < ROUTE_RETRIES:
                    with lock:
                        counts["route_retries"] += 1
                    emit(event="route_retry", i=i, attempt=attempt, error=repr(exc))
                    # the lock times out while the other threads hold it: back off rather than
                    # contend again at once (8 threads starting together can fail one
                    # send 6 times in a row with immediate retries)
                    time.sleep(0.02 * 2**attempt)
                    attempt += 1
                    continue
                with lock:
                    counts["failures"] += 1
                emit(event="send_error", i=i, error=repr(exc))
                return
        emit(
            event="sent", i=i, status=int(result.status), msg_id=result.msg_id, offset=result.offset
        )
        if args.interval_ms:
            time.sleep(args.interval_ms / 1000)

    def worker(first: int) -> None:
        for i in range(first, args.count, args.threads):
            send_one(i)

    try:
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(args.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        producer.shutdown()
    emit(event="done", threads=args.threads, **counts)
    return 0


def _subscribe(
    consumer: PushConsumer, topic: str, callback: Callable[[RecvMessage], None], expression: str
) -> None:
    """PushConsumer.subscribe, with a callback that returns its status instead of raising.

    The 0.4.4 wrapper's own callback re-raises the listener's exception inside the ctypes
    callback (after `return RECONSUME_LATER`, in a `finally`), so librocketmq receives an
    undefined status and sometimes counts a failed message as consumed. Registering the
    callback ourselves keeps the C++ client itself untouched and tells it RECONSUME_LATER
    the way a C or Java listener would.
    """
    from rocketmq.client import RecvMessage
    from rocketmq.exceptions import ffi_check
    from rocketmq.ffi import _CConsumeStatus, dll

    def on_message(_consumer: object, msg: object) -> int:
        try:
            callback(RecvMessage(msg))
        except Exception:
            return _CConsumeStatus.RECONSUME_LATER.value
        return _CConsumeStatus.CONSUME_SUCCESS.value

    ffi_check(dll.Subscribe(consumer._handle, topic.encode(), expression.encode()))
    consumer._register_callback(on_message)


def consume(args: argparse.Namespace) -> int:
    from rocketmq.client import PushConsumer

    consumer = PushConsumer(args.group)
    _quiet("SetPushConsumerLogLevel", consumer._handle)
    consumer.set_namesrv_addr(args.namesrv)
    if args.access_key:
        consumer.set_session_credentials(args.access_key, args.secret_key, "ALIYUN")
    consumer.set_thread_count(2)
    lock = threading.Lock()
    seen: set[str] = set()
    delivered = [0]
    done = threading.Event()

    def on_message(msg: RecvMessage) -> None:
        body = msg.body.decode()
        seq = int(msg.get_property("seq") or -1)
        fail = (
            args.fail_first_every and seq % args.fail_first_every == 0 and msg.reconsume_times == 0
        )
        emit(
            event="fail" if fail else "recv",
            body=body,
            tags=msg.tags.decode() if isinstance(msg.tags, bytes) else msg.tags,
            keys=msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys,
            id=msg.id,
            topic=msg.topic,
            queue_id=msg.queue_id,
            queue_offset=msg.queue_offset,
            store_timestamp=msg.store_timestamp,
            reconsume_times=msg.reconsume_times,
            seq=seq,
        )
        if fail:
            raise RuntimeError("asked to fail this message once")
        with lock:
            seen.add(body)
            delivered[0] += 1
            if args.expect_total:
                if delivered[0] >= args.expect_total:
                    done.set()
            elif len(seen) >= args.expect:
                done.set()

    _subscribe(consumer, args.topic, on_message, args.expression)
    consumer.start()
    emit(event="started")
    finished = done.wait(args.timeout)
    # Let in-flight acks land so the offset committed at shutdown covers what we saw.
    time.sleep(args.linger)
    consumer.shutdown()
    emit(event="done", complete=finished, unique=len(seen))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("produce")
    p.add_argument("--namesrv", required=True)
    p.add_argument("--access-key", default="", help="session credentials (plain ACL)")
    p.add_argument("--secret-key", default="")
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="interop-producer")
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--tags-cycle", default="")
    p.add_argument("--prefix", default="")
    p.add_argument("--send-timeout-ms", type=int, default=5000)
    p.add_argument("--threads", type=int, default=1, help="threads sharing the one producer")
    p.add_argument("--interval-ms", type=int, default=0, help="pause after each send")
    p.add_argument(
        "--retry-for",
        type=float,
        default=0.0,
        help="failover mode: retry a failed send (any error) for up to this many seconds",
    )
    c = sub.add_parser("consume")
    c.add_argument("--namesrv", required=True)
    c.add_argument("--access-key", default="", help="session credentials (plain ACL)")
    c.add_argument("--secret-key", default="")
    c.add_argument("--topic", required=True)
    c.add_argument("--group", required=True)
    c.add_argument("--expression", default="*")
    c.add_argument("--expect", type=int, required=True)
    c.add_argument("--timeout", type=float, default=60.0)
    c.add_argument("--linger", type=float, default=1.0)
    c.add_argument("--fail-first-every", type=int, default=0)
    c.add_argument(
        "--expect-total",
        type=int,
        default=0,
        help="done after this many deliveries, repeats included",
    )
    args = parser.parse_args()
    return produce(args) if args.cmd == "produce" else consume(args)


if __name__ == "__main__":
    sys.exit(main())
