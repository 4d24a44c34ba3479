"""Our Python client and the official C++ client (PyPI `rocketmq==0.4.4`) exchange messages
through `rmq up`, both ways, with the same bodies, tags, keys and user properties.

The C++ side runs in a subprocess (scratch HOME, JSON event lines), through a small script
written next to the test that imports `cpp_driver.py` and reuses its pieces (`emit`, `_quiet`,
`_subscribe`): the stock driver only sends/prints UTF-8 bodies and the `seq` property, and
these checks need raw bodies and any property. If the C++ client cannot be imported, the
script exits non-zero and the test fails: it never skips.

librocketmq's C API passes bodies as NUL-terminated strings (SetMessageBody/GetMessageBody),
so the binary bodies here are arbitrary bytes without a NUL; that limit is the C client's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from common.message import MessageExt
from common.model import MessageQueue
from rmq import Message, SendStatus, sync
from rmq.consume_service import ConsumeStatus
from rmq.push_consumer import ConsumeFromWhere

pytestmark = [pytest.mark.interop, pytest.mark.slow]

DRIVER_DIR = Path(__file__).parent

# Runs in the subprocess: cpp_driver's helpers plus raw-byte bodies and arbitrary properties.
SCRIPT = textwrap.dedent(
    """
    import argparse, json, sys, threading, time
    sys.path.insert(0, sys.argv.pop(1))
    from cpp_driver import _quiet, _subscribe, emit

    def produce(args):
        from rocketmq.client import Message, Producer
        producer = Producer(args.group, timeout=5000)
        _quiet("SetProducerLogLevel", producer._handle)
        producer.set_namesrv_addr(args.namesrv)
        producer.start()
        try:
            for spec in json.load(open(args.spec)):
                msg = Message(args.topic)
                msg.set_body(bytes.fromhex(spec["body_hex"]))
                msg.set_tags(spec["tags"])
                msg.set_keys(spec["keys"])
                for k, v in spec["props"].items():
                    msg.set_property(k, v)
                r = producer.send_sync(msg)
                emit(event="sent", status=int(r.status), msg_id=r.msg_id, seq=spec["props"]["seq"])
        finally:
            producer.shutdown()
        emit(event="done")

    def consume(args):
        from rocketmq.client import PushConsumer
        consumer = PushConsumer(args.group)
        _quiet("SetPushConsumerLogLevel", consumer._handle)
        consumer.set_namesrv_addr(args.namesrv)
        consumer.set_thread_count(2)
        names = args.props.split(",")
        lock, seen, done = threading.Lock(), set(), threading.Event()

        def text(v):
            return v.decode() if isinstance(v, bytes) else v

        def on_message(msg):
            seq = text(msg.get_property("seq"))
            emit(event="recv", body_hex=msg.body.hex(), tags=text(msg.tags),
                 keys=text(msg.keys), id=msg.id, topic=msg.topic,
                 props={n: text(msg.get_property(n)) for n in names})
            with lock:
                seen.add(seq)
                if len(seen) >= args.expect:
                    done.set()

        _subscribe(consumer, args.topic, on_message, "*")
        consumer.start()
        finished = done.wait(args.timeout)
        time.sleep(1.0)
        consumer.shutdown()
        emit(event="done", complete=finished, unique=len(seen))

    p = argparse.ArgumentParser()
    p.add_argument("cmd")
    p.add_argument("--namesrv")
    p.add_argument("--topic")
    p.add_argument("--group")
    p.add_argument("--spec")
    p.add_argument("--props", default="seq")
    p.add_argument("--expect", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0)
    a = p.parse_args()
    produce(a) if a.cmd == "produce" else consume(a)
    """
)

BODIES = [
    b"plain ascii",
    "héllo wörld, 世界 🚀".encode(),
    bytes([0xFF, 0xFE, 0x80, 0x01, 0x7F, 0xC3, 0x28, 0x02]),  # not UTF-8, no NUL
    bytes(range(1, 256)),
]


def specs(n: int, prefix: str) -> list[dict]:
    out = []
    for i in range(n):
        body = BODIES[i % len(BODIES)] + f"#{prefix}{i}".encode()
        out.append(
            {
                "body": body,
                "tags": f"Tag{i % 3}",
                "keys": f"{prefix}k{i} {prefix}order-{i % 5}",
                "props": {"seq": str(i), "color": "red" if i % 2 else "blue", "lang": "ünï"},
            }
        )
    return out


def run_script(tmp_path: Path, *args: str, timeout: float = 180.0) -> list[dict]:
    script = tmp_path / "cpp_rmq_driver.py"
    script.write_text(SCRIPT)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, str(script), str(DRIVER_DIR), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HOME": str(home)},
    )
    assert proc.returncode == 0, (
        f"C++ client script failed ({proc.returncode}):\n{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}"
    )
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_messages_from_our_producer_reach_the_cpp_consumer_unchanged(tmp_path, module_cluster):
    topic, n = "InteropRmqToCpp", 24
    items = specs(n, "py-")
    with sync.Producer("py-interop-pg", module_cluster.namesrv_addr) as p:
        results = []
        for i, s in enumerate(items):
            msg = Message(
                topic, s["body"], tags=s["tags"], keys=s["keys"].split(), properties=s["props"]
            )
            # a few go through an explicit queue and ordered sends: same bytes on the wire
            if i % 6 == 5:
                results.append(p.send_orderly(msg, s["props"]["color"]))
            else:
                results.append(p.send(msg))
    assert all(r.status is SendStatus.SEND_OK for r in results)

    events = run_script(
        tmp_path,
        "consume",
        "--namesrv",
        module_cluster.namesrv_addr,
        "--topic",
        topic,
        "--group",
        "cpp-reads-py",
        "--props",
        "seq,color,lang",
        "--expect",
        str(n),
        "--timeout",
        "90",
    )
    [done] = [e for e in events if e["event"] == "done"]
    assert done["complete"], done
    recv: dict[str, dict] = {}
    for e in events:
        if e["event"] == "recv":
            recv.setdefault(e["props"]["seq"], e)
    assert set(recv) == {str(i) for i in range(n)}
    for i, s in enumerate(items):
        e = recv[str(i)]
        assert bytes.fromhex(e["body_hex"]) == s["body"]
        assert e["tags"] == s["tags"]
        assert e["keys"] == s["keys"]
        assert e["props"] == s["props"]
        assert e["topic"] == topic
        # the C++ client's msg id is the UNIQ_KEY our producer generated
        assert e["id"] == results[i].msg_id


def test_messages_from_the_cpp_producer_reach_our_push_consumer_unchanged(tmp_path, module_cluster):
    topic, n = "InteropCppToRmq", 24
    items = specs(n, "cpp-")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(
        json.dumps([{**s, "body": None, "body_hex": s["body"].hex()} for s in items])
    )
    events = run_script(
        tmp_path,
        "produce",
        "--namesrv",
        module_cluster.namesrv_addr,
        "--topic",
        topic,
        "--group",
        "cpp-interop-pg",
        "--spec",
        str(spec_file),
    )
    sent = [e for e in events if e["event"] == "sent"]
    assert len(sent) == n and all(e["status"] == 0 for e in sent), events[-5:]
    ids = {e["seq"]: e["msg_id"] for e in sent}

    got: dict[str, MessageExt] = {}
    lock = threading.Lock()
    complete = threading.Event()

    def listener(msgs):  # a plain function: rmq.sync runs it in a worker thread
        with lock:
            for m in msgs:
                got.setdefault(m.properties["seq"], m)
            if len(got) >= n:
                complete.set()
        return ConsumeStatus.SUCCESS

    consumer = sync.PushConsumer(
        "py-reads-cpp", module_cluster.namesrv_addr, consume_from=ConsumeFromWhere.FIRST_OFFSET
    )
    consumer.subscribe(topic, "*")
    consumer.register_listener(listener)
    with consumer:
        assert complete.wait(90), f"got {len(got)} of {n}"
        assert consumer.assigned_queues()
    for i, s in enumerate(items):
        m = got[str(i)]
        assert m.body == s["body"]
        assert m.tags == s["tags"]
        assert m.keys == s["keys"]
        assert {k: m.properties.get(k) for k in s["props"]} == s["props"]
        assert m.topic == topic
        assert m.properties["UNIQ_KEY"] == ids[str(i)]

    # and our lite pull consumer reads the same stored messages from the start
    with sync.LitePullConsumer(
        "py-lite-reads-cpp", module_cluster.namesrv_addr, consume_from="FIRST_OFFSET"
    ) as lite:
        queues = lite.fetch_queues(topic)
        assert all(isinstance(q, MessageQueue) for q in queues)
        lite.assign(queues)
        bodies = set()
        for _ in range(60):
            bodies |= {m.body for m in lite.poll(1.0)}
            if len(bodies) >= n:
                break
    assert bodies == {s["body"] for s in items}
