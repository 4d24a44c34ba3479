"""The pure part of the peer benchmark: medians, ratios, the markdown section and its place.

A sample is one scenario of one system at one body size in one run (the dict a Meter made,
plus "run", "system", "size", "scenario"); a setup row is one system's start-up and memory in
one run ("run", "system", "ready_s", "rss_kib": {process: KiB}). Ratios are ours / peer, so
above 1 means more of it for us (messages per second: better; memory, start-up: worse).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

BEGIN, END = "<!-- peers-bench:begin -->", "<!-- peers-bench:end -->"
OURS_PREFIX = "trio-rmq"

SCENARIOS: dict[str, str] = {
    "one": "1 in flight, sync-replicated",
    "inflight": "32 in flight, sync-replicated, single sends",
    "batch": "32 in flight, sync-replicated, batches of 32 (1 batch in flight)",
    "async": "32 in flight, async replication",
    "consume": "consume everything from the start",
}
# our batches of 32 are compared with the peers' 32 single messages in flight
PEER_SCENARIO = {"batch": "inflight"}

Sample = dict[str, Any]


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return math.nan
    k = max(0, math.ceil(p / 100.0 * len(sorted_values)) - 1)
    return sorted_values[k]


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(values), min(values), max(values)


def ratio(ours: float | None, peer: float | None) -> float | None:
    if ours is None or peer is None or peer == 0:
        return None
    return ours / peer


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def medians(samples: list[Sample]) -> dict[tuple[str, int, str], dict[str, Any]]:
    """(system, size, scenario) -> rate (median, min, max), median p50/p99, median CPU."""
    groups: dict[tuple[str, int, str], list[Sample]] = defaultdict(list)
    for s in samples:
        groups[(s["system"], s["size"], s["scenario"])].append(s)
    out: dict[tuple[str, int, str], dict[str, Any]] = {}
    for key, group in groups.items():
        entry: dict[str, Any] = {"rate": spread([s["rate"] for s in group]), "runs": len(group)}
        for field in ("p50_ms", "p99_ms", "host_cpu_us"):
            values = [s[field] for s in group if field in s]
            if values:
                entry[field] = statistics.median(values)
        procs = {p for s in group for p in s["cpu_us"]}
        entry["cpu_us"] = {
            p: statistics.median([s["cpu_us"][p] for s in group if p in s["cpu_us"]])
            for p in sorted(procs)
        }
        out[key] = entry
    return out


def setup_medians(setups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """system -> start-up seconds and summed RSS MiB (median, min, max), per-process MiB."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in setups:
        groups[s["system"]].append(s)
    out: dict[str, dict[str, Any]] = {}
    for system, group in groups.items():
        procs = sorted({p for s in group for p in s["rss_kib"]})
        out[system] = {
            "ready_s": spread([s["ready_s"] for s in group]),
            "rss_mib": spread([sum(s["rss_kib"].values()) / 1024 for s in group]),
            "per_process_mib": _per_process(group, "rss_kib", procs),
            # the second reading, SETTLE_S later (absent from older JSON)
            "settled_per_process_mib": _per_process(group, "rss_settled_kib", procs),
        }
    return out


def _per_process(group: list[dict[str, Any]], field: str, procs: list[str]) -> dict[str, float]:
    out = {}
    for p in procs:
        values = [s[field][p] / 1024 for s in group if p in s.get(field, {})]
        if values:
            out[p] = statistics.median(values)
    return out


def _rate(m: dict[str, Any]) -> str:
    med, lo, hi = m["rate"]
    return f"{med:,.0f} ({lo:,.0f}-{hi:,.0f})"


def _ms(m: dict[str, Any], field: str) -> str:
    return f"{m[field]:.2f}" if field in m else "-"


def size_label(size: int) -> str:
    return f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B"


def throughput_table(
    meds: dict[tuple[str, int, str], dict[str, Any]],
    size: int,
    systems: list[str],
    peers: dict[str, str],
) -> list[str]:
    """One row per (scenario, system) at `size`; our rows carry ours / each peer."""
    head = "| scenario | system | msg/s median (min-max) | p50 ms | p99 ms |"
    head += "".join(f" ours/{label} |" for label in peers)
    lines = [head, "|---|---|---:|---:|---:|" + "---:|" * len(peers)]
    for scenario, label in SCENARIOS.items():
        for system in systems:
            m = meds.get((system, size, scenario))
            if m is None:
                continue
            row = f"| {label} | {system} | {_rate(m)} | {_ms(m, 'p50_ms')} | {_ms(m, 'p99_ms')} |"
            for peer in peers.values():
                if not system.startswith(OURS_PREFIX):
                    row += " |"
                    continue
                other = meds.get((peer, size, PEER_SCENARIO.get(scenario, scenario)))
                row += f" {fmt_ratio(ratio(m['rate'][0], other['rate'][0] if other else None))} |"
            lines.append(row)
    return lines


def setup_table(
    sm: dict[str, dict[str, Any]], systems: list[str], peers: dict[str, str]
) -> list[str]:
    head = "| system | start-up s median (min-max) | RSS MiB, all processes, median (min-max) |"
    head += " RSS per process (MiB, median) | settled, 2 s later |"
    head += "".join(f" start-up ours/{p} | RSS ours/{p} |" for p in peers)
    lines = [head, "|---|---:|---:|---|---|" + "---:|---:|" * len(peers)]
    for system in systems:
        m = sm.get(system)
        if m is None:
            continue
        (r, rlo, rhi), (mem, mlo, mhi) = m["ready_s"], m["rss_mib"]
        per = ", ".join(f"{p} {v:.1f}" for p, v in m["per_process_mib"].items())
        settled = ", ".join(f"{p} {v:.1f}" for p, v in m["settled_per_process_mib"].items())
        row = f"| {system} | {r:.2f} ({rlo:.2f}-{rhi:.2f}) | {mem:.1f} ({mlo:.1f}-{mhi:.1f}) |"
        row += f" {per} | {settled or '-'} |"
        for peer in peers.values():
            other = sm.get(peer)
            if not system.startswith(OURS_PREFIX) or other is None:
                row += " | |"
                continue
            row += f" {fmt_ratio(ratio(r, other['ready_s'][0]))} |"
            row += f" {fmt_ratio(ratio(mem, other['rss_mib'][0]))} |"
        lines.append(row)
    return lines


def cpu_table(
    meds: dict[tuple[str, int, str], dict[str, Any]], sizes: list[int], systems: list[str]
) -> list[str]:
    lines = [
        "| body | scenario | system | host CPU us/msg | per process CPU us/msg |",
        "|---|---|---|---:|---|",
    ]
    for size in sizes:
        for scenario in SCENARIOS:
            for system in systems:
                m = meds.get((system, size, scenario))
                if m is None:
                    continue
                per = ", ".join(f"{p} {v:.0f}" for p, v in m["cpu_us"].items())
                host = f"{m['host_cpu_us']:.0f}" if "host_cpu_us" in m else "-"
                lines.append(f"| {size_label(size)} | {scenario} | {system} | {host} | {per} |")
    return lines


def markdown(
    samples: list[Sample],
    setups: list[dict[str, Any]],
    systems: list[str],
    peers: dict[str, str],
    sizes: list[int],
    intro: list[str],
    notes: list[str],
) -> str:
    meds = medians(samples)
    out = [BEGIN, "## trio-rmq against Redis and NATS JetStream (`bench/peers`)", "", *intro, ""]
    for size in sizes:
        out += [f"### {size_label(size)} bodies", ""]
        out += throughput_table(meds, size, systems, peers) + [""]
    out += ["### Start-up and memory", ""]
    out += setup_table(setup_medians(setups), systems, peers) + [""]
    out += ["### CPU per message (median over the runs)", ""]
    out += cpu_table(meds, sizes, systems) + [""]
    out += [*notes, "", END]
    return "\n".join(out)


def replace_section(text: str, section: str) -> str:
    """`text` with the marked section replaced by `section` (appended if absent)."""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        return head + section + tail
    return text.rstrip("\n") + "\n\n" + section + "\n"
