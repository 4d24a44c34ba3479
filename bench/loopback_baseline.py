"""The floor under every request/response number: bare loopback round trips on this host.

    .venv/bin/python bench/loopback_baseline.py [--runs 3] [--count 5000]

Theory of operation: a trio-based broker answering one request at a time can never beat a bare
trio echo of the same sizes, so this measures that echo, with nothing else in the processes:
a 1.2 KiB request (a SEND_MESSAGE frame with a 1 KiB body is about that) and a 100-byte answer,
one round trip at a time, over TCP on 127.0.0.1 with TCP_NODELAY, between

* two processes using blocking sockets (what the kernel and the host's cores cost), and
* two processes each running a trio loop (what `await stream.send_all/receive_some` adds).

It also times a trivial Python loop, so numbers from different hosts can be compared.
Each case runs `--runs` times; min / median / max are printed. The server is a child
process of this script, ended by its pid when the case is done.
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
import timeit

REQUEST = b"q" * 1200
ANSWER = b"a" * 100


def _blocking_server(port: int) -> None:
    with socket.socket() as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", port))
        ls.listen()
        print("listening", flush=True)
        conn, _ = ls.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        got = 0
        while True:
            data = conn.recv(65536)
            if not data:
                return
            got += len(data)
            while got >= len(REQUEST):
                got -= len(REQUEST)
                conn.sendall(ANSWER)


def _trio_server(port: int) -> None:
    import trio

    async def handler(stream: trio.SocketStream) -> None:
        got = 0
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return
            got += len(data)
            while got >= len(REQUEST):
                got -= len(REQUEST)
                await stream.send_all(ANSWER)

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        print("listening", flush=True)
        await trio.serve_listeners(handler, listeners)

    trio.run(main)


def _recv_answer(sock: socket.socket) -> None:
    need = len(ANSWER)
    while need:
        need -= len(sock.recv(need))


def _blocking_client(port: int, count: int) -> float:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        for _ in range(count):
            s.sendall(REQUEST)
            _recv_answer(s)
        return time.perf_counter() - t0


def _trio_client(port: int, count: int) -> float:
    import trio

    async def main() -> float:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            t0 = time.perf_counter()
            for _ in range(count):
                await stream.send_all(REQUEST)
                need = len(ANSWER)
                while need:
                    need -= len(await stream.receive_some(need))
            return time.perf_counter() - t0

    return trio.run(main)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_case(kind: str, count: int) -> float:
    """Round trips per second of one run of `kind` ("blocking" | "trio")."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "listening":
            raise RuntimeError(f"{kind} server did not start")
        client = _blocking_client if kind == "blocking" else _trio_client
        seconds = client(port, count)
        return count / seconds
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--count", type=int, default=5000, help="round trips per run")
    ap.add_argument("--serve", choices=("blocking", "trio"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        (_blocking_server if args.serve == "blocking" else _trio_server)(args.port)
        return 0

    loop_us = min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6
    print(f"python: sum(range(1000)) takes {loop_us:.1f} us (best of 5)")
    print(f"load average: {os.getloadavg()[0]:.2f}")
    for kind in ("blocking", "trio"):
        rates = [one_case(kind, args.count) for _ in range(args.runs)]
        med = statistics.median(rates)
        print(
            f"{kind:<8} 2-process ping-pong (1200 B -> 100 B): round trips/s "
            f"min {min(rates):,.0f} median {med:,.0f} max {max(rates):,.0f} "
            f"(median {1e6 / med:.0f} us per round trip)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
