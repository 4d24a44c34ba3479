"""A range's nodes that end before the planned end are waited for, not reported as data loss.

The planner takes a queue's max offset from the first node that answers; a pull can then land on
another node that has not got that far yet (a DLedger member just elected, a lagging slave). These
tests drive `_pull_bodies` against scripted nodes on a fake clock: no broker, no Spark.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest

from common.remoting.codes import ResponseCode
from common.remoting.command import RemotingCommand
from pipeline.errors import DataLossError
from pipeline.live_reader import CATCH_UP_WAIT, PullTask, _pull_bodies

pytestmark = pytest.mark.timeout(10)


def _record(queue_offset: int) -> bytes:
    """Just enough of a CommitLog record for the reader's gap check: its queue offset."""
    head = struct.pack(">iiiiiq", 64, 0, 0, 0, 0, queue_offset)
    return head + bytes(64 - len(head))


class Node:
    """One broker node whose queue holds offsets [min_offset, max_offset)."""

    def __init__(self, max_offset: int, min_offset: int = 0) -> None:
        self.min_offset = min_offset
        self.max_offset = max_offset

    def pull(self, offset: int, n: int) -> RemotingCommand:
        fields = {"minOffset": str(self.min_offset), "maxOffset": str(self.max_offset)}
        if offset < self.min_offset or offset > self.max_offset:
            return RemotingCommand(
                ResponseCode.PULL_OFFSET_MOVED,
                ext_fields={**fields, "nextBeginOffset": str(self.min_offset)},
            )
        if offset == self.max_offset:
            return RemotingCommand(
                ResponseCode.PULL_NOT_FOUND, ext_fields={**fields, "nextBeginOffset": str(offset)}
            )
        last = min(offset + n, self.max_offset)
        body = b"".join(_record(o) for o in range(offset, last))
        return RemotingCommand(
            ResponseCode.SUCCESS, ext_fields={**fields, "nextBeginOffset": str(last)}, body=body
        )


class Cluster:
    """The fake `BlockingClient`: routes each pull to the node of its address."""

    def __init__(self, nodes: dict[str, Node]) -> None:
        self.nodes = nodes
        self.asked: list[str] = []

    def __call__(self, timeout: float) -> Cluster:
        return self

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def call(self, addr: str, code: int, ext: dict[str, Any] | None = None) -> RemotingCommand:
        assert ext is not None
        self.asked.append(addr)
        return self.nodes[addr].pull(int(ext["queueOffset"]), int(ext["maxMsgNums"]))


class FakeClock:
    def __init__(self, on_sleep: Callable[[float], None] | None = None) -> None:
        self.now = 0.0
        self.on_sleep = on_sleep

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(self.now)


def _task(addrs: tuple[str, ...], start: int, end: int, *, fail: bool = True) -> PullTask:
    return PullTask(
        namesrv="127.0.0.1:1",
        topic="T",
        broker="b",
        queue_id=0,
        start=start,
        end=end,
        addrs=addrs,
        group="g",
        tags="*",
        timeout=1.0,
        pull_batch_size=4,
        fail_on_data_loss=fail,
    )


def _offsets(bodies: list[bytes]) -> list[int]:
    out = []
    for body in bodies:
        for pos in range(0, len(body), 64):
            out.append(struct.unpack_from(">q", body, pos + 20)[0])
    return out


def _read(task: PullTask, cluster: Cluster, clock: FakeClock) -> list[int]:
    bodies = _pull_bodies(task, None, connect=cluster, sleep=clock.sleep, clock=lambda: clock.now)
    return _offsets(list(bodies))


def test_a_node_behind_the_planned_end_hands_over_to_one_that_has_it() -> None:
    cluster = Cluster({"new-leader": Node(9), "follower": Node(10)})
    clock = FakeClock()
    assert _read(_task(("new-leader", "follower"), 0, 10), cluster, clock) == list(range(10))
    assert clock.now == 0.0  # the other node had it: no waiting


def test_when_every_node_is_behind_the_read_waits_for_them_to_catch_up() -> None:
    node = Node(89)

    def apply_later(now: float) -> None:
        if now >= 2.0:
            node.max_offset = 90  # the new leader applied what the old one committed

    cluster = Cluster({"a": node})
    clock = FakeClock(apply_later)
    assert _read(_task(("a",), 86, 90), cluster, clock) == [86, 87, 88, 89]
    assert 2.0 <= clock.now < 3.0


def test_offsets_no_node_reaches_in_time_are_lost() -> None:
    cluster = Cluster({"a": Node(89), "b": Node(88)})
    clock = FakeClock()
    with pytest.raises(DataLossError, match="89..89 are not in the queue on any node"):
        _read(_task(("a", "b"), 86, 90), cluster, clock)
    assert CATCH_UP_WAIT <= clock.now < CATCH_UP_WAIT + 1


def test_with_fail_on_data_loss_off_the_read_keeps_what_it_has() -> None:
    cluster = Cluster({"a": Node(89)})
    clock = FakeClock()
    assert _read(_task(("a",), 86, 90, fail=False), cluster, clock) == [86, 87, 88]


def test_offsets_below_the_min_are_lost_at_once() -> None:
    cluster = Cluster({"a": Node(20, min_offset=10)})
    clock = FakeClock()
    with pytest.raises(DataLossError, match="offset 5 is no longer in the queue"):
        _read(_task(("a",), 5, 20), cluster, clock)
    assert clock.now == 0.0
