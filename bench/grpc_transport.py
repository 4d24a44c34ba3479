"""The gRPC transport choice: our h2-on-Trio server against grpcio's server in threads.

    .venv/bin/python bench/grpc_transport.py [--runs 3] [--one 2000] [--many 6000]

Theory of operation: the broker's handlers are Trio code, so a gRPC server for them is either

* **h2 on Trio** (common/grpc): HTTP/2 parsed sans-I/O in the broker's own Trio loop, a handler
  called directly; or
* **grpcio in threads**: grpcio's synchronous server (its C core does HTTP/2, a thread pool runs
  handlers), each handler bridged into the Trio loop with ``trio.from_thread.run`` (the
  broker's state lives there), the way it would have to be wired into the broker.

Both servers run the same unary method, a SendMessage-like echo (a ``SendMessageRequest`` with
one 1 KiB message in, a ``SendMessageResponse`` with one entry out) in a child process of their
own. The client is the same for both: grpcio's synchronous client in this process, one call at a
time (latency) and 32 in flight (``future()``; throughput). Each case runs ``--runs`` times after
a warm-up; the median is printed, and the server's CPU seconds per call (/proc/<pid>/stat), which
is what the broker pays. Children are ended by their pid.

``--base DIR`` compares this tree's h2-on-Trio server with another checkout's (before and after
a change to common/grpc): only the Trio server, the two trees alternating run by run, and every
call carries the metadata RocketMQ 5's Python client sends (``x-mq-*``, a fresh request id
each, ``authorization``), whose header decoding is part of the server's cost.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHOD = "/apache.rocketmq.v2.MessagingService/SendMessage"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request() -> Any:
    from common.grpc.v2 import definition_pb2 as pb
    from common.grpc.v2 import service_pb2 as spb

    return spb.SendMessageRequest(
        messages=[
            pb.Message(
                topic=pb.Resource(name="BenchTopic"),
                body=b"x" * 1024,
                system_properties=pb.SystemProperties(message_id="01" + "A" * 32, tag="T"),
            )
        ]
    )


async def _answer(request: Any) -> Any:
    from common.grpc.v2 import definition_pb2 as pb
    from common.grpc.v2 import service_pb2 as spb

    entry = spb.SendResultEntry(
        status=pb.Status(code=pb.OK, message="OK"),
        message_id=request.messages[0].system_properties.message_id,
        offset=42,
    )
    return spb.SendMessageResponse(status=pb.Status(code=pb.OK, message="OK"), entries=[entry])


def serve_trio(port: int) -> None:
    import trio

    from common.grpc.server import serve_grpc
    from common.grpc.service import CallContext, unary
    from common.grpc.v2 import service_pb2 as spb

    async def handler(req: spb.SendMessageRequest, ctx: CallContext) -> spb.SendMessageResponse:
        return await _answer(req)

    async def main() -> None:
        await serve_grpc({METHOD: unary(spb.SendMessageRequest, handler)}, "127.0.0.1", port)

    trio.run(main)


def serve_grpcio(port: int) -> None:
    import grpc
    import trio

    from common.grpc.v2 import service_pb2 as spb

    async def main() -> None:
        token = trio.lowlevel.current_trio_token()

        def handler(req: Any, context: Any) -> Any:
            # the broker's state lives in the Trio loop: every call crosses into it
            return trio.from_thread.run(_answer, req, trio_token=token)

        server = grpc.server(ThreadPoolExecutor(max_workers=32))
        rpc = grpc.unary_unary_rpc_method_handler(
            handler,
            request_deserializer=spb.SendMessageRequest.FromString,
            response_serializer=spb.SendMessageResponse.SerializeToString,
        )
        service, method = METHOD.strip("/").split("/")
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {method: rpc}),)
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        await trio.sleep_forever()

    trio.run(main)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _metadata() -> list[tuple[str, str]]:
    """What rocketmq-python-client 5.x sends with every call (its Signature.metadata)."""
    return [
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-client-version", "5.1.2"),
        ("x-mq-date-time", time.strftime("%Y%m%dT%H%M%SZ")),
        ("x-mq-request-id", str(uuid.uuid4())),
        ("x-mq-client-id", "bench-host@4242@0@1a2b3c4d"),
        ("x-mq-namespace", ""),
        ("authorization", "MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature="),
    ]


def _measure(
    port: int, pid: int, count: int, inflight: int, *, metadata: bool = False
) -> dict[str, float]:
    import grpc

    from common.grpc.v2 import service_pb2 as spb

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary(
        METHOD,
        request_serializer=spb.SendMessageRequest.SerializeToString,
        response_deserializer=spb.SendMessageResponse.FromString,
    )
    request = _request()
    grpc.channel_ready_future(channel).result(timeout=10)
    md = _metadata if metadata else lambda: None
    for _ in range(200):
        call(request, timeout=5, metadata=md())
    cpu0 = _cpu_seconds(pid)
    latencies: list[float] = []
    start = time.perf_counter()
    if inflight == 1:
        for _ in range(count):
            t = time.perf_counter()
            call(request, timeout=5, metadata=md())
            latencies.append(time.perf_counter() - t)
    else:
        pending: list[Any] = []
        sent = 0
        while sent < count or pending:
            while sent < count and len(pending) < inflight:
                pending.append(call.future(request, timeout=10, metadata=md()))
                sent += 1
            pending.pop(0).result()
    elapsed = time.perf_counter() - start
    cpu = _cpu_seconds(pid) - cpu0
    channel.close()
    out = {"calls_per_s": count / elapsed, "server_cpu_us_per_call": cpu / count * 1e6}
    if latencies:
        latencies.sort()
        out["p50_us"] = latencies[len(latencies) // 2] * 1e6
        out["p99_us"] = latencies[int(len(latencies) * 0.99)] * 1e6
    return out


def _case(
    kind: str, count: int, inflight: int, *, root: str = ROOT, metadata: bool = False
) -> dict[str, float]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, "--port", str(port)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )
    try:
        return _measure(port, proc.pid, count, inflight, metadata=metadata)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--one", type=int, default=2000)
    ap.add_argument("--many", type=int, default=6000)
    ap.add_argument("--serve", choices=["trio", "grpcio"])
    ap.add_argument("--port", type=int)
    ap.add_argument("--base", default=None, help="another checkout's Trio server to alternate with")
    args = ap.parse_args()
    if args.serve == "trio":
        serve_trio(args.port)
        return
    if args.serve == "grpcio":
        serve_grpcio(args.port)
        return
    if args.base is not None:
        compare(os.path.abspath(args.base), args)
        return
    rows = []
    for kind in ("trio", "grpcio"):
        for inflight, count in ((1, args.one), (32, args.many)):
            runs = [_case(kind, count, inflight) for _ in range(args.runs)]
            median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            rows.append((kind, inflight, median))
            print(kind, inflight, {k: round(v, 1) for k, v in median.items()}, flush=True)
    print()
    print("| server | in flight | calls/s | p50 µs | p99 µs | server CPU µs/call |")
    print("|---|---|---|---|---|---|")
    names = {"trio": "h2 on Trio (common/grpc)", "grpcio": "grpcio sync server, threads -> Trio"}
    for kind, inflight, m in rows:
        p50 = f"{m['p50_us']:.0f}" if "p50_us" in m else "-"
        p99 = f"{m['p99_us']:.0f}" if "p99_us" in m else "-"
        print(
            f"| {names[kind]} | {inflight} | {m['calls_per_s']:.0f} | {p50} | {p99} | "
            f"{m['server_cpu_us_per_call']:.0f} |"
        )


def compare(base: str, args: argparse.Namespace) -> None:
    """--base: the Trio server of `base` and of this tree, alternating, with 5.x metadata."""
    print("| tree | in flight | calls/s | p50 µs | server CPU µs/call (runs) | median |")
    print("|---|---|---|---|---|---|")
    for inflight, count in ((1, args.one), (32, args.many)):
        runs: dict[str, list[dict[str, float]]] = {"base": [], "new": []}
        for _ in range(args.runs):
            for name, root in (("base", base), ("new", ROOT)):
                runs[name].append(_case("trio", count, inflight, root=root, metadata=True))
        for name, rs in runs.items():
            cpu = [r["server_cpu_us_per_call"] for r in rs]
            rate = statistics.median(r["calls_per_s"] for r in rs)
            p50s = [r["p50_us"] for r in rs if "p50_us" in r]
            p50 = f"{statistics.median(p50s):.0f}" if p50s else "-"
            each = ", ".join(f"{c:.0f}" for c in cpu)
            print(
                f"| {name} | {inflight} | {rate:.0f} | {p50} | {each} | "
                f"{statistics.median(cpu):.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
