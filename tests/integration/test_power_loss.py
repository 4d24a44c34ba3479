"""Power loss, simulated as the loss of every byte not fsynced, against a real broker process.

The broker runs with ``durable_shadow.c`` preloaded (``LD_PRELOAD``): beside its store the
library keeps a copy of exactly what the process made durable (a file's content as of the
start of each fsync/fdatasync that returned, renames and unlinks mirrored; a file never synced
does not exist there).  Producers pipeline sends; the test SIGKILLs the broker at a random
moment, replaces the store with that copy (the disk a power cut would have left: nothing
written back beyond what was synced), and starts the broker on it, several rounds in a row.

* SYNC_FLUSH: every acknowledged message is there after each cut, at the queue offset and
  physical offset its answer named, with its body.
* ASYNC_FLUSH (``flushIntervalCommitLog`` 200 ms): acknowledged messages may be lost, but only
  recent ones (none acknowledged more than the interval plus a slack before the cut), and what
  is left is consistent: each queue dense from 0, every record's CRC valid, and what survived of
  a round's acknowledged messages a prefix of them per queue.  The loss is printed.
* DLedger, 3 members losing power together, twice: nothing acknowledged longer ago than the
  Raft log's flush interval plus a slack is lost, no member serves a message twice, and all
  three serve the same messages.  The classic stores flush every 10 ms here, so a cut often
  finds one ahead of its member's Raft log, which its resume must cut back (applier.py).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import pytest
import trio

from cli.chaos.port_blocks import free_port_block
from cli.chaos.queue_readback import pull_queue
from common.message_id import decode_offset_msg_id
from common.remoting.client import RemotingClient, open_remoting_client
from common.remoting.codes import ResponseCode
from common.remoting.command import RemotingCommand
from tests.support.wire import send_v2, wait_serving

if TYPE_CHECKING:
    from tests.integration.conftest import DLedgerGroupProcs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "PowerLoss"
QUEUES = 4
ROUNDS = 3
HERE = Path(__file__).parent
ASYNC_FLUSH_INTERVAL = 0.2
# a flush that starts at most one interval after an acknowledgement also has to finish
FLUSH_SLACK = 0.6

Key = tuple[int, int]  # (queue id, queue offset)
Stored = tuple[bytes, int]  # (body, physical offset)


@pytest.fixture(scope="module")
def shadow_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shadow") / "durable_shadow.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(out)]
        + [str(HERE / "durable_shadow.c"), "-ldl"],
        check=True,
    )
    return out


def start(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )


def send_cmd(i: int) -> RemotingCommand:
    return send_v2(TOPIC, i % QUEUES, b"power-%d-" % i + b"x" * (i % 500), group="power-pg")


async def served(client: RemotingClient, addr: str) -> dict[Key, Stored]:
    """Every record the broker serves; each queue dense from 0, every CRC checked."""
    out = {}
    for q in range(QUEUES):
        msgs = await pull_queue(client, addr, TOPIC, q, group="power-check")
        assert [m.queue_offset for m in msgs] == list(range(len(msgs))), f"queue {q} not dense"
        for m in msgs:
            out[(m.queue_id, m.queue_offset)] = (m.body, m.commit_log_offset)
    return out


@attrs.define
class Round:
    """One run of load ended by a power cut."""

    acked: dict[Key, Stored] = attrs.Factory(dict)
    acked_at: dict[Key, float] = attrs.Factory(dict)
    cut_at: float = 0.0
    sent: int = 0

    async def load(
        self, client: RemotingClient, addr: str, broker: subprocess.Popen[bytes], seconds: float
    ) -> None:
        async def producer() -> None:
            while True:
                self.sent += 1
                cmd = send_cmd(self.sent)
                try:
                    r = await client.invoke(addr, cmd, timeout=5)
                except Exception:
                    return  # the power went
                if r.code == ResponseCode.SUCCESS:
                    _host, phys = decode_offset_msg_id(r.ext_fields["msgId"])
                    key = (int(r.ext_fields["queueId"]), int(r.ext_fields["queueOffset"]))
                    self.acked[key] = (cmd.body_bytes(), phys)
                    self.acked_at[key] = trio.current_time()

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(producer)
            await trio.sleep(seconds)
            self.cut_at = trio.current_time()
            broker.send_signal(signal.SIGKILL)
            await trio.to_thread.run_sync(broker.wait)
            nursery.cancel_scope.cancel()

    def lost_ages(self, now: dict[Key, Stored]) -> list[float]:
        """How long before the cut each lost acknowledgement came; checks what survived."""
        for key, value in self.acked.items():
            assert now.get(key, value) == value, f"{key} holds another message"
        for q in range(QUEUES):
            mine = sorted(k[1] for k in self.acked if k[0] == q)
            kept = [o for o in mine if (q, o) in now]
            assert kept == mine[: len(kept)], f"queue {q}: what survived is not a prefix"
        return [self.cut_at - self.acked_at[k] for k in self.acked if k not in now]


@pytest.mark.parametrize("flush", ["SYNC_FLUSH", "ASYNC_FLUSH"])
async def test_a_power_cut_keeps_what_the_flush_mode_promises(tmp_path, shadow_lib, flush):
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    store, shadow = tmp_path / "store", tmp_path / "shadow"
    nport, bport = free_port_block(), free_port_block()
    conf = tmp_path / "broker.conf"
    conf.write_text(
        f"brokerName=broker-power\nlistenPort={bport}\nnamesrvAddr=127.0.0.1:{nport}\n"
        f"storePathRootDir={store}\nflushDiskType={flush}\nmapedFileSizeCommitLog=131072\n"
        "mappedFileSizeConsumeQueue=2400\nmaxHashSlotNum=64\nmaxIndexNum=256\n"
        f"flushIntervalCommitLog={int(ASYNC_FLUSH_INTERVAL * 1000)}\n"
    )
    env = {
        "LD_PRELOAD": str(shadow_lib),
        "DURABLE_SHADOW_ROOT": str(store),
        "DURABLE_SHADOW_DIR": str(shadow),
    }
    ns_args = ["namesrv", "--port", str(nport), "--data-dir", str(tmp_path / "ns")]
    namesrv = start(ns_args, tmp_path / "ns.log")
    addr = f"127.0.0.1:{bport}"
    survivors: dict[Key, Stored] = {}  # what every cut so far kept
    last: Round | None = None
    acked = lost = 0
    oldest_lost = 0.0
    try:
        for round_no in range(ROUNDS + 1):
            # the durable copy starts as the store is now: what the earlier cuts left
            shutil.rmtree(shadow, ignore_errors=True)
            if store.exists():
                shutil.copytree(store, shadow)
            broker = start(["broker", "-c", str(conf)], tmp_path / "broker.log", env)
            try:
                async with open_remoting_client() as client:
                    await wait_serving(client, addr, broker)
                    if last is not None:
                        now = await served(client, addr)
                        for key, value in survivors.items():
                            assert now.get(key) == value, f"{key} lost or changed by a later cut"
                        ages = last.lost_ages(now)
                        acked, lost = acked + len(last.acked), lost + len(ages)
                        oldest_lost = max([oldest_lost, *ages])
                        survivors = now
                    if round_no == ROUNDS:
                        break
                    last = Round()
                    await last.load(client, addr, broker, rng.uniform(1.0, 2.0))
                # the power cut: the disk keeps only what was synced
                shutil.rmtree(store)
                shutil.move(shadow, store)
            finally:
                if broker.poll() is None:
                    broker.kill()
                    broker.wait()
    finally:
        namesrv.terminate()
        namesrv.wait(timeout=10)
    print(
        f"{flush}: {acked} acknowledged over {ROUNDS} cuts, {lost} lost, the oldest of them "
        f"acknowledged {oldest_lost:.3f} s before its cut"
    )
    assert acked > 200, "too few acknowledged messages for the test to mean anything"
    if flush == "SYNC_FLUSH":
        assert lost == 0
    else:
        assert oldest_lost < ASYNC_FLUSH_INTERVAL + FLUSH_SLACK


# --- a DLedger group losing power together ----------------------------------------------------

# DLedger's flushFileInterval: a quorum losing power together may lose what it acknowledged in
# the last flush interval of the Raft log
RAFT_FLUSH_INTERVAL = 0.01


async def served_keys(
    client: RemotingClient, group: DLedgerGroupProcs, node: str
) -> list[str] | None:
    """The keys ``node`` serves (None while it does not answer)."""
    keys: list[str] = []
    try:
        for q in range(QUEUES):
            keys += [m.keys or "" for m in await pull_queue(client, group.addr(node), TOPIC, q)]
    except Exception:
        client.close_channel(group.addr(node))
        return None
    return keys


def restore_durable(group: DLedgerGroupProcs, shadow: Path) -> None:
    """Every member's store becomes what the durable copy holds of it (nothing if nothing)."""
    for node in group.nodes.values():
        assert node.data_dir is not None
        data = node.data_dir
        shutil.rmtree(data, ignore_errors=True)
        copy = shadow / data.relative_to(group.procs.root)
        if copy.exists():
            shutil.move(copy, data)
    shutil.rmtree(shadow, ignore_errors=True)


def snapshot_durable(group: DLedgerGroupProcs, shadow: Path) -> None:
    """The durable copy starts as the stores are now (what earlier cuts left)."""
    for node in group.nodes.values():
        assert node.data_dir is not None
        data = node.data_dir
        if data.exists():
            shutil.copytree(data, shadow / data.relative_to(group.procs.root))


async def test_a_dledger_group_losing_power_together_keeps_all_but_the_last_flush(
    tmp_path, shadow_lib, dledger_factory, raft_client, monkeypatch
):
    from rmq import Message, Producer
    from rmq.producer import SendStatus

    shadow = tmp_path / "shadow"
    monkeypatch.setenv("LD_PRELOAD", str(shadow_lib))
    monkeypatch.setenv("DURABLE_SHADOW_DIR", str(shadow))
    monkeypatch.setenv("DURABLE_SHADOW_ROOT", str(tmp_path / "nodes"))
    # the classic store flushes as often as the Raft log, so a cut often finds it ahead of
    # the log on some member (its resume then cuts the classic tail back to the log)
    group = await dledger_factory(
        3,
        mappedFileSizeCommitLog=131072,
        maxHashSlotNum=64,
        maxIndexNum=256,
        flushIntervalCommitLog=10,
    )
    await group.leader(raft_client, timeout=60)
    await group.create_topic(raft_client, TOPIC, queues=QUEUES)
    acked: dict[str, float] = {}
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    for cut in range(2):
        stop_at = trio.current_time() + rng.uniform(1.5, 2.5)
        async with Producer("power-raft-pg", group.namesrv_addr, retry_times=0) as producer:
            n = 0
            while trio.current_time() < stop_at:
                key = f"c{cut}-{n:06d}"
                n += 1
                try:
                    r = await producer.send(Message(TOPIC, key.encode() * 10, keys=key))
                except Exception:
                    continue
                if r.status is SendStatus.SEND_OK:
                    acked[key] = trio.current_time()
            cut_at = trio.current_time()
            for i in group.ids:
                group.kill(i)  # all three at once: the power goes
        restore_durable(group, shadow)
        snapshot_durable(group, shadow)
        for i in group.ids:
            group.restart(i)
        leader = await group.leader(raft_client, timeout=60)
        # the leader's log is committed and applied everywhere, then every member comes to
        # serve the same messages, the same on two looks in a row
        with trio.fail_after(60):
            while True:
                info = await group.runtime(raft_client, leader) or {}
                end = int(info.get("dledgerLedgerEndIndex", -2))
                applied = [await group.runtime(raft_client, i) for i in group.ids]
                if int(info.get("dledgerCommittedIndex", -1)) == end and all(
                    x and int(x["dledgerAppliedIndex"]) >= end for x in applied
                ):
                    break
                await trio.sleep(0.2)
            last: set[frozenset[str]] = set()
            while True:
                views = [await served_keys(raft_client, group, i) for i in group.ids]
                now = {frozenset(v) for v in views if v is not None}
                if None not in views and len(now) == 1 and now == last:
                    break
                last = now
                await trio.sleep(0.3)
        served = [v for v in views if v is not None]  # all of them: the loop above waited
        for i, keys in zip(group.ids, served, strict=True):
            assert len(keys) == len(set(keys)), f"{i} serves a message twice"
            missing = [k for k in acked if k not in set(keys)]
            too_old = [k for k in missing if cut_at - acked[k] > RAFT_FLUSH_INTERVAL + FLUSH_SLACK]
            assert not too_old, f"{i} lost {len(too_old)} acknowledged long before the cut"
            print(f"cut {cut}: {i} serves {len(keys)}; {len(missing)} acknowledged lost")
        for k in [k for k in acked if k not in set(served[0])]:
            acked.pop(k)
