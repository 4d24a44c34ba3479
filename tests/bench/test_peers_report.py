"""The pure parts of `python -m bench.peers`: medians, ratios, tables, the docs section."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # bench/ is a directory of scripts, not an installed package

from bench.peers import report  # noqa: E402

pytestmark = pytest.mark.timeout(10)

OURS, REDIS, NATS = "trio-rmq SYNC_MASTER+slave", "Redis primary+replica", "NATS JetStream R3"
PEERS = {"Redis": REDIS, "NATS R3": NATS}


def sample(system: str, scenario: str, rate: float, run: int, **extra: object) -> dict:
    return dict(
        run=run,
        system=system,
        size=1024,
        scenario=scenario,
        rate=rate,
        cpu_us={"p": rate / 100},
        **extra,
    )


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert report.percentile(values, 50) == 50.0
    assert report.percentile(values, 99) == 99.0
    assert report.percentile(values, 100) == 100.0
    assert report.percentile([7.0], 99) == 7.0
    assert math.isnan(report.percentile([], 50))


def test_spread_and_ratio() -> None:
    assert report.spread([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    assert report.spread([4.0, 1.0]) == (2.5, 1.0, 4.0)
    assert report.ratio(10.0, 4.0) == 2.5
    assert report.ratio(10.0, None) is None
    assert report.ratio(None, 4.0) is None
    assert report.ratio(10.0, 0.0) is None
    assert report.fmt_ratio(None) == "-"
    assert report.fmt_ratio(0.456) == "0.46x"


def test_medians_group_by_system_size_and_scenario() -> None:
    samples = [
        sample(OURS, "one", 100.0, 1, p50_ms=1.0, p99_ms=3.0),
        sample(OURS, "one", 300.0, 2, p50_ms=2.0, p99_ms=9.0),
        sample(OURS, "one", 200.0, 3, p50_ms=5.0, p99_ms=4.0),
        sample(REDIS, "one", 50.0, 1),
    ]
    meds = report.medians(samples)
    ours = meds[(OURS, 1024, "one")]
    assert ours["rate"] == (200.0, 100.0, 300.0)
    assert (ours["p50_ms"], ours["p99_ms"]) == (2.0, 4.0)
    assert ours["cpu_us"] == {"p": 2.0}
    assert ours["runs"] == 3
    assert "p50_ms" not in meds[(REDIS, 1024, "one")]


def test_table_ratios_compare_the_matching_peer_scenario() -> None:
    samples = [
        sample(REDIS, "inflight", 1000.0, 1),
        sample(NATS, "inflight", 500.0, 1),
        sample(REDIS, "async", 4000.0, 1),
        sample(OURS, "inflight", 2000.0, 1),
        sample(OURS, "batch", 3000.0, 1),  # compared with the peers' 32 single sends in flight
        sample(OURS, "async", 1000.0, 1),  # NATS has no async mode
    ]
    lines = report.throughput_table(report.medians(samples), 1024, [REDIS, NATS, OURS], PEERS)
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    rows = {(c[0], c[1]): c[2:] for c in cells}
    label = report.SCENARIOS
    assert rows[(label["inflight"], OURS)][-2:] == ["2.00x", "4.00x"]
    assert rows[(label["batch"], OURS)][-2:] == ["3.00x", "6.00x"]
    assert rows[(label["async"], OURS)][-2:] == ["0.25x", "-"]
    # peers get no ratio cells filled in
    assert rows[(label["inflight"], REDIS)][-2:] == ["", ""]
    assert len(lines) == 2 + len(samples)


def test_setup_medians_sum_every_process() -> None:
    setups = [
        dict(run=1, system=OURS, ready_s=1.0, rss_kib={"a": 1024, "b": 2048}),
        dict(run=2, system=OURS, ready_s=3.0, rss_kib={"a": 3072, "b": 2048}),
    ]
    setups[0]["rss_settled_kib"] = {"a": 512, "b": 1024}
    setups[1]["rss_settled_kib"] = {"a": 1536, "b": 1024}
    m = report.setup_medians(setups)[OURS]
    assert m["ready_s"] == (2.0, 1.0, 3.0)
    assert m["rss_mib"] == (4.0, 3.0, 5.0)
    assert m["per_process_mib"] == {"a": 2.0, "b": 2.0}
    assert m["settled_per_process_mib"] == {"a": 1.0, "b": 1.0}
    row = report.setup_table({OURS: m}, [OURS], {})[2]
    assert row.endswith("| a 2.0, b 2.0 | a 1.0, b 1.0 |")
    # JSON from before the second reading: the column says so
    del setups[0]["rss_settled_kib"], setups[1]["rss_settled_kib"]
    assert report.setup_table(report.setup_medians(setups), [OURS], {})[2].endswith("| - |")


def test_replace_section_between_markers_keeps_the_rest() -> None:
    text = f"# Benchmarks\n\nbefore\n\n{report.BEGIN}\nold numbers\n{report.END}\n\nafter\n"
    section = f"{report.BEGIN}\nnew numbers\n{report.END}"
    out = report.replace_section(text, section)
    assert out == f"# Benchmarks\n\nbefore\n\n{section}\n\nafter\n"
    assert "old numbers" not in out
    assert report.replace_section(out, section) == out


def test_replace_section_appends_when_markers_are_absent() -> None:
    section = f"{report.BEGIN}\nnew numbers\n{report.END}"
    out = report.replace_section("# Benchmarks\n\nother section\n\n", section)
    assert out == f"# Benchmarks\n\nother section\n\n{section}\n"
    assert report.replace_section(out, section) == out


def test_markdown_has_a_table_per_size_and_the_markers() -> None:
    samples = [sample(REDIS, "one", 10.0, 1), sample(OURS, "one", 5.0, 1)]
    samples += [dict(s, size=100) for s in samples]
    setups = [dict(run=1, system=OURS, ready_s=1.0, rss_kib={"a": 1024})]
    md = report.markdown(samples, setups, [REDIS, OURS], PEERS, [1024, 100], ["intro"], ["note"])
    assert md.startswith(report.BEGIN) and md.endswith(report.END)
    assert "### 1 KiB bodies" in md and "### 100 B bodies" in md
    assert md.count("| 0.50x |") == 2
