"""`bench/send_timeline.py`'s matching of the three processes' events into one relay per send."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # bench/ is a directory of scripts, not an installed package

from bench.send_timeline import RELAY, read_events, steps  # noqa: E402

pytestmark = pytest.mark.timeout(10)


def relay(start: int, gap: int = 10) -> list[tuple[int, str, str]]:
    return [(start + i * gap, role, point) for i, (role, point) in enumerate(RELAY)]


def test_each_send_is_cut_into_the_relay_steps() -> None:
    events = relay(1_000) + relay(5_000, gap=20)
    assert steps(events, 0) == [[10] * (len(RELAY) - 1), [20] * (len(RELAY) - 1)]
    assert steps(events, 2_000) == [[20] * (len(RELAY) - 1)]  # sends before `since` left out


def test_other_events_between_the_points_are_skipped() -> None:
    events = relay(1_000)
    # a heartbeat's answer read by the master, a write of the client's to the nameserver
    events += [(1_001, "master", "read"), (1_035, "client", "write0")]
    events.sort()
    assert steps(events, 0) == [[10] * (len(RELAY) - 1)]


def test_a_send_missing_a_point_is_not_counted() -> None:
    broken = [e for e in relay(1_000) if e[1:] != ("slave", "transfer")]
    assert steps(broken + relay(5_000), 0) == [[10] * (len(RELAY) - 1)]


def test_events_are_read_from_every_process_in_time_order(tmp_path: Path) -> None:
    (tmp_path / "ev-11.txt").write_text("send 5\ndone 40\n")
    (tmp_path / "ev-22.txt").write_text("read 20\n")
    got = read_events(tmp_path, {11: "client", 22: "master", 33: "slave"})
    assert got == [(5, "client", "send"), (20, "master", "read"), (40, "client", "done")]
