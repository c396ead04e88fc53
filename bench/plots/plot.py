"""PNG charts of the committed benchmark results.

    python -m bench.plots.plot [--results results/] [--out-dir results/] [--markdown]

Reads benchmark.json, latency.json, enqueue.json, history.json,
compare.json, latency_load.json and soak.json (whichever exist;
bench.record.read_result reads the files written before the record too) and
writes a PNG of each (the last two drawn by bench.plots.load). Bars and points are medians;
whiskers span min to max of the repeats. --markdown prints the same tables
as Markdown instead (docs/results.md's tables are copied from that output).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.plots.common import finish, plt
from bench.plots.load import latency_load_table, plot_latency_load, plot_soak, soak_table
from bench.record import RESULTS, ResultRecord, read_result

MODE_LABELS = {"skip_locked": "FOR UPDATE SKIP LOCKED", "for_update": "plain FOR UPDATE"}
COLORS = {
    "skip_locked": "tab:blue",
    "for_update": "tab:red",
    "notify": "tab:blue",
    "poll": "tab:orange",
}


def _load(folder: Path, name: str) -> ResultRecord | None:
    path = folder / f"{name}.json"
    if not path.exists():
        print(f"no {path}: skipping {name}.png")
        return None
    return read_result(path)


def _errs(stats: list[dict[str, float]]) -> list[list[float]]:
    return [
        [s["median"] - s["min"] for s in stats],
        [s["max"] - s["median"] for s in stats],
    ]


def plot_benchmark(record: ResultRecord, out: Path) -> Path:
    table = record.results["results_jobs_per_second"]
    models = list(table)
    titles = {
        "single": "one job per claim (claim 1, ack 1)",
        "batched": "batched claims and acks",
    }
    fig, axes = plt.subplots(1, len(models) + 1, figsize=(5.4 * (len(models) + 1), 4.6))
    for ax, model in zip(axes, models, strict=False):
        workers = [int(w) for w in table[model]]
        for mode in ("skip_locked", "for_update"):
            stats = [table[model][str(w)][mode] for w in workers]
            ax.errorbar(
                workers,
                [s["median"] for s in stats],
                yerr=_errs(stats),
                marker="o",
                capsize=3,
                color=COLORS[mode],
                label=MODE_LABELS[mode],
            )
        ax.set_ylabel("jobs/s (first claim to last ack)")
        ax.set_title(titles.get(model, model), fontsize=11)
        ax.legend(fontsize=8)
    ratio_ax = axes[-1]
    for model, color in zip(models, ("tab:green", "tab:purple"), strict=False):
        workers = [int(w) for w in table[model]]
        stats = [table[model][str(w)]["ratio_skip_locked_to_for_update"] for w in workers]
        ratio_ax.errorbar(
            workers,
            [s["median"] for s in stats],
            yerr=_errs(stats),
            marker="o",
            capsize=3,
            color=color,
            label=titles.get(model, model),
        )
    ratio_ax.axhline(1.0, color="0.5", linestyle="--", linewidth=1)
    ratio_ax.set_ylabel("SKIP LOCKED / FOR UPDATE, same round")
    ratio_ax.set_title("ratio within each round", fontsize=11)
    ratio_ax.legend(fontsize=8)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(workers, [str(w) for w in workers])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("worker processes")
        ax.grid(alpha=0.3)
    s = record.parameters
    fig.suptitle(
        f"Drain {s['jobs']:,} pre-loaded no-op jobs: SKIP LOCKED vs plain FOR UPDATE "
        f"(median of {s['repeats']}, whiskers min-max)"
    )
    return finish(fig, record, out / "benchmark.png")


def plot_latency(record: ResultRecord, out: Path) -> Path:
    table = record.results["results_ms"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4), sharey=False)
    for ax, pct in zip(axes, ("p50_ms", "p95_ms", "p99_ms"), strict=True):
        for mode, label in (
            ("notify", "LISTEN/NOTIFY (poll 1 s fallback)"),
            ("poll", f"poll only ({record.parameters['poll_mode'].split('interval ')[-1]})"),
        ):
            workers = [int(w) for w in table[mode]]
            ax.plot(
                workers,
                [table[mode][str(w)][pct] for w in workers],
                marker="o",
                color=COLORS[mode],
                label=label,
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(workers, [str(w) for w in workers])
        ax.set_ylim(bottom=0)
        ax.set_title(pct.replace("_ms", ""), fontsize=11)
        ax.set_xlabel("worker processes")
        ax.set_ylabel("enqueue-to-start latency (ms)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    s = record.parameters
    fig.suptitle(
        f"Enqueue-to-start latency: {s['jobs']:,} jobs at {s['rate_per_second']:g}/s "
        "from one producer (database clock)"
    )
    return finish(fig, record, out / "latency.png")


def _hbars(ax: Any, labels: list[str], stats: list[dict[str, float]], color: Any) -> None:
    y = list(range(len(labels)))
    ax.barh(y, [s["median"] for s in stats], xerr=_errs(stats), capsize=3, color=color)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    for yi, s in zip(y, stats, strict=True):
        ax.text(s["max"] * 1.05, yi, f"{s['median']:,.0f}", va="center", fontsize=8)
    ax.grid(axis="x", alpha=0.3)


def plot_enqueue(record: ResultRecord, out: Path) -> Path:
    table = record.results["results_jobs_per_second"]
    labels = list(table)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    _hbars(ax, labels, [table[k] for k in labels], "tab:green")
    ax.set_xscale("log")
    ax.set_xlabel("jobs/s (log scale)")
    ax.set_title(f"Enqueue throughput, median of {record.parameters['repeats']}")
    return finish(fig, record, out / "enqueue.png", bottom=0.05)


def plot_compare(record: ResultRecord, out: Path) -> Path:
    table = record.results["systems"]
    labels = list(table)
    stats = [table[k]["drain_jobs_per_second"] for k in labels]
    colors = ["tab:blue" if table[k]["system"] == "pgqueue" else "tab:gray" for k in labels]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(labels) + 2))
    _hbars(ax, [f"{k} ({table[k]['version']})" for k in labels], stats, colors)
    ax.set_xlim(right=max(s["max"] for s in stats) * 1.2)
    ax.set_xlabel("jobs/s, first start to last completion (each system's own timestamps)")
    s = record.parameters
    ax.set_title(
        f"Drain {s['jobs']:,} pre-loaded no-op jobs with 1 worker process, median of {s['repeats']}"
    )
    return finish(fig, record, out / "compare.png", bottom=0.05)


def plot_history(record: ResultRecord, out: Path) -> Path:
    rows = record.results["sizes"]
    labels = [f"{r['finished_jobs']:,}" for r in rows]
    x = list(range(len(rows)))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4))
    for ax, key, title in (
        (axes[0], "claim_ack_batch_100", "claim+ack, batches of 100"),
        (axes[1], "worker_1_process", "AsyncWorker, 1 process"),
    ):
        width = 0.38
        for offset, suffix, color, name in (
            (-width / 2, "", "tab:purple", "with history"),
            (width / 2, "_control", "0.7", "empty control database, same moments"),
        ):
            if key + suffix not in rows[0]:
                continue
            stats = [r[key + suffix] for r in rows]
            ax.bar(
                [i + offset for i in x],
                [s["median"] for s in stats],
                width,
                yerr=_errs(stats),
                capsize=3,
                color=color,
                label=name,
            )
        ratio = rows[-1].get(key + "_vs_control", {}).get("median")
        extra = f", vs control at the largest: {ratio:.2f}" if ratio else ""
        ax.set_title(f"{title}{extra}", fontsize=10)
        ax.set_ylabel("jobs/s")
        ax.legend(fontsize=7, loc="lower left")
    stats = [r["metrics_scrape_ms"] for r in rows]
    axes[2].bar(x, [s["median"] for s in stats], yerr=_errs(stats), capsize=4, color="tab:purple")
    ratio = stats[-1]["median"] / stats[0]["median"]
    axes[2].set_title(f"GET /metrics (largest / none: {ratio:.2f})", fontsize=10)
    axes[2].set_ylabel("ms per scrape")
    for ax in axes:
        ax.set_xticks(x, labels)
        ax.set_xlabel("finished jobs in the table")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Does history slow pgqueue down? (median, min-max)")
    return finish(fig, record, out / "history.png")


PLOTS = {
    "benchmark": plot_benchmark,
    "latency": plot_latency,
    "enqueue": plot_enqueue,
    "compare": plot_compare,
    "history": plot_history,
    "latency_load": plot_latency_load,
    "soak": plot_soak,
}


def _cell(s: dict[str, float], fmt: str = ",.0f") -> str:
    return f"{format(s['median'], fmt)} ({format(s['min'], fmt)}-{format(s['max'], fmt)})"


def _benchmark_tables(b: ResultRecord) -> list[str]:
    out: list[str] = []
    for model, table in b.results["results_jobs_per_second"].items():
        out += [
            f"\nbenchmark.json, model {model} (jobs/s, median (min-max) of "
            f"{b.parameters['repeats']}; ratio per round):\n",
            "| worker processes | FOR UPDATE SKIP LOCKED | plain FOR UPDATE | ratio |",
            "|---:|---:|---:|---:|",
        ]
        for w, cell in table.items():
            r = cell["ratio_skip_locked_to_for_update"]
            out.append(
                f"| {w} | {_cell(cell['skip_locked'])} | {_cell(cell['for_update'])} "
                f"| {_cell(r, '.2f')} |"
            )
    return out


def _latency_table(la: ResultRecord) -> list[str]:
    out = [
        "\nlatency.json (ms):\n",
        "| worker processes | NOTIFY p50 | p95 | p99 | poll only p50 | p95 | p99 |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    t = la.results["results_ms"]
    for w in t["notify"]:
        n, p = t["notify"][w], t["poll"][w]
        out.append(
            f"| {w} | {n['p50_ms']:.1f} | {n['p95_ms']:.1f} | {n['p99_ms']:.1f} "
            f"| {p['p50_ms']:.1f} | {p['p95_ms']:.1f} | {p['p99_ms']:.1f} |"
        )
    return out


def _enqueue_table(e: ResultRecord) -> list[str]:
    out = ["\nenqueue.json (jobs/s):\n", "| row | jobs/s |", "|---|---:|"]
    for name, s in e.results["results_jobs_per_second"].items():
        out.append(f"| {name} | {_cell(s)} |")
    return out


def _history_table(h: ResultRecord) -> list[str]:
    out = [
        "\nhistory.json (x = ratio to the empty control database, measured alongside):\n",
        "| finished jobs | table MB | claim+ack batch 100 (jobs/s) | x "
        "| AsyncWorker 1 process (jobs/s) | x | GET /metrics (ms) | GET /healthz (ms) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in h.results["sizes"]:
        cells = []
        for key in ("claim_ack_batch_100", "worker_1_process"):
            vs = r.get(f"{key}_vs_control")
            cells += [_cell(r[key]), _cell(vs, ".2f") if vs else ""]
        control = r.get("healthz_control_ms")
        out.append(
            f"| {r['finished_jobs']:,} | {r['table_mb']} | {' | '.join(cells)} "
            f"| {_cell(r['metrics_scrape_ms'], '.2f')} "
            f"| {_cell(control, '.2f') if control else ''} |"
        )
    ratios = ", ".join(f"{k} {v:.2f}" for k, v in h.results["ratio_largest_to_empty"].items())
    out.append(f"\nlargest / none: {ratios}")
    return out


def _compare_table(c: ResultRecord) -> list[str]:
    out = [
        "\ncompare.json:\n",
        "| system | version | drain jobs/s | ratio to pgqueue | bulk enqueue jobs/s |",
        "|---|---|---:|---:|---:|",
    ]
    for label, r in c.results["systems"].items():
        out.append(
            f"| {label} | {r['version']} | {_cell(r['drain_jobs_per_second'])} "
            f"| {_cell(r['ratio_to_pgqueue'], '.3f')} "
            f"| {_cell(r['bulk_enqueue_jobs_per_second'])} |"
        )
    for label, why in c.results.get("skipped", {}).items():
        out.append(f"\n{label} skipped: {why.splitlines()[0] if why else ''}")
    return out


TABLES = {
    "benchmark": _benchmark_tables,
    "latency": _latency_table,
    "enqueue": _enqueue_table,
    "history": _history_table,
    "compare": _compare_table,
    "latency_load": latency_load_table,
    "soak": soak_table,
}


def markdown(folder: Path) -> str:
    """The result tables as Markdown, from the JSON files only."""
    out: list[str] = []
    for name, tables in TABLES.items():
        record = _load(folder, name)
        if record is not None:
            out += tables(record)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--out-dir", default=None, help="default: the --results folder")
    parser.add_argument("--markdown", action="store_true", help="print tables, draw nothing")
    args = parser.parse_args(argv)
    folder = Path(args.results)
    if args.markdown:
        print(markdown(folder))
        return []
    out = Path(args.out_dir) if args.out_dir else folder
    written = []
    for name, plot in PLOTS.items():
        record = _load(folder, name)
        if record is not None:
            written.append(plot(record, out))
    return written


if __name__ == "__main__":
    main()
