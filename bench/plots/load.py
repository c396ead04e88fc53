"""Charts and tables of the runs under steady load: latency_load.json
(bench.perf.latency_load) and soak.json (bench.faults.soak). bench.plots.plot
draws them with the others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.plots.common import finish, plt
from bench.record import ResultRecord

__all__ = ["latency_load_table", "plot_latency_load", "plot_soak", "soak_table"]

PERCENTILE_STYLES = {
    "p50_ms": ("p50", "tab:blue", "-"),
    "p95_ms": ("p95", "tab:orange", "-"),
    "p99_ms": ("p99", "tab:red", "-"),
    "max_ms": ("max", "0.4", ":"),
}
# Soak panels: the series, its label, and a scale for the axis.
SOAK_PANELS = (
    ("throughput_per_second", "completions/s", 1.0),
    ("latency_p99_ms", "start latency p99 (ms)", 1.0),
    ("jobs_table_bytes", "jobs table (MB)", 1e-6),
    ("jobs_index_bytes", "its indexes (MB)", 1e-6),
    ("dead_tuples", "dead tuples", 1.0),
    ("worker_rss_kib", "worker RSS, all (MiB)", 1 / 1024),
    ("load_average_1m", "machine load average (1 min)", 1.0),
    # Beside the queue: the slowest one-row commit of the minute (newer runs).
    ("probe_commit_max_ms", "slowest probe commit (ms)", 1.0),
)


def plot_latency_load(record: ResultRecord, out: Path) -> Path:
    levels = record.results["levels"]
    configs = record.parameters["configs"]
    capacity = record.results["capacity_jobs_per_second"]
    fig, axes = plt.subplots(1, len(levels), figsize=(6.4 * len(levels), 4.8), squeeze=False)
    for ax, (name, per) in zip(axes[0], levels.items(), strict=True):
        loads = [float(load) * 100 for load in per]
        for key, (label, color, style) in PERCENTILE_STYLES.items():
            ax.plot(
                loads, [c[key] for c in per.values()], style, marker="o", color=color, label=label
            )
        p99 = [[r["p99_ms"] for r in c["runs"]] for c in per.values()]
        low, high = [min(v) for v in p99], [max(v) for v in p99]
        ax.fill_between(loads, low, high, color="tab:red", alpha=0.12, label="p99 min-max")
        for x, cell in zip(loads, per.values(), strict=True):
            note = f"{cell['completion_per_second']:,.0f}/s done"
            if not cell["producer_kept_up"]:
                note += "\n(producer behind)"
            ax.annotate(
                note,
                (x, cell["max_ms"]),
                textcoords="offset points",
                xytext=(0, 8),
                ha="center",
                fontsize=7,
                color="0.3",
            )
        if name == "noop":
            ax.axhline(25, color="tab:green", linestyle="--", linewidth=1, label="goal p99 at 50 %")
        ax.set_yscale("log")
        ax.set_xticks(loads, [f"{x:.0f} %" for x in loads])
        ax.set_xlabel(f"offered load (of capacity {capacity[name]['median']:,.0f} jobs/s)")
        ax.set_ylabel("enqueue-to-start latency (ms, log)")
        ax.set_title(configs[name]["label"], fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    p = record.parameters
    title = (
        f"Latency under an open-loop load: {p['seconds_per_level']:g} s per level, "
        f"median of {p['repeats']} rounds (database clock)"
    )
    return finish(fig, record, out / "latency_load.png", title=title)


def plot_soak(record: ResultRecord, out: Path) -> Path:
    rows = record.results["per_minute"]
    minutes = [r["minute"] for r in rows]
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.2))
    flat = record.results["flatness"]["series"]
    panels = [panel for panel in SOAK_PANELS if panel[0] in rows[0]]
    for ax, (key, label, scale) in zip(axes.flat, panels, strict=False):
        values = [None if r[key] is None else r[key] * scale for r in rows]
        ax.plot(minutes, values, marker=".", color="tab:blue")
        verdict = flat.get(key)
        if verdict is not None:
            state = "flat" if verdict["flat"] else "NOT flat"
            label += f"\nlast/first quarter {verdict['ratio']}: {state}"
        ax.set_title(label, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("minute")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    p = record.parameters
    r = record.results
    title = (
        f"Soak: {p['seconds'] / 60:g} min at {p['rate_per_second']:g} jobs/s "
        f"({r['jobs_enqueued']:,} jobs, {r['jobs_lost']} lost), retention "
        f"{p['worker_settings']['retention_seconds']} s; "
        f"{'flat' if r['flatness']['flat'] else 'NOT flat'}"
    )
    return finish(fig, record, out / "soak.png", title=title)


def latency_load_table(record: ResultRecord) -> list[str]:
    out = [
        f"\nlatency_load.json (ms, median of {record.parameters['repeats']} rounds):\n",
        "| jobs | load | offered/s | completed/s | p50 | p95 | p99 (min-max) | max "
        "| enqueue p50 | seconds over 25 ms | load avg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, per in record.results["levels"].items():
        for load, c in per.items():
            behind = "" if c["producer_kept_up"] else " (producer behind)"
            p99 = [r["p99_ms"] for r in c["runs"]]
            out.append(
                f"| {name} | {float(load):.0%} | {c['achieved_per_second']:,.0f}{behind} "
                f"| {c['completion_per_second']:,.0f} | {c['p50_ms']:.1f} | {c['p95_ms']:.1f} "
                f"| {c['p99_ms']:.1f} ({min(p99):.0f}-{max(p99):.0f}) | {c['max_ms']:.1f} "
                f"| {c['enqueue_p50_ms']:.1f} | {_slow(c)} | {c['load_average_1m']:.1f} |"
            )
    return out


def _slow(cell: dict[str, Any]) -> str:
    """Seconds with a median latency over 25 ms, of the level's seconds
    (median of the rounds); blank in a record from before it was counted."""
    if "seconds_median_over_25_ms" not in cell:
        return ""
    return f"{cell['seconds_median_over_25_ms']:g} of {cell['runs'][0]['seconds']}"


def soak_table(record: ResultRecord) -> list[str]:
    rows = record.results.get("per_minute", [])
    if not rows or "throughput_per_second" not in rows[0]:
        return []  # a record of the older soak, without per-minute rows
    probed = "probe_commit_max_ms" in rows[0]
    out = [
        "\nsoak.json (every 5th minute):\n",
        "| minute | done/s | p50 ms | p99 ms | table MB | indexes MB | dead tuples "
        "| RSS MiB | load avg |" + (" slowest commit ms |" if probed else ""),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if probed else ""),
    ]
    for r in rows:
        if r["minute"] % 5 and r is not rows[0] and r is not rows[-1]:
            continue
        out.append(
            f"| {r['minute']} | {r['throughput_per_second']:.1f} | {r['latency_p50_ms']} "
            f"| {r['latency_p99_ms']} | {r['jobs_table_bytes'] / 1e6:.2f} "
            f"| {r['jobs_index_bytes'] / 1e6:.2f} | {r['dead_tuples']:,} "
            f"| {r['worker_rss_kib'] / 1024:.1f} | {r['load_average_1m']} |"
            + (f" {r['probe_commit_max_ms']} |" if probed else "")
        )
    out += [
        "",
        "| series | first quarter | last quarter | ratio | bound | flat |",
        "|---|---:|---:|---:|---|---|",
    ]
    for key, s in record.results["flatness"]["series"].items():
        out.append(
            f"| {key} | {s['first_quarter_median']:,.1f} | {s['last_quarter_median']:,.1f} "
            f"| {s['ratio']} | {s['tolerance']} + {s['slack']:g} | {'yes' if s['flat'] else 'NO'} |"
        )
    return out
