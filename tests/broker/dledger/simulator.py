"""Deterministic simulation of DLedger groups of RaftCore.

One seed fixes everything: the group size's timings, the network profile (delays, loss,
reordering, duplication), the client's proposals, crashes (between calls or between two
actions of one call), restarts, partitions, leadership transfers and disk-full spells.  The
event loop plays the driver: it calls the cores, executes their actions in order, carries
messages over tests.broker.dledger.sim_network, and after every step runs the checks of
sim_checker.py.  After the faulty phase everything heals and the group must converge.

A crash drops the member's core; its log is kept (mmap writes survive a process crash) and its
hard state is the last one whose PersistState action ran.  A restart builds a new core from
them, with the committed index of a checkpoint taken at some earlier Committed action.

A power cut is a crash that also loses the log's unflushed tail (sim_disk.py): each member
flushes every ``flush_interval`` (drawn per seed), and the simulated driver flushes before
running the actions of a call that answers a push or advanced the committed index, so an ack
(a follower's answer, the leader counting itself) only ever names durable entries, while a
leader's new entries wait for the periodic flush and a power cut can take them.  Power cuts hit one
member, a majority, or everyone at once; some are timed right after a follower acknowledged a
push, when an ack that ran ahead of the flush would be exposed.

Forced cleans (``CLEAN``, in about 30% of the seeds, drawn from a random stream of their own so
the other seeds run exactly as before): while a member is down or cut off, the leader's
retention drops its head files up to its committed index, ignoring the followers (a forced
clean on a full disk, broker/dledger/broker/log_retention.py).  Those seeds use 256-byte data
files (a few entries each), so heads go often and a returning member is often stranded before
the leader's first entry; the leader resets it (raft/entry_handler.py, "Reset") and it must
converge like everyone else.

Planted bugs the checks must catch live in test_simulation.py: cores (a double voter, a vote
forgetter, an eager committer, a leader without Raft's section 5.4.2 current-term commit rule)
and one driver bug, a follower that answers pushes before flushing (``acks_before_flush``).

Replay one seed with a trace, or run many::

    .venv/bin/python -m tests.broker.dledger.sim_cli --seed 1234 --nodes 5 -v
    .venv/bin/python -m tests.broker.dledger.sim_cli --seeds 0:50000 --workers 2
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from typing import Any

import attrs

from broker.dledger.raft.core import (
    Action,
    AppendDone,
    Committed,
    CoreConfig,
    LogReset,
    PersistState,
    RaftCore,
    RoleChanged,
    Send,
    TransferDone,
)
from broker.dledger.raft.log import RaftLog
from broker.dledger.raft.member_state import HardState
from broker.dledger.raft.messages import (
    DLedgerResponseCode,
    PushEntryRequest,
    PushEntryResponse,
    Request,
    Response,
    Role,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from tests.broker.dledger.sim_checker import Checker, SimulationFailure
from tests.broker.dledger.sim_disk import DiskLog
from tests.broker.dledger.sim_network import Channel, NetworkProfile, SimNetwork
from tests.broker.dledger.sim_trace import describe

__all__ = [
    "CoreFactory",
    "SimStats",
    "Simulation",
    "SimulationFailure",
    "replay_command",
    "run_seed",
]

CoreFactory = Callable[[CoreConfig, RaftLog, HardState, random.Random, float, int], RaftCore]

RPC_TIMEOUT = 0.3  # DLedger's 3 s, scaled like the timings below
FAULT_PHASE = 4.0
QUIET_PHASE = 2.5

(TICK, REQUEST, RESPONSE, FAIL, CLIENT, FAULT, RESTART, HEAL, UNFULL, CALM, FLUSH, POWER, CLEAN) = (
    range(13)
)
# the data file size of the seeds with forced cleans: a few entries a file
CLEAN_FILE_SIZE = 256


def default_factory(
    config: CoreConfig,
    log: RaftLog,
    state: HardState,
    rng: random.Random,
    now: float,
    committed: int,
) -> RaftCore:
    return RaftCore(config, log, state, rng=rng, now=now, committed_index=committed)


def replay_command(seed: int, nodes: int, *, fast_first_vote: bool = False) -> str:
    fast = " --fast-first-vote" if fast_first_vote else ""
    return (
        f".venv/bin/python -m tests.broker.dledger.sim_cli --seed {seed} --nodes {nodes}{fast} -v"
    )


@attrs.define(eq=False)
class SimNode:
    id: str
    log: DiskLog
    core: RaftCore | None = None
    incarnation: int = 0
    persisted: HardState = HardState()
    # committed index as the last checkpoint file has it
    checkpoint: int = -1
    # committed index last seen from this incarnation
    last_committed: int = -1
    # deadline a TICK is scheduled for (inf: none)
    tick_at: float = math.inf
    # crash after a random prefix of the actions of the next call
    crash_armed: bool = False
    # ... and that crash is a power cut
    power_armed: bool = False
    # a stalled process: requests arriving before this time are dropped
    deaf_until: float = -math.inf


@attrs.define(eq=False)
class _Rpc:
    src: str
    incarnation: int
    request: Request
    sent: float


@attrs.frozen
class SimStats:
    seed: int
    nodes: int
    events: int
    leaders: int
    committed: int
    acked: int
    crashes: int
    power_cuts: int
    lost_unflushed: int
    partitions: int
    transfers: int
    cleans: int = 0
    resets: int = 0


class Simulation:
    def __init__(
        self,
        seed: int,
        nodes: int,
        *,
        core_factory: CoreFactory = default_factory,
        trace: Callable[[str], None] | None = None,
        acks_before_flush: bool = False,
        fast_first_vote: bool = False,
    ) -> None:
        self.seed, self.rng = seed, random.Random(seed)
        self.factory, self.trace = core_factory, trace
        # the planted driver bug: a follower answers a push before its log is flushed
        self.acks_before_flush = acks_before_flush
        rng = self.rng
        ids = tuple(f"n{i}" for i in range(nodes))
        self.config = CoreConfig(
            group="g",
            self_id="n0",
            peers=ids,
            heart_beat_time_interval_ms=200,
            max_heart_beat_leak=3,
            min_vote_interval_ms=30,
            max_vote_interval_ms=100,
            max_pending_requests_num=rng.choice((10000, 10000, 4)),
            max_wait_ack_time_ms=250,
            max_push_time_out_ms=100,
            max_in_flight_pushes=rng.choice((1000, 1000, 4, 1)),
            enable_batch_push=rng.random() < 0.3,
            max_batch_push_entries=rng.randint(1, 8),
            preferred_leader_id=rng.choice(ids) if rng.random() < 0.3 else None,
            min_take_leadership_vote_interval_ms=3,
            max_take_leadership_vote_interval_ms=10,
            leadership_transfer_wait_timeout_ms=100,
            # the driver's start (a vote pause, not a leak period): a flag of the run, not a
            # draw, so the seeds' schedules without it stay what they were
            fast_first_vote=fast_first_vote,
        )
        fifo = rng.random() < 0.85
        self.network = SimNetwork(
            random.Random(rng.getrandbits(64)),
            NetworkProfile(
                slow_probability=rng.choice((0.0, 0.02, 0.05)),
                loss=rng.choice((0.0, 0.01, 0.03)),
                duplicate=0.0 if fifo else 0.02,
                fifo=fifo,
            ),
        )
        # flushFileInterval (10 ms), and longer: the window a power cut can take
        self.flush_interval = rng.choice((0.001, 0.01, 0.05))
        # forced cleans: a stream of their own, so seeds without them run as they always did
        self.clean_rng = random.Random(f"clean/{seed}")
        self.cleans = self.clean_rng.random() < 0.3
        file_size = CLEAN_FILE_SIZE if self.cleans else 1 << 30
        self.checker = Checker()
        self.nodes = {
            i: SimNode(i, DiskLog(file_size=file_size, owner=i, checker=self.checker)) for i in ids
        }
        self.events: list[tuple[float, int, int, tuple[Any, ...]]] = []
        self.seq = self.rpc_seq = self.body_seq = 0
        self.rpcs: dict[int, _Rpc] = {}
        self.now = 0.0
        self.faulty = True
        self.count = {
            "events": 0,
            "crashes": 0,
            "power": 0,
            "partitions": 0,
            "transfers": 0,
            "cleans": 0,
        }
        self._stall = (0.0, 0)

    # --- plumbing ----------------------------------------------------------------------------

    def _at(self, at: float, kind: int, *args: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, args))

    def _log(self, text: str) -> None:
        if self.trace is not None:
            self.trace(f"{self.now:8.4f} {text}")

    def run(self) -> SimStats:
        for node in self.nodes.values():
            self._start(node)
            self._at(self.rng.uniform(0, self.flush_interval), FLUSH, node.id)
        self._at(self.rng.uniform(0.3, 0.6), CLIENT)
        self._at(self.rng.uniform(0.2, 0.6), FAULT)
        self._at(FAULT_PHASE, CALM)
        if self.cleans:
            self._at(self.clean_rng.uniform(0.5, 2.0), CLEAN)
        end = FAULT_PHASE + QUIET_PHASE
        handlers: list[Callable[..., None]] = [
            self._on_tick,
            self._on_request,
            self._on_response,
            self._on_fail,
            self._on_client,
            self._on_fault,
            self._on_restart,
            self._on_heal,
            self._on_unfull,
            self._on_calm,
            self._on_flush,
            self._on_power,
            self._on_clean,
        ]
        while self.events and self.events[0][0] <= end:
            at, _, kind, args = heapq.heappop(self.events)
            self.now = self.checker.now = at
            self.count["events"] += kind != FLUSH  # a flush is bookkeeping, not an event
            handlers[kind](*args)
        self._check_converged()
        return SimStats(
            seed=self.seed,
            nodes=len(self.nodes),
            events=self.count["events"],
            leaders=len(self.checker.leaders),
            committed=len(self.checker.canon),
            acked=self.checker.acked,
            crashes=self.count["crashes"],
            power_cuts=self.count["power"],
            lost_unflushed=sum(n.log.lost for n in self.nodes.values()),
            partitions=self.count["partitions"],
            transfers=self.count["transfers"],
            cleans=self.count["cleans"],
            resets=self.checker.resets,
        )

    # --- members -----------------------------------------------------------------------------

    def _start(self, node: SimNode) -> None:
        config = attrs.evolve(self.config, self_id=node.id)
        rng = random.Random(self.rng.getrandbits(64))
        node.core = self.factory(config, node.log, node.persisted, rng, self.now, node.checkpoint)
        node.last_committed = node.core.committed_index
        node.tick_at = math.inf
        self._log(
            f"{node.id} starts #{node.incarnation} {node.persisted} checkpoint={node.checkpoint}"
        )
        self._after(node)

    def _crash(self, node: SimNode, *, power: bool = False) -> None:
        if power:
            gone = node.log.power_cut(self.rng)
            self._log(f"{node.id} POWER CUT: lost {gone} unflushed, log ends {node.log.end_index}")
            self.count["power"] += 1
        else:
            self._log(f"{node.id} CRASH")
        self.count["crashes"] += 1
        node.core = None
        node.crash_armed = node.power_armed = False
        node.incarnation += 1
        node.tick_at = math.inf
        for other in self.nodes:
            if other != node.id:
                self.network.break_channels(node.id, other)
        self._at(self.now + self.rng.uniform(0.05, 1.0), RESTART, node.id)

    def _run(self, node: SimNode, actions: list[Action], *, answers_push: bool = False) -> bool:
        """Execute ``actions`` in order as the driver would; True when the member crashed.

        An ack must name durable entries only, so the log is flushed first when the call
        answers a push (``answers_push``: the answer, sent after the actions, acknowledges
        what the log now holds) or advanced the committed index (the leader counted its own
        log end towards the quorum).  Other calls leave their writes (a leader's new entries)
        to the periodic flush, and a power cut can take them."""
        stop = len(actions)
        if self.faulty and not node.crash_armed and self.rng.random() < 0.2:
            if any(isinstance(a, RoleChanged) and a.role is Role.LEADER for a in actions):
                # a new leader dies around its first pushes: its no-op stays a minority's,
                # the divergent tail Raft's Figure 8 starts from
                self._log(f"{node.id} will crash as it takes the lead")
                node.crash_armed = True
        if node.crash_armed:
            stop = self.rng.randrange(len(actions) + 1)
            if node.power_armed and stop == 0:
                self._crash(node, power=True)  # the power went before the flush
                return True
        if answers_push:
            flush = not self.acks_before_flush
        else:
            flush = any(isinstance(a, Committed) for a in actions)
        if flush:
            node.log.flush()
        for action in actions[:stop]:
            self._execute(node, action)
        if node.crash_armed:
            self._crash(node, power=node.power_armed)
            return True
        return False

    def _execute(self, node: SimNode, action: Action) -> None:
        if self.trace is not None:
            self._log(f"{node.id} {describe(action)}")
        if isinstance(action, Send):
            self._send(node, action)
        elif isinstance(action, PersistState):
            node.persisted = action.state
            self.checker.on_persist(node.id, action.state)
        elif isinstance(action, Committed):
            assert node.core is not None
            self.checker.on_committed(node.id, node.log, action.index, node.core.term)
            if self.rng.random() < 0.3:
                node.checkpoint = action.index
        elif isinstance(action, AppendDone):
            self.checker.on_append_done(node.id, node.incarnation, action)
        elif isinstance(action, TransferDone):
            if action.code is DLedgerResponseCode.SUCCESS:
                self.count["transfers"] += 1
        elif isinstance(action, LogReset):
            first = node.log.get(action.begin_index)
            if (
                node.log.begin_index != action.begin_index
                or first is None
                or first.pos != action.begin_pos
            ):
                self.checker.fail(f"{node.id}: {action} does not name its log's first entry")
        elif not isinstance(action, RoleChanged):
            raise SimulationFailure(f"unknown action {action!r}")

    def _after(self, node: SimNode) -> None:
        """The checks after a call into ``node``'s core, then its next tick."""
        core = node.core
        if core is None:
            return
        committed = core.committed_index
        if committed < node.last_committed:
            self.checker.fail(
                f"{node.id} committed index went down {node.last_committed} -> {committed}"
            )
        if committed > core.log.end_index:
            self.checker.fail(
                f"{node.id} committed {committed} beyond its end {core.log.end_index}"
            )
        if committed > node.last_committed:
            self.checker.on_committed(node.id, node.log, committed, core.term)
            node.last_committed = committed
        if core.role is Role.LEADER:
            self.checker.on_leader(node.id, node.incarnation, core.term, node.log)
            if self.now >= core.lease_end():
                # election.py, "The leader's lease": no call returns a leader past its lease
                self.checker.fail(
                    f"{node.id} still leads term {core.term} at {self.now:.4f}, its lease "
                    f"ended at {core.lease_end():.4f}"
                )
        deadline = core.next_deadline()
        if deadline != node.tick_at:
            node.tick_at = deadline
            if deadline < math.inf:
                self._at(max(deadline, self.now), TICK, node.id, node.incarnation, deadline)

    # --- messages ----------------------------------------------------------------------------

    def _send(self, node: SimNode, send: Send) -> None:
        self.rpc_seq += 1
        rpc_id = self.rpc_seq
        self.rpcs[rpc_id] = _Rpc(node.id, node.incarnation, send.request, self.now)
        channel: Channel = (node.id, send.to, "req")
        if self.nodes[send.to].core is None:
            self._at(self.now + 0.001, FAIL, rpc_id)  # connection refused
            return
        arrivals = self.network.transmit(self.now, channel)
        if not arrivals:
            self._lost(rpc_id)
        for at, epoch in arrivals:
            self._at(at, REQUEST, rpc_id, send.to, send.request, channel, epoch)

    def _lost(self, rpc_id: int) -> None:
        rpc = self.rpcs.get(rpc_id)
        if rpc is not None:
            self._at(max(self.now, rpc.sent + RPC_TIMEOUT), FAIL, rpc_id)

    def _on_request(
        self, rpc_id: int, to: str, request: Request, channel: Channel, epoch: int
    ) -> None:
        node = self.nodes[to]
        if (
            node.core is None
            or not self.network.alive(channel, epoch)
            or self.now < node.deaf_until
        ):
            self._lost(rpc_id)
            return
        if self.trace is not None:
            self._log(f"{to} <- {describe(request)}")
        actions, response = node.core.handle_request(request, self.now)
        answers_push = isinstance(response, PushEntryResponse)
        if self._run(node, actions, answers_push=answers_push):
            self._lost(rpc_id)
            return
        if (
            self.faulty
            and answers_push
            and response.code is DLedgerResponseCode.SUCCESS
            and self.rng.random() < 0.03
        ):
            # the power fails just after an ack: what the ack named must be on disk
            self._at(self.now + self.rng.uniform(0.0, 0.002), POWER, self._quorum_or_all())
        if (
            self.faulty
            and isinstance(request, PushEntryRequest)
            and request.entries
            and request.entries[-1].term < request.term
            and self.rng.random() < 0.6
        ):
            # it took entries of an older term from a new leader and stalls: a quorum may now
            # hold them without the leader's own (section 5.4.2's window; see _on_response)
            node.deaf_until = self.now + self.rng.uniform(0.01, 0.1)
            self._log(f"{to} stalls until {node.deaf_until:.4f}")
        self._after(node)
        if isinstance(response, VoteResponse) and response.vote_result is VoteResult.ACCEPT:
            if isinstance(request, VoteRequest) and request.leader_id is not None:
                self.checker.on_vote_granted(to, request.term, request.leader_id)
        back: Channel = (to, channel[0], "resp")
        arrivals = self.network.transmit(self.now, back)
        if not arrivals:
            self._lost(rpc_id)
        for at, back_epoch in arrivals:
            self._at(at, RESPONSE, rpc_id, response, back, back_epoch)

    def _on_response(self, rpc_id: int, response: Response, channel: Channel, epoch: int) -> None:
        if not self.network.alive(channel, epoch):
            self._lost(rpc_id)
            return
        rpc = self.rpcs.pop(rpc_id, None)
        if rpc is None:
            return
        node = self.nodes[rpc.src]
        if node.core is None or node.incarnation != rpc.incarnation:
            return
        if self.now > rpc.sent + RPC_TIMEOUT:
            self._log(f"{node.id} timeout {describe(rpc.request)}")
            actions = node.core.handle_failure(rpc.request, self.now)
        else:
            if self.trace is not None:
                self._log(f"{node.id} <- {describe(response)}")
            before = self._quorum_index(node.core)
            actions = node.core.handle_response(rpc.request, response, self.now)
            after = self._quorum_index(node.core)
            if (
                self.faulty
                and after > before
                and node.log.term_at(after) < node.core.term
                and self.rng.random() < 0.8
            ):
                # a quorum now holds an entry of an older term, not yet one of this term:
                # Raft's section 5.4.2 says not to count it committed.  Kill the leader now,
                # so a leader that did count it leaves a commit the next one may overwrite
                if not self._run(node, actions):
                    self._after(node)
                    self._crash(node)
                return
        if not self._run(node, actions):
            self._after(node)

    def _on_fail(self, rpc_id: int) -> None:
        rpc = self.rpcs.pop(rpc_id, None)
        if rpc is None:
            return
        node = self.nodes[rpc.src]
        if node.core is None or node.incarnation != rpc.incarnation:
            return
        self._log(f"{node.id} failed {describe(rpc.request)}")
        if not self._run(node, node.core.handle_failure(rpc.request, self.now)):
            self._after(node)

    def _on_tick(self, member: str, incarnation: int, deadline: float) -> None:
        node = self.nodes[member]
        if node.core is None or node.incarnation != incarnation or node.tick_at != deadline:
            return
        node.tick_at = math.inf
        if self._stall[0] == self.now:
            self._stall = (self.now, self._stall[1] + 1)
            if self._stall[1] > 1000:
                self.checker.fail(f"{member}: next_deadline() does not move past {self.now}")
        else:
            self._stall = (self.now, 0)
        if not self._run(node, node.core.tick(self.now)):
            self._after(node)

    # --- the world ---------------------------------------------------------------------------

    def _leaders(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.core is not None and n.core.role is Role.LEADER]

    def _on_client(self) -> None:
        if self.now >= FAULT_PHASE + QUIET_PHASE - 1.0:
            return  # the last second lets the final entries commit everywhere
        self._at(self.now + self.rng.expovariate(12.0), CLIENT)
        leaders = self._leaders()
        if not leaders:
            return
        node = self.rng.choice(leaders)
        assert node.core is not None
        bodies = []
        for _ in range(self.rng.choice((1, 1, 1, 2, 3))):
            self.body_seq += 1
            bodies.append(f"{self.seed}:{self.body_seq}".encode())
        code, entries, actions = node.core.propose(bodies, self.now)
        self._log(f"{node.id} propose {len(bodies)} -> {code.name} {[e.index for e in entries]}")
        if entries:
            self.checker.on_proposed(node.id, node.incarnation, entries)
        if not self._run(node, actions):
            self._after(node)

    def _on_fault(self) -> None:
        if not self.faulty:
            return
        self._at(self.now + self.rng.expovariate(2.5), FAULT)
        rng = self.rng
        ids = sorted(self.nodes)
        kind = rng.choice(
            ("crash", "crash", "arm", "partition", "partition", "transfer", "disk", "power")
        )
        up = [n for n in self.nodes.values() if n.core is not None]
        if kind in ("crash", "arm") and up:
            # half the crashes hit a leader: the interesting interleavings follow its death
            leaders = self._leaders()
            node = rng.choice(leaders if leaders and rng.random() < 0.5 else up)
            if kind == "crash":
                self._crash(node, power=rng.random() < 0.3)
            else:
                node.power_armed = rng.random() < 0.3
                self._log(
                    f"{node.id} will {'lose power' if node.power_armed else 'crash'} "
                    "inside its next call"
                )
                node.crash_armed = True
        elif kind == "power":
            self._on_power(self._quorum_or_all())
        elif kind == "partition":
            rng.shuffle(ids)
            cut = rng.randint(1, len(ids) // 2)
            self._log(f"PARTITION {ids[:cut]} | {ids[cut:]}")
            self.count["partitions"] += 1
            self.network.partition([ids[:cut], ids[cut:]])
            self._at(self.now + rng.uniform(0.1, 1.5), HEAL)
        elif kind == "transfer":
            for node in self._leaders():
                assert node.core is not None
                target = rng.choice([i for i in ids if i != node.id])
                code, actions = node.core.transfer_leadership(target, self.now)
                self._log(f"{node.id} transfer to {target} -> {code.name}")
                if not self._run(node, actions):
                    self._after(node)
        elif kind == "disk" and up:
            node = rng.choice(up)
            assert node.core is not None
            node.core.set_disk_full(True)
            self._log(f"{node.id} disk full")
            self._at(self.now + rng.uniform(0.05, 0.5), UNFULL, node.id, node.incarnation)

    @staticmethod
    def _quorum_index(core: RaftCore) -> int:
        """Leader: the highest index a quorum acknowledged (its own end counted); else -1."""
        marks = sorted(core.peer_watermarks().values(), reverse=True)
        return marks[len(marks) // 2] if marks else -1

    def _quorum_or_all(self) -> tuple[str, ...]:
        ids = sorted(self.nodes)
        self.rng.shuffle(ids)
        size = self.rng.choice((1, len(ids) // 2 + 1, len(ids)))
        return tuple(sorted(ids[:size]))

    def _on_power(self, members: tuple[str, ...]) -> None:
        if not self.faulty:
            return
        self._log(f"POWER FAILS on {list(members)}")
        for member in members:
            node = self.nodes[member]
            if node.core is not None:
                self._crash(node, power=True)
            else:
                node.log.power_cut(self.rng)  # down already: its page cache goes too

    def _on_clean(self) -> None:
        """A forced clean on the leader while a member is away (module doc)."""
        if not self.faulty:
            return
        self._at(self.now + self.clean_rng.uniform(0.1, 0.6), CLEAN)
        leaders = sorted(
            (n for n in self._leaders() if n.core is not None),
            key=lambda n: n.core.term if n.core is not None else -1,
        )
        if not leaders:
            return
        leader = leaders[-1]
        assert leader.core is not None
        marks = leader.core.peer_watermarks()
        upto = leader.core.committed_index
        if min(marks.values(), default=upto) >= upto:
            return  # everyone holds it: ordinary retention, nothing to strand
        dropped = leader.log.drop_head(upto)
        if dropped:
            self.count["cleans"] += 1
            self._log(
                f"{leader.id} FORCED CLEAN: dropped {dropped} entries, begins at "
                f"{leader.log.begin_index} (watermarks {marks})"
            )

    def _on_flush(self, member: str) -> None:
        self.nodes[member].log.flush()
        self._at(self.now + self.flush_interval, FLUSH, member)

    def _on_restart(self, member: str) -> None:
        node = self.nodes[member]
        if node.core is None:
            self._start(node)

    def _on_heal(self) -> None:
        self._log("HEAL")
        self.network.heal()

    def _on_unfull(self, member: str, incarnation: int) -> None:
        node = self.nodes[member]
        if node.core is not None and node.incarnation == incarnation:
            node.core.set_disk_full(False)

    def _on_calm(self) -> None:
        """End of the faulty phase: heal, restart everyone, stop injecting faults."""
        self._log("CALM")
        self.faulty = False
        self.network.heal()
        # a healthy network from now on: TCP-like, nothing lost, so the group must converge
        self.network.profile = NetworkProfile()
        for node in self.nodes.values():
            node.crash_armed = node.power_armed = False
            if node.core is None:
                self._start(node)
            else:
                node.core.set_disk_full(False)

    def _check_converged(self) -> None:
        leaders = self._leaders()
        top = max((n.core.term for n in leaders if n.core is not None), default=-1)
        current = [n for n in leaders if n.core is not None and n.core.term == top]
        if len(current) != 1:
            self.checker.fail(f"no single leader after the quiet phase: {[n.id for n in leaders]}")
        leader = current[0]
        assert leader.core is not None
        end = leader.log.end_index
        for node in self.nodes.values():
            assert node.core is not None
            if node.core.committed_index != end or node.core.term != top:
                self.checker.fail(
                    f"not converged: leader {leader.id} term {top} end {end}, "
                    f"{node.id} term {node.core.term} committed {node.core.committed_index}"
                )


def run_seed(
    seed: int,
    nodes: int,
    *,
    core_factory: CoreFactory = default_factory,
    trace: Callable[[str], None] | None = None,
    acks_before_flush: bool = False,
    fast_first_vote: bool = False,
) -> SimStats:
    """Run one seed; raises SimulationFailure (with the replay command) when a check fails."""
    try:
        simulation = Simulation(
            seed,
            nodes,
            core_factory=core_factory,
            trace=trace,
            acks_before_flush=acks_before_flush,
            fast_first_vote=fast_first_vote,
        )
        return simulation.run()
    except SimulationFailure as e:
        replay = replay_command(seed, nodes, fast_first_vote=fast_first_vote)
        raise SimulationFailure(f"seed {seed} ({nodes} nodes): {e}\nreplay: {replay}") from e


def nodes_for(seed: int) -> int:
    """The default mix: even seeds run 3 members, odd seeds 5."""
    return 3 if seed % 2 == 0 else 5
