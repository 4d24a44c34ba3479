"""Fixtures shared by the whole suite: free loopback ports, a real `rmq up` cluster, and the
real servers in this process (``memory_cluster``, ``tcp_cluster``, ``portal_cluster``: one
``InProcessCluster`` class on the in-memory network or on TCP).

Integration and interop tests run real processes on 127.0.0.1. They pick ports that are free
right now, start `rmq up` in a temporary directory, wait for its `ready` line and, whatever
happens, stop it by pid (SIGTERM, then SIGKILL after a bound) so nothing is left running.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple, overload

import attrs
import hypothesis
import pytest
import trio

from cli.chaos.port_blocks import free_port_block as _free_port_block

# Property tests judge what a function returns, never how long it took: a per-example deadline
# fails them on a busy machine (the suite runs on parallel workers beside real servers), and
# speed is measured in bench/.
hypothesis.settings.register_profile("trio-rmq", deadline=None)
hypothesis.settings.load_profile("trio-rmq")

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from broker.service import BrokerHandle
    from broker.store.api import MessageStore
    from common.message import MessageExt
    from common.remoting.network import Network
    from tests.support.tap import Tap

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


def free_port_block(width: int = 10) -> int:
    """A base port B such that B-2 .. B+width are free, outside the ephemeral port range."""
    return _free_port_block(width)


@attrs.define(eq=False)
class LocalCluster:
    """A running `rmq up` process and what it printed."""

    proc: subprocess.Popen[str]
    data_dir: Path
    namesrv_port: int
    broker_port: int
    lines: list[str] = attrs.Factory(list)
    # set by the reader thread when `ready` was printed
    ready: threading.Event = attrs.Factory(threading.Event)

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    def output(self) -> str:
        return "\n".join(self.lines)


def _pump(cluster: LocalCluster) -> None:
    assert cluster.proc.stdout is not None
    for line in cluster.proc.stdout:
        line = line.rstrip("\n")
        cluster.lines.append(line)
        if line.strip() == "ready":
            cluster.ready.set()


def stop_process(
    proc: subprocess.Popen[str] | subprocess.Popen[bytes], *, grace: float = 10.0
) -> None:
    """SIGTERM by pid, wait up to `grace`, then SIGKILL. Only for processes we started."""
    try:
        _stop(proc, grace)
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


def _stop(proc: subprocess.Popen[str] | subprocess.Popen[bytes], grace: float) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=5)


@contextlib.contextmanager
def run_local_cluster(
    data_dir: Path, *extra_args: str, ready_timeout: float = 30.0
) -> Iterator[LocalCluster]:
    base = free_port_block(40)
    namesrv_port = base + 30
    broker_port = base
    cmd = [
        sys.executable,
        "-m",
        "cli.main",
        "up",
        "--data-dir",
        str(data_dir),
        "--namesrv-port",
        str(namesrv_port),
        "--broker-port",
        str(broker_port),
        *extra_args,
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    cluster = LocalCluster(proc, data_dir, namesrv_port, broker_port)
    threading.Thread(target=_pump, args=(cluster,), daemon=True).start()
    try:
        if not cluster.ready.wait(ready_timeout):
            raise AssertionError(
                f"`rmq up` did not print ready within {ready_timeout}s; output:\n{cluster.output()}"
            )
        yield cluster
    finally:
        stop_process(proc)


@pytest.fixture
def local_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with run_local_cluster(tmp_path / "rmq") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One `rmq up` shared by the tests of a module (they use distinct topics and groups)."""
    with run_local_cluster(tmp_path_factory.mktemp("rmq")) as cluster:
        yield cluster


# run_local_cluster(data_dir, *extra_args, ready_timeout=...), as `cluster_runner` hands it out
ClusterRunner = Callable[..., contextlib.AbstractContextManager[LocalCluster]]


@pytest.fixture(scope="session")
def cluster_runner() -> ClusterRunner:
    """`run_local_cluster` for tests that need their own `rmq up` arguments (test modules cannot
    import this file): `with cluster_runner(tmp_dir, "--slaves", "0") as cluster: ...`."""
    return run_local_cluster


@attrs.define(eq=False)
class Node:
    """One server process started by a test (nameserver or broker)."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    data_dir: Path | None = None
    conf: dict[str, str] = attrs.Factory(dict)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)  # a paused process cannot act on SIGTERM
        stop_process(self.proc)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@attrs.define(eq=False)
class ProcessGroup:
    """Nameservers and brokers as separate processes (`python -m cli.servers.node ...`), by pid.

    Every process started here is stopped at teardown (SIGCONT, SIGTERM, then SIGKILL).
    """

    root: Path
    nodes: list[Node] = attrs.Factory(list)

    def _spawn(self, name: str, args: list[str], port: int, **kw: Any) -> Node:
        log = self.root / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cli.servers.node", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        node = Node(name, proc, port, log, **kw)
        self.nodes.append(node)
        return node

    def namesrv(self, name: str = "namesrv", port: int | None = None) -> Node:
        port = port or free_port_block(4) + 1
        data = self.root / name
        return self._spawn(
            name, ["namesrv", "--port", str(port), "--data-dir", str(data)], port, data_dir=data
        )

    def broker(self, name: str, port: int | None = None, **props: object) -> Node:
        """A broker from broker.conf properties (RocketMQ names); storePathRootDir defaults
        to a directory of its own, listenPort to a free block and grpcServerPort to a port of
        that block (not RocketMQ's 8081, which brokers of other tests would contend for)."""
        port = port or free_port_block(4)
        data = Path(str(props.pop("storePathRootDir", self.root / name)))
        conf = {
            "brokerName": "broker-a",
            "listenPort": str(port),
            "grpcServerPort": str(port + 2),
            "storePathRootDir": str(data),
            **{k: str(v) for k, v in props.items()},
        }
        conf_file = self.root / f"{name}.conf"
        conf_file.write_text("\n".join(f"{k}={v}" for k, v in conf.items()) + "\n")
        return self._spawn(name, ["broker", "-c", str(conf_file)], port, data_dir=data, conf=conf)

    def stop_all(self) -> None:
        for node in reversed(self.nodes):
            with contextlib.suppress(Exception):
                node.stop()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[ProcessGroup]:
    group = ProcessGroup(tmp_path / "nodes")
    group.root.mkdir()
    try:
        yield group
    finally:
        group.stop_all()


# --- one in-process cluster: the real servers in this process -----------------------------


@attrs.define(eq=False)
class InProcessCluster:
    """A real nameserver and real brokers in this test's process, on one network.

    Every node runs in ``nursery`` (cancelled with it); stores are in memory. On a MemoryNetwork
    (``memory_cluster``, ``portal_cluster``) addresses look like loopback ("127.0.0.1:30000") but
    no socket is opened, so tests may use ``autojump_clock``; on TCP (``tcp_cluster``) the ports
    are real (bound on port 0), for clients in other processes. ``start_broker`` adds more (a
    slave, a second master).
    """

    network: Network  # tests.support.memory_network.MemoryNetwork, or common.remoting.network.TCP
    nursery: trio.Nursery
    root: Path
    # False: a broker's config and offset writes stay on the loop (autojump_clock cannot see
    # a worker thread's wall time); True on TCP, as in production
    io_threads: bool = False
    namesrv: str = ""
    # the loop the nodes run in, for `call` from other threads
    token: trio.lowlevel.TrioToken | None = None
    brokers: dict[str, BrokerHandle] = attrs.Factory(dict)  # node name -> its handle
    # node name -> (its cancel scope, set once it stopped)
    _stops: dict[str, tuple[trio.CancelScope, trio.Event]] = attrs.Factory(dict)

    async def start_namesrv(self) -> str:
        from namesrv.config import NamesrvConfig
        from namesrv.service import run_namesrv

        self.token = trio.lowlevel.current_trio_token()
        config = NamesrvConfig(listen_port=0, kv_config_path=str(self.root / "kv.json"))
        handle = await self.nursery.start(
            functools.partial(run_namesrv, config, network=self.network)
        )
        self.namesrv = f"127.0.0.1:{handle.port}"
        return self.namesrv

    async def start_broker(
        self, node: str = "broker-a", *, broker_name: str = "broker-a", **fields: Any
    ) -> BrokerHandle:
        """``fields`` are BrokerConfig attributes (``broker_id``, ...); store ones go in
        ``store=dict(broker_role=...)``. The node runs until :meth:`stop_broker` or the test
        ends."""
        from broker.config import BrokerConfig
        from broker.service import run_broker
        from broker.store import MessageStoreConfig, run_memory_store

        store_fields = fields.pop("store", {})
        config = BrokerConfig(
            broker_name=broker_name,
            listen_port=0,
            namesrv_addr=self.namesrv,
            store=MessageStoreConfig(store_path_root_dir=str(self.root / node), **store_fields),
            **fields,
        )
        scope = trio.CancelScope()
        done = trio.Event()

        async def run(task_status: trio.TaskStatus[BrokerHandle]) -> None:
            try:
                with scope:
                    await run_broker(
                        config,
                        store_factory=run_memory_store,
                        network=self.network,
                        io_threads=self.io_threads,
                        task_status=task_status,
                    )
            finally:
                done.set()

        handle = await self.nursery.start(run)
        self.brokers[node] = handle
        self._stops[node] = (scope, done)
        return handle

    async def stop_broker(self, node: str) -> None:
        """Shut ``node`` down as SIGTERM would (it unregisters from the nameserver)."""
        scope, done = self._stops.pop(node)
        scope.cancel()
        await done.wait()
        del self.brokers[node]

    def broker(self, node: str = "broker-a") -> BrokerHandle:
        return self.brokers[node]

    def addr(self, node: str = "broker-a") -> str:
        return self.brokers[node].addr

    def node_at(self, addr: str) -> str:
        return next(node for node, h in self.brokers.items() if h.addr == addr)

    def tap(self) -> Tap:
        """A network for one client whose requests are recorded and may be failed
        (``tests.support.tap.Tap``)."""
        from tests.support.tap import Tap

        return Tap(self.network, self.nursery)

    async def create_topic(
        self, topic: str, queues: int = 4, *, nodes: tuple[str, ...] = (), **kw: Any
    ) -> None:
        """Create ``topic`` on ``nodes`` (default: every master) through the real admin path;
        the brokers register it with the nameserver before this returns."""
        from rmq import Admin

        masters = nodes or tuple(
            n for n, h in self.brokers.items() if h.controller.config.broker_id == 0
        )
        async with Admin(self.namesrv, network=self.network) as admin:
            for node in masters:
                await admin.create_topic(topic, broker_addr=self.addr(node), queues=queues, **kw)

    def messages(self, topic: str, queue_id: int, node: str = "broker-a") -> list[MessageExt]:
        """What ``node`` stored in one queue, decoded."""
        from common.message import decode_record

        store = self.brokers[node].store
        out = []
        for off in range(
            store.get_min_offset_in_queue(topic, queue_id),
            store.get_max_offset_in_queue(topic, queue_id),
        ):
            phys = store.get_commit_log_offset_in_queue(topic, queue_id, off)
            record = store.select_one_message_by_offset(phys)
            assert record is not None, (topic, queue_id, off)
            out.append(decode_record(record))
        return out

    def offsets(self, group: str, topic: str, node: str = "broker-a") -> dict[int, int]:
        """queue id -> offset ``group`` committed on ``node``."""
        return self.brokers[node].controller.consumer_offset_manager.offsets_of(group, topic)

    def members(self, group: str, node: str = "broker-a") -> list[str]:
        """Client ids ``node`` lists in ``group``."""
        info = self.brokers[node].controller.consumer_manager.get_consumer_group_info(group)
        return [] if info is None else sorted(info.client_ids())

    @overload
    def call(self, fn: Callable[[*Ts], Awaitable[T]], *args: *Ts) -> T: ...
    @overload
    def call(self, fn: Callable[[*Ts], T], *args: *Ts) -> T: ...
    def call(self, fn: Callable[[*Ts], Any], *args: *Ts) -> Any:
        """From a thread outside the cluster's loop (sync/aio bridge tests): run ``fn(*args)``
        (a coroutine function or a plain one) in that loop and return its result."""
        if inspect.iscoroutinefunction(fn):
            return trio.from_thread.run(fn, *args, trio_token=self.token)
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)


@pytest.fixture
def broker_fields() -> dict[str, Any]:
    """BrokerConfig fields of the clusters' first broker (broker-a); a test module overrides
    this fixture to change them (e.g. ``broker_cluster_name``)."""
    return {}


async def _start(cluster: InProcessCluster, broker_fields: dict[str, Any]) -> InProcessCluster:
    await cluster.start_namesrv()
    await cluster.start_broker(**broker_fields)
    return cluster


@pytest.fixture
async def memory_cluster(
    tmp_path: Path, nursery: trio.Nursery, broker_fields: dict[str, Any]
) -> InProcessCluster:
    """A nameserver and one ASYNC_MASTER broker-a, in process, on an in-memory network."""
    from tests.support.memory_network import MemoryNetwork

    return await _start(InProcessCluster(MemoryNetwork(), nursery, tmp_path), broker_fields)


@pytest.fixture
async def tcp_cluster(
    tmp_path: Path, nursery: trio.Nursery, broker_fields: dict[str, Any]
) -> InProcessCluster:
    """``memory_cluster`` on real TCP (127.0.0.1, ports 0) with the broker's I/O threads: for
    a client in another process (the CLI as a subprocess) or over real sockets."""
    from common.remoting.network import TCP

    cluster = InProcessCluster(TCP, nursery, tmp_path, io_threads=True)
    return await _start(cluster, broker_fields)


def _on_portal(
    make: Callable[[trio.Nursery], Awaitable[InProcessCluster]],
) -> Iterator[InProcessCluster]:
    """Run ``make(nursery)``'s cluster on the portal thread's Trio loop until the test ends."""
    from rmq.portal import get_portal

    @contextlib.asynccontextmanager
    async def running() -> AsyncIterator[InProcessCluster]:
        async with trio.open_nursery() as nursery:
            yield await make(nursery)
            nursery.cancel_scope.cancel()

    portal = get_portal()
    lease = portal.enter(running())
    try:
        yield lease.value
    finally:
        portal.exit(lease)


@pytest.fixture
def portal_cluster(tmp_path: Path, broker_fields: dict[str, Any]) -> Iterator[InProcessCluster]:
    """``memory_cluster`` for the plain (non-Trio) tests of ``rmq.sync`` and ``rmq.aio``.

    Those clients run on the process-wide portal thread's Trio loop, and an in-memory stream
    works only inside one loop: so the servers run on the portal too (held open like a sync
    client, ``rmq.portal.Portal.enter``) and the test reaches them through ``cluster.call``.
    """
    from tests.support.memory_network import MemoryNetwork

    async def make(nursery: trio.Nursery) -> InProcessCluster:
        return await _start(InProcessCluster(MemoryNetwork(), nursery, tmp_path), broker_fields)

    yield from _on_portal(make)


@pytest.fixture
def portal_tcp_cluster(tmp_path: Path, broker_fields: dict[str, Any]) -> Iterator[InProcessCluster]:
    """``portal_cluster`` on real TCP (127.0.0.1, ports 0): for rmq.sync's blocking sockets."""
    from common.remoting.network import TCP

    async def make(nursery: trio.Nursery) -> InProcessCluster:
        cluster = InProcessCluster(TCP, nursery, tmp_path, io_threads=True)
        return await _start(cluster, broker_fields)

    yield from _on_portal(make)


# --- Spark ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """ONE local[2] SparkSession for the whole run (5-15 s to start on this machine); pyspark
    and Java are required: a missing one fails the test, never skips it."""
    from pyspark.sql import SparkSession

    import pipeline

    # Spark starts its Python workers with `python3` from PATH unless told otherwise; they must
    # run this interpreter (the venv with the project installed), whatever PATH says.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("trio-rmq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    pipeline.register(session)
    try:
        yield session
    finally:
        session.stop()


# --- a store's CommitLog as bytes (HA and DLedger tests compare members byte for byte) ----------


def all_commit_log_bytes(store: MessageStore, start: int | None = None) -> bytes:
    """Every CommitLog byte from ``start`` (default: min offset) to the max offset."""
    pos = store.get_min_phy_offset() if start is None else start
    out = bytearray()
    end = store.get_max_phy_offset()
    while pos < end:
        data = store.get_commit_log_data(pos)
        assert data is not None, pos
        out += data
        pos += len(data)
    return bytes(out)


@pytest.fixture
def commit_log_bytes() -> Callable[..., bytes]:
    return all_commit_log_bytes


# --- parallel runs (pytest-xdist, `--dist loadfile`) -----------------------------------------
#
# `make test` hands whole files to its workers (a module's fixtures, such as its `rmq up` or its
# Spark session, are then set up once), in the order collected. Files that run real processes
# take most of the run, so they are handed out first and the fast in-process files fill the
# gaps at the end instead of a long file starting last.

_SLOW_FIRST = ("tests/chaos/", "tests/integration/", "tests/interop/", "tests/pipeline/")

# The heaviest files, heaviest first: seconds each took in one whole `pytest -n 3 --dist loadfile`
# run on the shared 2-core box under load (only their order matters). With the longest files
# handed out first, the last file a worker takes is a short one (longest-processing-time-first);
# a heavy file handed out last sets the end of the run alone. A new heavy file not listed here
# still goes out with the slow ones, before the fast files.
_FILE_SECONDS = {
    "tests/integration/test_ha.py": 432,
    "tests/interop/test_py5_client.py": 330,
    "tests/pipeline/test_examples.py": 297,
    "tests/interop/test_py5_ha.py": 281,
    "tests/integration/test_broker_crash.py": 253,
    "tests/pipeline/test_streaming.py": 250,
    "tests/pipeline/test_session.py": 248,
    "tests/pipeline/test_store_source.py": 241,
    "tests/integration/test_disk_full.py": 206,
    "tests/packaging/test_wheel.py": 195,
    "tests/integration/test_dledger_consumers.py": 192,
    "tests/test_readme.py": 160,
    "tests/chaos/test_schedules.py": 157,
    "tests/integration/test_power_loss.py": 153,
    "tests/broker/dledger/test_simulation.py": 139,
    "tests/broker/store/test_crash.py": 121,
    "tests/integration/test_dledger_retention.py": 120,
    "tests/integration/test_cli_bad_paths.py": 103,
    "tests/pipeline/test_sink.py": 99,
    "tests/integration/test_push_consumer.py": 97,
    "tests/integration/test_floods.py": 95,
    "tests/integration/test_up_metrics.py": 91,
    "tests/integration/test_cli_up.py": 88,
    "tests/interop/test_py5_tls.py": 84,
    "tests/pipeline/test_live_source.py": 81,
    "tests/integration/test_dledger_cpp.py": 72,
    "tests/integration/test_broker_config_persist.py": 65,
    "tests/integration/test_local_json.py": 64,
    "tests/interop/test_cpp_client.py": 62,
    "tests/integration/test_dledger_faults.py": 62,
}


def _slow_file(item: pytest.Item) -> bool:
    path = item.nodeid.split("::", 1)[0]
    return path.startswith(_SLOW_FIRST) or item.get_closest_marker("slow") is not None


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist (>= 3.6) hands out `--dist loadfile` files sorted by their NUMBER of tests
    # unless told not to, which undoes the order below: the real-process files with one to five
    # long tests went out last, and the run ended on a lone two-minute test.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow_files = {item.nodeid.split("::", 1)[0] for item in items if _slow_file(item)}

    def order(item: pytest.Item) -> tuple[bool, int]:
        path = item.nodeid.split("::", 1)[0]
        return path not in slow_files, -_FILE_SECONDS.get(path, 0)

    # stable: tests keep their order inside a file
    items.sort(key=order)
