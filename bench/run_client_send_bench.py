"""The client's CPU per `Producer.send`, against a broker that costs the client nothing to wait for.

    .venv/bin/python bench/run_client_send_bench.py [--count 20000] [--runs 3]

Theory of operation. The send path's client (`rmq/producer.py`, `common/remoting/client.py`,
the channel's write and read loop) is timed on its own (issue 28): a stub process on loopback
is the nameserver and the broker at one address. It answers a route request with one broker of
8 queues, a send with a canned SendMessageResponseHeader (the request's opaque, code 0), and
anything else with success. Its answers cost it no store and no replica, so the client's
per-send CPU (getrusage of this process, around the timed part) is the only figure here that
our client code moves; the stub's own CPU is not counted. `Producer.send` runs one at a time
and 32 in flight (32 tasks), `--count` sends each after 500 untimed ones, in `--runs` runs;
the best and the median of the runs are printed in CPU microseconds per send (user + system,
and user alone: Python is user time, the socket calls mostly system time). The host's load
moves even the CPU per send (cache, contention), so `--calls` also counts the Python calls per
send under cProfile (one at a time and 32 in flight, `--count` sends each): a number the load
does not move; `--profile` prints the top of that profile too.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

TOPIC = "ClientSendBench"
BODY = b"x" * 1024
INFLIGHT = 32
WARMUP = 500


def _route(port: int) -> bytes:
    from common.serde import to_json

    addr = f"127.0.0.1:{port}"
    return to_json(
        {
            "brokerDatas": [
                {"cluster": "DefaultCluster", "brokerName": "broker-a", "brokerAddrs": {"0": addr}}
            ],
            "queueDatas": [
                {
                    "brokerName": "broker-a",
                    "readQueueNums": 8,
                    "writeQueueNums": 8,
                    "perm": 6,
                    "topicSysFlag": 0,
                }
            ],
        }
    )


def _stub(port: int) -> None:
    """The stub nameserver + broker (a child process)."""
    from common.remoting.codec import FrameDecoder, encode
    from common.remoting.codes import RequestCode
    from common.remoting.command import RESPONSE_FLAG, RemotingCommand

    route = _route(port)
    offsets = [0]

    def answer(req: RemotingCommand) -> bytes:
        ext: dict[str, str] = {}
        body = b""
        if req.code == RequestCode.SEND_MESSAGE_V2:
            offsets[0] += 1
            ext = {
                "msgId": "7F00000100002A9F0000000000000000",
                "queueId": req.ext_fields.get("e", "0"),
                "queueOffset": str(offsets[0]),
                "MSG_REGION": "DefaultRegion",
                "TRACE_ON": "true",
            }
        elif req.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            body = route
        return encode(
            RemotingCommand(
                code=0, opaque=req.opaque, flag=RESPONSE_FLAG, ext_fields=ext, body=body
            )
        )

    async def serve(stream: trio.SocketStream) -> None:
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        dec = FrameDecoder()
        try:
            while data := await stream.receive_some(65536):
                out = b"".join(answer(r) for r in dec.feed(data) if not r.flag & 2)  # not oneway
                if out:
                    await stream.send_all(out)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        print("listening", flush=True)
        await trio.serve_listeners(serve, listeners)

    trio.run(main)


def _cpu() -> tuple[float, float]:
    """(user, system) CPU seconds of this process."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


async def _bench(
    port: int, count: int, runs: int, calls: bool, profile: bool
) -> dict[str, list[float]]:
    from rmq import Message, Producer, SendStatus

    out: dict[str, list[float]] = {
        "one": [],
        "one, user": [],
        "inflight32": [],
        "inflight32, user": [],
    }
    async with Producer("client_send_bench", f"127.0.0.1:{port}", send_timeout=10) as p:

        async def send() -> None:
            r = await p.send(Message(TOPIC, BODY))
            if r.status is not SendStatus.SEND_OK:
                raise RuntimeError(f"send answered {r.status}")

        async def drive(n: int, inflight: int) -> None:
            left = n

            async def worker() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await send()

            async with trio.open_nursery() as nursery:
                for _ in range(inflight):
                    nursery.start_soon(worker)

        if calls:
            for name, inflight in (("one", 1), ("inflight32", INFLIGHT)):
                await drive(WARMUP, inflight)
                prof = cProfile.Profile()
                prof.enable()
                await drive(count, inflight)
                prof.disable()
                stats = pstats.Stats(prof)
                out[f"calls {name}"] = [stats.total_calls / count]  # type: ignore[attr-defined]
                if profile:
                    print(f"--- {name}: {count} sends")
                    stats.sort_stats("tottime").print_stats(30)
        for _ in range(runs):
            for name, inflight in (("one", 1), ("inflight32", INFLIGHT)):
                await drive(WARMUP, inflight)
                u0, s0 = _cpu()
                await drive(count, inflight)
                u1, s1 = _cpu()
                out[name].append(1e6 * (u1 - u0 + s1 - s0) / count)
                out[f"{name}, user"].append(1e6 * (u1 - u0) / count)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--calls", action="store_true", help="also count Python calls per send")
    ap.add_argument("--profile", action="store_true", help="--calls, and print the profile")
    ap.add_argument("--stub", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.stub:
        _stub(a.stub)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    stub = subprocess.Popen(
        [sys.executable, __file__, "--stub", str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert stub.stdout is not None
        if stub.stdout.readline().strip() != "listening":
            raise RuntimeError("the stub did not start")
        t0 = time.perf_counter()
        res = trio.run(_bench, port, a.count, a.runs, a.calls or a.profile, a.profile)
        load = Path("/proc/loadavg").read_text().split()[0]
        print(f"client CPU us per send, {a.runs} runs of {a.count} (best / median; runs):")
        for name, vals in res.items():
            if name.startswith("calls"):
                print(f"Python {name}: {vals[0]:.1f} per send")
                continue
            runs = ", ".join(f"{v:.1f}" for v in vals)
            print(f"{name:17s} {min(vals):6.1f} {statistics.median(vals):6.1f}   ({runs})")
        print(f"wall {time.perf_counter() - t0:.1f} s, 1-minute load average at the end {load}")
    finally:
        stub.terminate()  # only the stub started here, by its pid
        try:
            stub.wait(timeout=5)
        except subprocess.TimeoutExpired:
            stub.kill()
            stub.wait(timeout=5)


if __name__ == "__main__":
    main()
