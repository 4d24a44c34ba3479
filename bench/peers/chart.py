"""docs/peers.png: throughput per scenario and system, and p50/p99 latency, per body size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.peers.report import SCENARIOS, size_label

SHORT = {
    "one": "1 in flight\nsync repl.",
    "inflight": "32 in flight\nsync repl.",
    "batch": "batches of 32\nsync repl.",
    "async": "32 in flight\nasync repl.",
    "consume": "consume\nall",
}
LATENCY_SCENARIOS = ("one", "inflight", "async")


def draw(
    meds: dict[tuple[str, int, str], dict[str, Any]],
    sizes: list[int],
    systems: list[str],
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(sizes), 2, figsize=(16, 5.5 * len(sizes)), squeeze=False)
    width = 0.8 / len(systems)
    colors = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]
    for row, size in enumerate(sizes):
        ax, lat = axes[row][0], axes[row][1]
        for i, system in enumerate(systems):
            xs, ys, lo, hi = [], [], [], []
            for j, scenario in enumerate(SCENARIOS):
                m = meds.get((system, size, scenario))
                if m is None:
                    continue
                med, mn, mx = m["rate"]
                xs.append(j + (i - (len(systems) - 1) / 2) * width)
                ys.append(med)
                lo.append(med - mn)
                hi.append(mx - med)
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=system, color=colors[i])
            lxs, p50, p99 = [], [], []
            for j, scenario in enumerate(LATENCY_SCENARIOS):
                m = meds.get((system, size, scenario))
                if m is None or "p50_ms" not in m:
                    continue
                lxs.append(j + (i - (len(systems) - 1) / 2) * width)
                p50.append(m["p50_ms"])
                p99.append(m["p99_ms"])
            lat.bar(lxs, p50, width, color=colors[i], label=system)
            lat.scatter(lxs, p99, color=colors[i], marker="v", edgecolors="black", zorder=3)
        ax.set_xticks(range(len(SCENARIOS)), [SHORT[s] for s in SCENARIOS])
        # log scale: one-at-a-time rates are 20-100x below the consume rates
        ax.set_yscale("log")
        ax.set_ylabel("messages / s (median; whiskers: min-max over runs; log scale)")
        ax.set_title(f"throughput, {size_label(size)} bodies")
        ax.grid(axis="y", alpha=0.3, which="both")
        lat.set_xticks(range(len(LATENCY_SCENARIOS)), [SHORT[s] for s in LATENCY_SCENARIOS])
        lat.set_yscale("log")
        lat.set_ylabel("ms per message (bar: p50, triangle: p99; log scale)")
        lat.set_title(f"send latency, {size_label(size)} bodies")
        lat.grid(axis="y", alpha=0.3, which="both")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(systems), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=100)
    plt.close(fig)
