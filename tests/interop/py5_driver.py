"""Drive the official RocketMQ 5 Python client (`rocketmq-python-client`) from the command line.

Runs in the client's own venv (tests/interop/py5_venv.py), never in the project's: the tests
start it as a subprocess with a scratch HOME (the client logs under $HOME/logs/rocketmq_python).
Every event is one JSON line on stdout; the test parses them. Importing the client is not
optional: if it is missing this exits non-zero with the import error and the test fails.

    produce --endpoint HOST:PORT --topic T --count N
            [--type normal|fifo|delay|transaction] [--groups K] [--delay-s S]
            [--tags-cycle a,b] [--prefix P] [--props k=v,...]
            [--tx-action commit|rollback|none] [--checker commit|rollback|unknown]
            [--wait-checks N] [--check-timeout S] [--retry-for S]
    simple-consume --endpoint E --topic T --group G --expect N --timeout S
            [--tag-expr X | --sql X] [--invisible S] [--batch B] [--await S]
            [--no-ack-every M --no-ack-attempts K] [--withhold-invisible S]
            [--change-invisible S] [--linger S]
    push-consume --endpoint E --topic T --group G --expect N --timeout S
            [--tag-expr X | --sql X] [--fail-every M --fail-attempts K] [--linger S]
    bench-send --endpoint E --topic T --count N --inflight K [--size B]
    bench-receive --endpoint E --topic T --group G --count N [--batch B] [--invisible S]

Common: `--tls` (the client's `tls_enable`), `--ca FILE` (trusted roots for it: the client
verifies the server certificate against grpc's defaults, GRPC_DEFAULT_SSL_ROOTS_FILE_PATH),
`--request-timeout S`, `--access-key AK --secret-key SK` (the client's Credentials: it signs
every call). A failed send or receive reports the exception's RocketMQ code (`code`).

Every message carries the user property `seq` (its index) and, for FIFO, `grp` (its message
group); bodies are `<prefix>body-<i>`. A consumer's `recv` event reports the delivery attempt
(`attempt`), `ack` what it acked; `done` ends every run with `complete` (the expected number was
reached within the timeout).

`--retry-for S` (failover tests): a send that fails is retried, the same message, every 0.2 s
for up to S seconds from its first attempt, each retry a `failover_retry` event. `--ack-retry`
(simple-consume, failover tests): a failed ack is retried every 0.2 s while the message is still
invisible (until a second before its invisible time ends), each failure an `ack_error` event;
a retry refused as an invalid handle within that time is an `ack_stored` event (an earlier try
was stored and its answer lost).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

_emit_lock = threading.Lock()


# apache/rocketmq-apis definition.proto, Code: the handle is expired or not valid
INVALID_RECEIPT_HANDLE = 40013


def error_code(exc: BaseException) -> int | None:
    """The RocketMQ status code a client exception carries (its ``code`` attribute), if any.

    grpc's own errors have a ``code()`` method instead: those carry no RocketMQ code.
    """
    code = getattr(exc, "code", None)
    return code if isinstance(code, int) else None


def emit(**event: object) -> None:
    line = json.dumps(event) + "\n"
    with _emit_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def _config(args: argparse.Namespace) -> Any:
    from rocketmq import ClientConfiguration, Credentials

    credentials = Credentials(args.access_key, args.secret_key)
    return ClientConfiguration(args.endpoint, credentials, request_timeout=args.request_timeout)


def _filter(args: argparse.Namespace) -> Any:
    from rocketmq import FilterExpression
    from rocketmq.grpc_protocol import FilterType

    if args.sql:
        return FilterExpression(args.sql, FilterType.SQL)
    return FilterExpression(args.tag_expr, FilterType.TAG)


def _props(spec: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, spec.split(",")):
        k, _, v = item.partition("=")
        out[k] = v
    return out


def _msg_event(msg: Any) -> dict[str, Any]:
    body = msg.body.decode(errors="replace") if msg.body is not None else None
    props = dict(msg.properties)
    seq = int(props.get("seq", -1))
    return {
        "body": body,
        "msg_id": msg.message_id,
        "topic": msg.topic,
        "tag": msg.tag,
        "keys": sorted(msg.keys),
        "group": msg.message_group,
        "attempt": msg.delivery_attempt,
        "seq": seq,
        "props": props,
        "delivery_ts": msg.delivery_timestamp,
        "born_ts": msg.born_timestamp,
        "corrupted": msg.corrupted,
        "recv_ms": int(time.time() * 1000),
    }


# -- produce ------------------------------------------------------------------------------


def produce(args: argparse.Namespace) -> int:
    from rocketmq import Message, Producer, TransactionChecker, TransactionResolution

    answers = {
        "commit": TransactionResolution.COMMIT,
        "rollback": TransactionResolution.ROLLBACK,
        "unknown": TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED,
    }
    checks: list[str] = []
    checks_lock = threading.Lock()
    checked = threading.Event()

    class Checker(TransactionChecker):
        def check(self, message: Message) -> TransactionResolution:
            answer = args.checker
            with checks_lock:
                checks.append(message.message_id)
                if len(checks) >= args.wait_checks:
                    checked.set()
            emit(event="check", answer=answer, **_msg_event(message))
            return answers[answer]

    is_tx = args.type == "transaction"
    producer = Producer(
        _config(args),
        topics=(args.topic,),
        checker=Checker() if is_tx else None,
        tls_enable=args.tls,
    )
    producer.startup()
    emit(event="started")
    tags = args.tags_cycle.split(",") if args.tags_cycle else [""]
    props = _props(args.props)
    failures = retries = 0
    try:
        for i in range(args.count):
            msg = Message()
            msg.topic = args.topic
            msg.body = f"{args.prefix}body-{i}".encode()
            tag = tags[i % len(tags)]
            if tag:
                msg.tag = tag
            msg.keys = f"{args.prefix}key-{i}"
            msg.add_property("seq", str(i))
            for k, v in props.items():
                msg.add_property(k, v)
            deliver_at = None
            if args.type == "fifo":
                group = f"{args.prefix}g{i % args.groups}"
                msg.message_group = group
                msg.add_property("grp", group)
            elif args.type == "delay":
                deliver_at = int(time.time()) + args.delay_s
                msg.delivery_timestamp = deliver_at
            first = time.monotonic()
            while True:
                try:
                    if is_tx:
                        tx = producer.begin_transaction()
                        receipt = producer.send(msg, tx)
                        if args.tx_action == "commit":
                            tx.commit()
                        elif args.tx_action == "rollback":
                            tx.rollback()
                    else:
                        receipt = producer.send(msg)
                    break
                except Exception as exc:
                    if args.retry_for and time.monotonic() - first < args.retry_for:
                        retries += 1
                        emit(event="failover_retry", i=i, error=repr(exc))
                        time.sleep(0.2)
                        continue
                    failures += 1
                    emit(event="send_error", i=i, error=repr(exc), code=error_code(exc))
                    receipt = None
                    break
            if receipt is not None:
                emit(
                    event="sent",
                    i=i,
                    msg_id=receipt.message_id,
                    tx_id=receipt.transaction_id,
                    offset=receipt.offset,
                    queue=str(receipt.message_queue),
                    deliver_at=deliver_at,
                    sent_ms=int(time.time() * 1000),
                )
            if args.interval_ms:
                time.sleep(args.interval_ms / 1000)
        if args.wait_checks:
            # the producer stays up (its telemetry stream open) until the broker checked back
            emit(event="waiting_checks", n=args.wait_checks)
            checked.wait(args.check_timeout)
            time.sleep(args.linger)  # the EndTransaction of the last answer goes out
    finally:
        producer.shutdown()
    emit(event="done", failures=failures, failover_retries=retries, checks=len(checks))
    return 0


# -- consumers ----------------------------------------------------------------------------


class Tally:
    """What a consumer has seen: done when `expect` distinct bodies were acked."""

    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.acked: set[str] = set()
        self.deliveries = 0
        self.lock = threading.Lock()
        self.done = threading.Event()

    def delivered(self) -> None:
        with self.lock:
            self.deliveries += 1

    def ack(self, body: str) -> None:
        with self.lock:
            self.acked.add(body)
            if len(self.acked) >= self.expect:
                self.done.set()


def _withhold(args: argparse.Namespace, seq: int, attempt: int | None) -> bool:
    """Whether this delivery is left unacked (or failed) on purpose."""
    every = getattr(args, "no_ack_every", 0) or getattr(args, "fail_every", 0)
    attempts = getattr(args, "no_ack_attempts", 0) or getattr(args, "fail_attempts", 0)
    return bool(every) and seq % every == 0 and (attempt or 1) <= attempts


def simple_consume(args: argparse.Namespace) -> int:
    from rocketmq import SimpleConsumer

    consumer = SimpleConsumer(
        _config(args),
        args.group,
        subscription={args.topic: _filter(args)},
        await_duration=args.await_s,
        tls_enable=args.tls,
    )
    consumer.startup()
    emit(event="started")
    tally = Tally(args.expect)
    deadline = time.monotonic() + args.timeout
    errors = 0
    try:
        while time.monotonic() < deadline and not tally.done.is_set():
            try:
                messages = consumer.receive(args.batch, args.invisible)
            except Exception as exc:
                errors += 1
                emit(event="receive_error", error=repr(exc), code=error_code(exc))
                time.sleep(0.5)
                continue
            received = time.monotonic()
            for msg in messages:
                tally.delivered()
                ev = _msg_event(msg)
                emit(event="recv", **ev)
                seq = int(ev["seq"])
                if _withhold(args, seq, msg.delivery_attempt):
                    emit(event="no_ack", body=ev["body"], attempt=msg.delivery_attempt, seq=seq)
                    if args.withhold_invisible:
                        # left unacked, but due back after this many seconds
                        try:
                            consumer.change_invisible_duration(msg, args.withhold_invisible)
                            emit(event="changed", body=ev["body"], seconds=args.withhold_invisible)
                        except Exception as exc:
                            emit(event="change_error", body=ev["body"], error=repr(exc))
                    continue
                if args.change_invisible and msg.delivery_attempt == 1:
                    # first delivery: ask for more time, then ack with the new handle
                    try:
                        consumer.change_invisible_duration(msg, args.change_invisible)
                        emit(event="changed", body=ev["body"], seconds=args.change_invisible)
                    except Exception as exc:
                        emit(event="change_error", body=ev["body"], error=repr(exc))
                        continue
                # With --ack-retry a failed ack is retried, the same handle, while the message
                # stays invisible: a failover can store an ack and lose its answer, and a
                # message acked that way never comes back.  A retry answered
                # INVALID_RECEIPT_HANDLE inside the invisible time means an earlier try was
                # stored (the handle is not yet expired, and nothing else acks it): reported
                # as `ack_stored`, counted as acked.
                ack_until = received + args.invisible - 1 if args.ack_retry else 0.0
                tries = 0
                while True:
                    tries += 1
                    try:
                        consumer.ack(msg)
                    except Exception as exc:
                        code = error_code(exc)
                        emit(event="ack_error", body=ev["body"], error=repr(exc), code=code)
                        within = time.monotonic() < ack_until
                        if tries > 1 and within and code == INVALID_RECEIPT_HANDLE:
                            emit(event="ack_stored", body=ev["body"], seq=seq)
                            tally.ack(str(ev["body"]))
                        elif within:
                            time.sleep(0.2)
                            continue
                    else:
                        emit(event="ack", body=ev["body"], msg_id=msg.message_id, seq=seq)
                        tally.ack(str(ev["body"]))
                    break
        complete = tally.done.is_set()
        # keep receiving a while: anything acked that comes again is a duplicate
        linger_end = time.monotonic() + args.linger
        while time.monotonic() < linger_end:
            try:
                messages = consumer.receive(args.batch, args.invisible)
            except Exception as exc:
                emit(event="receive_error", error=repr(exc), code=error_code(exc))
                time.sleep(0.5)
                continue
            for msg in messages:
                emit(event="recv", late=True, **_msg_event(msg))
                consumer.ack(msg)
    finally:
        consumer.shutdown()
    emit(
        event="done",
        complete=complete,
        acked=len(tally.acked),
        deliveries=tally.deliveries,
        receive_errors=errors,
    )
    return 0


def push_consume(args: argparse.Namespace) -> int:
    from rocketmq import ConsumeResult, MessageListener, PushConsumer

    tally = Tally(args.expect)

    class Listener(MessageListener):
        def consume(self, message: Any) -> ConsumeResult:
            tally.delivered()
            ev = _msg_event(message)
            seq = int(ev["seq"])
            if _withhold(args, seq, message.delivery_attempt):
                emit(event="fail", **ev)
                return ConsumeResult.FAILURE
            emit(event="recv", **ev)
            tally.ack(str(ev["body"]))
            return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        _config(args),
        args.group,
        Listener(),
        {args.topic: _filter(args)},
        consumption_thread_count=args.threads,
        tls_enable=args.tls,
    )
    consumer.startup()
    emit(event="started", fifo=consumer.fifo)
    complete = tally.done.wait(args.timeout)
    time.sleep(args.linger)  # acks land; late repeats show up as duplicates
    consumer.shutdown()
    emit(event="done", complete=complete, acked=len(tally.acked), deliveries=tally.deliveries)
    return 0


# -- bench --------------------------------------------------------------------------------


def bench_send(args: argparse.Namespace) -> int:
    from rocketmq import Message, Producer

    producer = Producer(_config(args), topics=(args.topic,), tls_enable=args.tls)
    producer.startup()
    body = b"x" * args.size
    sem = threading.Semaphore(args.inflight)
    errors = [0]
    latencies: list[float] = []
    lat_lock = threading.Lock()
    all_done = threading.Event()
    remaining = [args.count]

    def make(i: int) -> Any:
        msg = Message()
        msg.topic = args.topic
        msg.body = body
        msg.add_property("seq", str(i))
        return msg

    # warm-up: the route and the channel, outside the clock
    producer.send(make(-1))
    t0 = time.perf_counter()
    if args.inflight == 1:
        for i in range(args.count):
            s = time.perf_counter()
            try:
                producer.send(make(i))
            except Exception:
                errors[0] += 1
            latencies.append(time.perf_counter() - s)
    else:

        def finished(started: float, fut: Any) -> None:
            with lat_lock:
                latencies.append(time.perf_counter() - started)
                if fut.exception() is not None:
                    errors[0] += 1
                remaining[0] -= 1
                if remaining[0] == 0:
                    all_done.set()
            sem.release()

        for i in range(args.count):
            sem.acquire()
            started = time.perf_counter()
            fut = producer.send_async(make(i))
            fut.add_done_callback(lambda f, s=started: finished(s, f))
        all_done.wait(args.timeout)
    elapsed = time.perf_counter() - t0
    producer.shutdown()
    latencies.sort()
    emit(
        event="bench",
        mode="send",
        inflight=args.inflight,
        count=args.count,
        errors=errors[0],
        seconds=elapsed,
        rate=args.count / elapsed if elapsed else 0.0,
        p50_ms=1000 * latencies[len(latencies) // 2] if latencies else None,
        p99_ms=1000 * latencies[int(len(latencies) * 0.99)] if latencies else None,
    )
    return 0


def bench_receive(args: argparse.Namespace) -> int:
    from rocketmq import SimpleConsumer

    consumer = SimpleConsumer(
        _config(args),
        args.group,
        subscription={args.topic: _filter(args)},
        await_duration=args.await_s,
        tls_enable=args.tls,
    )
    consumer.startup()
    got = errors = 0
    t0 = time.perf_counter()
    deadline = time.monotonic() + args.timeout
    while got < args.count and time.monotonic() < deadline:
        try:
            messages = consumer.receive(args.batch, args.invisible)
        except Exception:
            errors += 1
            continue
        for msg in messages:
            try:
                consumer.ack(msg)
                got += 1
            except Exception:
                errors += 1
    elapsed = time.perf_counter() - t0
    consumer.shutdown()
    emit(
        event="bench",
        mode="receive",
        batch=args.batch,
        count=got,
        errors=errors,
        seconds=elapsed,
        rate=got / elapsed if elapsed else 0.0,
    )
    return 0


# -- main ---------------------------------------------------------------------------------


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", required=True, help="host:port of the gRPC endpoint")
    p.add_argument("--tls", action="store_true", help="the client's tls_enable")
    p.add_argument("--ca", default="", help="PEM roots the client trusts for --tls")
    p.add_argument("--request-timeout", type=int, default=5, help="seconds")
    p.add_argument("--topic", required=True)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--access-key", default="", help="the client's Credentials (plain ACL)")
    p.add_argument("--secret-key", default="")


def _consumer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group", required=True)
    p.add_argument("--tag-expr", default="*")
    p.add_argument("--sql", default="")
    p.add_argument("--expect", type=int, default=0)
    p.add_argument("--linger", type=float, default=1.0)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser()
    sub = root.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("produce")
    _common(p)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--type", choices=["normal", "fifo", "delay", "transaction"], default="normal")
    p.add_argument("--groups", type=int, default=1, help="FIFO: message groups, i mod K")
    p.add_argument("--delay-s", type=int, default=0, help="DELAY: delivery_timestamp = now + S")
    p.add_argument("--tags-cycle", default="")
    p.add_argument("--prefix", default="")
    p.add_argument("--props", default="", help="user properties k=v,k2=v2 on every message")
    p.add_argument("--tx-action", choices=["commit", "rollback", "none"], default="commit")
    p.add_argument("--checker", choices=["commit", "rollback", "unknown"], default="commit")
    p.add_argument("--wait-checks", type=int, default=0, help="stay up until N check-backs")
    p.add_argument("--check-timeout", type=float, default=60.0)
    p.add_argument("--linger", type=float, default=1.0)
    p.add_argument("--interval-ms", type=int, default=0)
    p.add_argument("--retry-for", type=float, default=0.0)
    s = sub.add_parser("simple-consume")
    _common(s)
    _consumer_args(s)
    s.add_argument("--invisible", type=int, default=10, help="invisible duration, seconds")
    s.add_argument("--batch", type=int, default=16)
    s.add_argument("--await-s", type=int, default=2, help="long polling, seconds")
    s.add_argument("--no-ack-every", type=int, default=0, help="leave seq %% M == 0 unacked")
    s.add_argument("--no-ack-attempts", type=int, default=0, help="... while attempt <= K")
    s.add_argument(
        "--change-invisible", type=int, default=0, help="first delivery: seconds, then ack"
    )
    s.add_argument("--withhold-invisible", type=int, default=0, help="unacked ones: seconds")
    s.add_argument("--ack-retry", action="store_true", help="retry a failed ack while invisible")
    c = sub.add_parser("push-consume")
    _common(c)
    _consumer_args(c)
    c.add_argument("--fail-every", type=int, default=0, help="FAILURE for seq %% M == 0")
    c.add_argument("--fail-attempts", type=int, default=0, help="... while attempt <= K")
    c.add_argument("--threads", type=int, default=4)
    b = sub.add_parser("bench-send")
    _common(b)
    b.add_argument("--count", type=int, default=1000)
    b.add_argument("--inflight", type=int, default=1)
    b.add_argument("--size", type=int, default=128)
    r = sub.add_parser("bench-receive")
    _common(r)
    _consumer_args(r)
    r.add_argument("--count", type=int, default=1000)
    r.add_argument("--batch", type=int, default=32)
    r.add_argument("--invisible", type=int, default=30)
    r.add_argument("--await-s", type=int, default=2)
    return root


def _log_tail() -> str:
    log = Path.home() / "logs" / "rocketmq_python" / "rocketmq_client.log"
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-80:])
    except OSError:
        return "(no client log)"


def main() -> int:
    args = parser().parse_args()
    if args.ca:
        # read by grpc's core when it first needs roots: set before the first channel
        os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = args.ca
    run = {
        "produce": produce,
        "simple-consume": simple_consume,
        "push-consume": push_consume,
        "bench-send": bench_send,
        "bench-receive": bench_receive,
    }[args.cmd]
    try:
        return run(args)
    except Exception:
        traceback.print_exc()
        print("--- client log tail ---\n" + _log_tail(), file=sys.stderr)
        return 2


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # the client's executors and scheduler threads must not keep a finished run alive
    os._exit(code)
