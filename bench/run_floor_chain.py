"""The floor of a SYNC_MASTER send: a bare chain of three Trio processes, alternated with trio-rmq.

    .venv/bin/python bench/run_floor_chain.py [--rounds 3] [--one 3000] [--inflight-count 20000]
    .venv/bin/python bench/run_floor_chain.py --rounds 1 --profile /tmp/floor-prof

Theory of operation. A replicated send needs four hops: the client writes its request to the
master, the master writes the message to the slave, the slave acknowledges, the master answers
the client. The chain does only those hops, on loopback (TCP_NODELAY), with Trio on every side:

* `floor`: the client writes 4 bytes of length and a 1 KiB body; the master forwards each
  complete frame to the slave; the slave answers 8 bytes (the count of frames it has, as the HA
  slave reports its max offset); the master answers the client 100 bytes per frame that ack
  covers. No store, no codec. Each side is one Trio task per socket (the master: a task reading
  the client and writing the slave, a task reading the slave and writing the client); frames
  that arrive together leave together (one `send_all`), as the HA stream and a pipelined
  answer writer may do too.
* `codec`: the same chain, but every hop is a remoting frame made and read with our real codec
  (`common/remoting/codec.py`): the client a SEND_MESSAGE_V2 request with the header the
  producer sends, the master a forward command to the slave, the slave a response with its
  offset, the master a SendMessageResponseHeader answer per request. That is what the protocol
  itself costs, still without a store or any bookkeeping.
* `rmq`: `rmq up --slaves 1 --role SYNC_MASTER` (ASYNC_FLUSH) driven by `await Producer.send`.

Each runs one at a time (`--one` sends, p50 of the per-send wall time) and 32 in flight
(`--inflight-count` sends; the chain's client is one writer and one reader task holding 32
frames outstanding; trio-rmq's is 32 tasks calling `Producer.send`), after untimed warm-up
sends, in rounds whose order rotates. Every process's CPU per send is read around each timed
part: the master's and slave's from /proc/<pid>/stat, the client's (this process) from
getrusage. The medians over the rounds, and trio-rmq's rate as a fraction of each chain's in
the same round, are printed last. `--profile DIR` samples the trio-rmq client, master and slave
with py-spy (`bench/profile_summary.py`) during their one-at-a-time and 32-in-flight parts of
the first round and prints the summaries. `--syscalls DIR` runs `--one` sends of each system
one at a time under `strace -c -f` on each process instead and prints the syscalls per send
(epoll_wait counts the event loop's passes: a number the host's load does not move).
`--placement ROUNDS` instead runs `--one` sends one at a time with the three processes pinned in
each way they can share two CPUs (and once left to the kernel), and prints each way's p50.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import resource
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from bench.cluster import cpu_seconds, detached_cluster  # noqa: E402

BODY = b"x" * 1024
FRAME = struct.pack(">i", len(BODY)) + BODY
ACK = 8
ANSWER = 100
TOPIC = "FloorChainBench"
INFLIGHT = 32
# untimed sends before each timed part (a new connection, routes, the first pages)
WARMUP = 200
_LEN = struct.Struct(">i")
_ACK = struct.Struct(">q")


# --- the floor chain, bare -----------------------------------------------------------------------


def _nodelay(stream: trio.SocketStream) -> None:
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _frames(buf: bytearray) -> tuple[int, int]:
    """(count, length) of the complete length-prefixed frames at the head of `buf`."""
    n = 0
    pos = 0
    while len(buf) - pos >= 4:
        size = _LEN.unpack_from(buf, pos)[0]
        if len(buf) - pos - 4 < size:
            break
        pos += 4 + size
        n += 1
    return n, pos


async def _bare_slave(stream: trio.SocketStream) -> None:
    _nodelay(stream)
    buf = bytearray()
    have = 0
    while data := await stream.receive_some(65536):
        buf += data
        n, pos = _frames(buf)
        if n:
            del buf[:pos]
            have += n
            await stream.send_all(_ACK.pack(have))


async def _bare_master(client: trio.SocketStream, slave_port: int) -> None:
    _nodelay(client)
    slave = await trio.open_tcp_stream("127.0.0.1", slave_port)
    _nodelay(slave)

    async def forward() -> None:
        buf = bytearray()
        while data := await client.receive_some(65536):
            buf += data
            n, pos = _frames(buf)
            if n:
                out = bytes(buf[:pos])
                del buf[:pos]
                await slave.send_all(out)
        await slave.send_eof()  # the slave closes; the answer task then sees EOF

    async def answer() -> None:
        buf = bytearray()
        answered = 0
        while data := await slave.receive_some(65536):
            buf += data
            acked = answered
            while len(buf) >= ACK:
                acked = _ACK.unpack_from(buf)[0]
                del buf[:ACK]
            if acked > answered:
                await client.send_all(b"a" * (ANSWER * (acked - answered)))
                answered = acked

    async with trio.open_nursery() as nursery:
        nursery.start_soon(forward)
        nursery.start_soon(answer)


# --- the floor chain through the remoting codec --------------------------------------------------


def _send_header() -> dict[str, str]:
    """The SendMessageRequestHeaderV2 extFields a Producer sends (one-letter names)."""
    from rmq.message import Message

    props, _ = Message(TOPIC, BODY).wire_properties_string("7F000001000035A6B5C6A2C3D4E50000")
    return {
        "a": "floor_pg", "b": TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0",
        "g": str(time.time_ns() // 1_000_000), "h": "0", "i": props, "j": "0", "k": "false",
        "m": "false", "n": "broker-a",
    }  # fmt: skip


async def _codec_slave(stream: trio.SocketStream) -> None:
    from common.remoting.codec import FrameDecoder, encode
    from common.remoting.command import RemotingCommand

    _nodelay(stream)
    dec = FrameDecoder()
    have = 0
    while data := await stream.receive_some(65536):
        cmds = dec.feed(data)
        if cmds:
            for cmd in cmds:
                have = int(cmd.ext_fields["offset"]) + len(cmd.body_bytes())
            ack = RemotingCommand(code=0, flag=1, ext_fields={"offset": str(have)})
            await stream.send_all(encode(ack))


async def _codec_master(client: trio.SocketStream, slave_port: int) -> None:
    from common.remoting.codec import FrameDecoder, encode
    from common.remoting.command import RemotingCommand

    _nodelay(client)
    slave = await trio.open_tcp_stream("127.0.0.1", slave_port)
    _nodelay(slave)
    waiting: list[tuple[int, RemotingCommand]] = []  # (end offset, request), in offset order
    offset = 0

    async def forward() -> None:
        nonlocal offset
        dec = FrameDecoder()
        while data := await client.receive_some(65536):
            out = []
            for req in dec.feed(data):
                body = req.body_bytes()
                topic = req.ext_fields["b"]  # what a put reads from the header
                queue_id = int(req.ext_fields["e"])
                fwd = RemotingCommand(
                    code=1, ext_fields={"offset": str(offset), "topic": topic, "q": str(queue_id)}
                )
                fwd.body = body
                out.append(encode(fwd))
                offset += len(body)
                waiting.append((offset, req))
            if out:
                await slave.send_all(b"".join(out))
        await slave.send_eof()  # the slave closes; the answer task then sees EOF

    async def answer() -> None:
        dec = FrameDecoder()
        while data := await slave.receive_some(65536):
            acked = -1
            for ack in dec.feed(data):
                acked = int(ack.ext_fields["offset"])
            n = 0
            while n < len(waiting) and waiting[n][0] <= acked:
                n += 1
            if n:
                done, waiting[:n] = waiting[:n], []
                out = [
                    encode(
                        req.response(
                            ext_fields={
                                "msgId": "7F00000100002A9F0000000000000000",
                                "queueId": req.ext_fields["e"],
                                "queueOffset": str(end),
                                "transactionId": None,
                            }
                        )
                    )
                    for end, req in done
                ]
                await client.send_all(b"".join(out))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(forward)
        nursery.start_soon(answer)


def _serve(role: str, kind: str, port: int, slave_port: int) -> None:
    async def main() -> None:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        print("listening", flush=True)
        if role == "slave":
            handler = _bare_slave if kind == "floor" else _codec_slave
            await trio.serve_listeners(handler, listeners)
        else:
            master = _bare_master if kind == "floor" else _codec_master

            async def on_client(stream: trio.SocketStream) -> None:
                try:
                    await master(stream, slave_port)
                except* (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # a client that went away ends its chain, not the server

            await trio.serve_listeners(on_client, listeners)

    trio.run(main)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def floor_chain(kind: str) -> Iterator[tuple[int, dict[str, int]]]:
    """A slave and a master process of chain `kind`; yields (master port, pids)."""
    procs: list[subprocess.Popen[str]] = []
    try:
        slave_port, master_port = _free_port(), _free_port()
        for role, port in (("slave", slave_port), ("master", master_port)):
            p = subprocess.Popen(
                [sys.executable, __file__, "--serve", role, "--kind", kind, "--port", str(port),
                 "--slave-port", str(slave_port)],
                stdout=subprocess.PIPE, text=True, cwd=ROOT,
            )  # fmt: skip
            procs.append(p)
            assert p.stdout is not None
            if p.stdout.readline().strip() != "listening":
                raise RuntimeError(f"{kind} {role} did not start")
        yield master_port, {"master": procs[1].pid, "slave": procs[0].pid}
    finally:
        for p in procs:  # only the processes started here, by their pid
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=5)


# --- clients -------------------------------------------------------------------------------------


class Meter:
    """CPU of this process (the client) and of `pids`, and wall time, from start to result()."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.r0 = resource.getrusage(resource.RUSAGE_SELF)
        self.c0 = {n: cpu_seconds(p) for n, p in pids.items()}
        self.t0 = time.perf_counter()

    def result(self, count: int, lat: list[float] | None = None) -> dict[str, float]:
        dt = time.perf_counter() - self.t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        out = {
            "rate": count / dt,
            "client_us": 1e6
            * (r1.ru_utime - self.r0.ru_utime + r1.ru_stime - self.r0.ru_stime)
            / count,
        }
        for n, p in self.pids.items():
            out[f"{n}_us"] = 1e6 * (cpu_seconds(p) - self.c0[n]) / count
        if lat:
            out["p50_us"] = 1e6 * statistics.median(lat)
        return out


def chain_client(kind: str, port: int, count: int, inflight: int, *, pids: dict[str, int]) -> dict:
    """The chain's Trio client: `count` sends, `inflight` at a time, after 200 untimed ones."""
    from common.remoting.codec import FrameDecoder, encode
    from common.remoting.command import RemotingCommand

    header = _send_header()

    def request(opaque: int) -> bytes:
        if kind == "floor":
            return FRAME
        h = header.copy()
        h["g"] = str(time.time_ns() // 1_000_000)
        return encode(RemotingCommand(code=310, opaque=opaque, ext_fields=h, body=BODY))

    def answers(dec: FrameDecoder, data: bytes, buf: bytearray) -> int:
        if kind == "floor":
            buf += data
            n = len(buf) // ANSWER
            del buf[: n * ANSWER]
            return n
        n = 0
        for resp in dec.feed(data):
            if resp.code != 0:
                raise RuntimeError(f"chain answered {resp}")
            int(resp.ext_fields["queueOffset"])  # what a SendResult reads
            n += 1
        return n

    async def main() -> dict:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        _nodelay(stream)
        async with stream:
            dec, buf = FrameDecoder(), bytearray()
            opaque = 0

            async def one(n: int, lat: list[float] | None) -> None:
                nonlocal opaque
                for _ in range(n):
                    t0 = time.perf_counter()
                    opaque += 1
                    await stream.send_all(request(opaque))
                    got = 0
                    while not got:
                        got = answers(dec, await stream.receive_some(65536), buf)
                    if lat is not None:
                        lat.append(time.perf_counter() - t0)

            async def pipelined(n: int) -> None:
                slots = trio.Semaphore(inflight)

                async def writer() -> None:
                    nonlocal opaque
                    for _ in range(n):
                        await slots.acquire()
                        opaque += 1
                        await stream.send_all(request(opaque))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(writer)
                    done = 0
                    while done < n:
                        got = answers(dec, await stream.receive_some(65536), buf)
                        done += got
                        for _ in range(got):
                            slots.release()

            if inflight == 1:
                await one(WARMUP, None)
                lat: list[float] = []
                meter = Meter(pids)
                await one(count, lat)
                return meter.result(count, lat)
            await pipelined(WARMUP)
            meter = Meter(pids)
            await pipelined(count)
            return meter.result(count)

    return trio.run(main)


def rmq_client(ns: str, count: int, inflight: int, *, pids: dict[str, int]) -> dict:
    """`await Producer.send` of 1 KiB messages, `inflight` tasks, after 200 untimed sends."""
    from rmq import Message, Producer, SendStatus

    async def main() -> dict:
        async with Producer("floor_bench_pg", ns, send_timeout=10) as p:

            async def send() -> None:
                r = await p.send(Message(TOPIC, BODY))
                if r.status is not SendStatus.SEND_OK:
                    raise RuntimeError(f"send answered {r}")

            for _ in range(WARMUP):
                await send()
            if inflight == 1:
                lat: list[float] = []
                meter = Meter(pids)
                for _ in range(count):
                    t0 = time.perf_counter()
                    await send()
                    lat.append(time.perf_counter() - t0)
                return meter.result(count, lat)
            left = count

            async def worker() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await send()

            meter = Meter(pids)
            async with trio.open_nursery() as nursery:
                for _ in range(inflight):
                    nursery.start_soon(worker)
            return meter.result(count)

    return trio.run(main)


# --- driver --------------------------------------------------------------------------------------


def _syscalls(
    out: Path, tag: str, pids: dict[str, int], run: Callable[[], dict], count: int
) -> dict[str, dict[str, float]]:
    """`strace -c -f` on every process while `run` makes `count` sends (and its WARMUP ones,
    which strace sees too): per process, the syscalls per send by name (epoll_wait: the event
    loop's passes that waited or polled)."""
    out.mkdir(parents=True, exist_ok=True)
    procs = {}
    for name, pid in {**pids, "client": os.getpid()}.items():
        path = out / f"{tag}-{name}.strace"
        procs[name] = (
            subprocess.Popen(
                ["strace", "-c", "-f", "-q", "-o", str(path), "-p", str(pid)],
                stderr=subprocess.DEVNULL,
            ),
            path,
        )
    time.sleep(1.0)  # strace attaches
    try:
        run()
    finally:
        for p, _ in procs.values():  # the strace processes started here, by pid
            p.send_signal(signal.SIGINT)
        for p, _ in procs.values():
            p.wait(timeout=30)
    table: dict[str, dict[str, float]] = {}
    for name, (_, path) in procs.items():
        calls: dict[str, float] = {}
        for line in path.read_text().splitlines():
            f = line.split()
            # "% time  seconds  usecs/call  calls  [errors]  syscall"
            if len(f) >= 5 and f[0][0].isdigit() and f[3].isdigit() and f[-1] != "total":
                calls[f[-1]] = int(f[3]) / (count + WARMUP)
        table[name] = calls
    return table


def _profiled(prof: Path | None, tag: str, pids: dict[str, int], run: Callable[[], dict]) -> dict:
    if prof is None:
        return run()
    from bench.profile_summary import format_summary, sample, summarise

    prof.mkdir(parents=True, exist_ok=True)
    paths = {**pids, "client": os.getpid()}
    with contextlib.ExitStack() as stack:
        for name, pid in paths.items():
            stack.enter_context(sample(pid, prof / f"{tag}-{name}.txt"))
        time.sleep(0.5)  # py-spy attaches
        out = run()
    for name in paths:
        print(format_summary(f"{tag} {name}", summarise(prof / f"{tag}-{name}.txt", top=25)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--one", type=int, default=3000, help="sends one at a time per part")
    ap.add_argument("--inflight-count", type=int, default=20000, help="sends 32 in flight")
    ap.add_argument("--only", default="floor,codec,rmq", help="which systems, comma-separated")
    ap.add_argument("--profile", type=Path, help="py-spy the trio-rmq parts of round 1 here")
    ap.add_argument(
        "--syscalls",
        type=Path,
        help="instead of the rounds: strace -c each system's processes for --one sends one "
        "at a time, print syscalls per send (needs strace)",
    )
    ap.add_argument(
        "--placement",
        type=int,
        metavar="ROUNDS",
        help="instead of the rounds: --one sends one at a time under each CPU placement of the "
        "three processes (sched_setaffinity), ROUNDS times, print each placement's p50",
    )
    ap.add_argument("--serve", choices=("master", "slave"), help=argparse.SUPPRESS)
    ap.add_argument("--kind", choices=("floor", "codec"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--slave-port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        _serve(args.serve, args.kind, args.port, args.slave_port)
        return

    systems = args.only.split(",")
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[tuple[str, str], list[dict]] = {}
    with contextlib.ExitStack() as stack:
        targets: dict[str, tuple[Callable[[int, int], dict], dict[str, int]]] = {}
        for kind in ("floor", "codec"):
            if kind in systems:
                port, pids = stack.enter_context(floor_chain(kind))
                targets[kind] = (functools.partial(chain_client, kind, port, pids=pids), pids)
        if "rmq" in systems:
            ns, nodes = stack.enter_context(
                detached_cluster("--slaves", "1", "--role", "SYNC_MASTER", prefix="rmq-floor-")
            )
            pids = {"master": nodes["broker-a"], "slave": nodes["broker-a-s1"]}

            async def create() -> None:
                from rmq import Admin

                async with Admin(ns) as admin:
                    await admin.create_topic(TOPIC, queues=4)
                await trio.sleep(1)

            trio.run(create)
            targets["rmq"] = (functools.partial(rmq_client, ns, pids=pids), pids)
        if args.syscalls is not None:
            for system, (run, pids) in targets.items():
                table = _syscalls(
                    args.syscalls, system, pids, functools.partial(run, args.one, 1), args.one
                )
                for name, calls in table.items():
                    top = sorted(calls.items(), key=lambda kv: -kv[1])[:6]
                    print(
                        f"{system:5s} {name:6s}: {sum(calls.values()):5.1f} syscalls/send, "
                        f"epoll_wait {calls.get('epoll_wait', 0.0):.2f}; "
                        + ", ".join(f"{k} {v:.2f}" for k, v in top),
                        flush=True,
                    )
            return
        if args.placement is not None:
            _placements(targets, args.one, args.placement)
            return
        parts = [(s, m) for m in ("one", "inflight32") for s in targets]
        for i in range(args.rounds):
            k = i % len(parts)
            for system, mode in parts[k:] + parts[:k]:
                run, pids = targets[system]
                n, inflight = (args.one, 1) if mode == "one" else (args.inflight_count, INFLIGHT)
                prof = args.profile if (i == 0 and system == "rmq") else None
                m = _profiled(prof, f"{system}-{mode}", pids, functools.partial(run, n, inflight))
                m["load"] = os.getloadavg()[0]
                results.setdefault((system, mode), []).append(m)
                p50 = f", p50 {m['p50_us']:.0f} us" if "p50_us" in m else ""
                print(
                    f"round {i + 1} {system:5s} {mode:10s}: {m['rate']:7,.0f} sends/s{p50}; "
                    f"CPU us/send client {m['client_us']:.0f}, master {m['master_us']:.0f}, "
                    f"slave {m['slave_us']:.0f} (load {m['load']:.2f})",
                    flush=True,
                )
    _report(results, args.rounds)


# CPU sets of (master, slave, client) on a 2-CPU host; "free" leaves the kernel to place them
PLACEMENTS: dict[str, tuple[set[int], set[int], set[int]] | None] = {
    "free": None,
    "master 0, slave 1, client 1": ({0}, {1}, {1}),
    "master 0, slave 1, client 0": ({0}, {1}, {0}),
    "master 0, slave 0, client 1": ({0}, {0}, {1}),
}


def _placements(
    targets: dict[str, tuple[Callable[[int, int], dict], dict[str, int]]], count: int, rounds: int
) -> None:
    """One-at-a-time p50 of each system under each placement: how much of a one-at-a-time send's
    time is where the kernel runs the three processes, not what they do (three processes share
    two CPUs here; a master and its slave on one CPU cannot overlap their work)."""
    every = set(range(os.cpu_count() or 1))
    if not every >= {0, 1}:
        print("placement needs two CPUs")
        return
    p50s: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for system, (run, pids) in targets.items():
            for name, cpus in PLACEMENTS.items():
                master, slave, client = cpus if cpus is not None else (every, every, every)
                os.sched_setaffinity(pids["master"], master)
                os.sched_setaffinity(pids["slave"], slave)
                os.sched_setaffinity(0, client)
                try:
                    m = run(count, 1)
                finally:
                    for pid in (pids["master"], pids["slave"], 0):
                        os.sched_setaffinity(pid, every)
                p50s.setdefault((system, name), []).append(m["p50_us"])
                print(f"{system:5s} {name:28s}: p50 {m['p50_us']:.0f} us", flush=True)
    print("\n| placement | " + " | ".join(f"{s} p50 us" for s in targets) + " |")
    print("|---|" + "---:|" * len(targets))
    for name in PLACEMENTS:
        row = " | ".join(f"{statistics.median(p50s[(s, name)]):.0f}" for s in targets)
        print(f"| {name} | {row} |")


def _report(results: dict[tuple[str, str], list[dict]], rounds: int) -> None:
    def med(ms: list[dict], key: str) -> float:
        return statistics.median(m[key] for m in ms)

    print("\nmedians over the rounds:")
    print("| system | in flight | sends/s | p50 us | CPU us/send: client | master | slave |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (system, mode), ms in results.items():
        p50 = f"{med(ms, 'p50_us'):,.0f}" if "p50_us" in ms[0] else ""
        print(
            f"| {system} | {1 if mode == 'one' else INFLIGHT} | {med(ms, 'rate'):,.0f} | {p50} | "
            f"{med(ms, 'client_us'):.0f} | {med(ms, 'master_us'):.0f} | "
            f"{med(ms, 'slave_us'):.0f} |"
        )
    for mode in ("one", "inflight32"):
        rmq = results.get(("rmq", mode))
        for floor in ("floor", "codec"):
            base = results.get((floor, mode))
            if rmq and base:
                ratios = [r["rate"] / b["rate"] for r, b in zip(rmq, base, strict=True)]
                print(
                    f"trio-rmq / {floor} chain, {mode}: median {statistics.median(ratios):.2f}x "
                    f"(per round: {', '.join(f'{x:.2f}' for x in ratios)})"
                )
    loads = [m["load"] for ms in results.values() for m in ms]
    if loads:
        print(f"1-minute load average during the parts: {min(loads):.2f} .. {max(loads):.2f}")


if __name__ == "__main__":
    main()
