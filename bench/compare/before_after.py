"""The worker benchmark, before and after a change, interleaved.

    python -m bench.compare.before_after --before DIR [--rounds 4] [--only async1,async2]
                                         [--jobs 50000] [--name NAME]

DIR is a checkout of the "before" commit with its own virtualenv
(``DIR/.venv``; ``git worktree add DIR REV && make -C DIR setup``). Each
round runs ``bench.perf.worker_throughput --only S --repeats 1
--skip-latency`` once per scenario S on each side, before then after, each
side with its own code and its own copy of the script (so each drains with
its own worker and measures its own pgbench reference in the same run).
Interleaving puts the machine's drift on both sides alike; the figures to
read are the medians of the paired ratios, after over before, of the rate
and of the ratio to the same run's pure-SQL reference.

With PGOPTIONS set (libpq passes it to the server for every connection,
both sides' and pgbench's), both sides run with those server settings:
``PGOPTIONS="-c commit_delay=2000 -c commit_siblings=0"`` makes every
commit wait about 2 ms, as on a slow disk; the record keeps it.

Writes results/<NAME>.json (default: before_after).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.record import ResultRecord, command_line, write_result

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = {"async1": "async_1_process", "async2": "async_2_processes", "sync1": "sync_1_process"}


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(folder), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def sides(before: Path) -> dict[str, tuple[Path, str]]:
    """Each side's folder and python: DIR with its own virtualenv, and this
    checkout with the running one."""
    return {
        "before": (before.resolve(), str(before.resolve() / ".venv/bin/python")),
        "after": (ROOT, sys.executable),
    }


def commits(before: Path) -> dict[str, str]:
    """The commit of each side, for the record's parameters."""
    return {
        "before_commit": _git(before, "rev-parse", "--short", "HEAD"),
        "after_commit": _git(ROOT, "rev-parse", "--short", "HEAD"),
    }


def side_env(folder: Path) -> dict[str, str]:
    """The environment of a side's run: its own pgqueue (src/) and bench
    helpers first on the path, whatever its virtualenv's editable install
    points at (a "before" checkout whose .venv links to this one's would
    otherwise run this checkout's pgqueue on both sides)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder / "src"), str(folder)])}


def one_run(folder: Path, python: str, scenario: str, jobs: int) -> dict[str, Any]:
    """One drain by one side: its rate and its reference's."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        command = [python, "-m", "bench.perf.worker_throughput", "--only", scenario]
        command += ["--jobs", str(jobs), "--repeats", "1", "--skip-latency", "--out", str(out)]
        subprocess.run(
            command, cwd=folder, env=side_env(folder), check=True, capture_output=True, text=True
        )
        written = json.loads(out.read_text())
    rates = written["results"]["rates_jobs_per_second"]
    rate = rates[SCENARIOS[scenario]]["median"]
    reference = rates["reference_pgbench"]["median"]
    return {
        "jobs_per_second": rate,
        "reference": reference,
        "ratio": rate / reference,
        # (None from a checkout whose benchmark did not measure it yet)
        "commit_latency_ms": written["results"].get("commit_latency_ms", {}).get("at_start"),
        "server": written["server"],
    }


def summarise(runs: list[dict[str, Any]], scenario: str) -> dict[str, Any]:
    mine = [r for r in runs if r["scenario"] == scenario]
    before = [r for r in mine if r["side"] == "before"]
    after = [r for r in mine if r["side"] == "after"]
    pairs = list(zip(before, after, strict=True))
    return {
        "before_median_jobs_per_second": statistics.median(r["jobs_per_second"] for r in before),
        "after_median_jobs_per_second": statistics.median(r["jobs_per_second"] for r in after),
        # Each run's rate over its own pgbench reference (the goals are stated so).
        "before_median_ratio_to_reference": statistics.median(r["ratio"] for r in before),
        "after_median_ratio_to_reference": statistics.median(r["ratio"] for r in after),
        "paired_rate_ratios": [a["jobs_per_second"] / b["jobs_per_second"] for b, a in pairs],
        "median_paired_rate_ratio": statistics.median(
            a["jobs_per_second"] / b["jobs_per_second"] for b, a in pairs
        ),
        "median_paired_reference_ratio": statistics.median(
            a["ratio"] / b["ratio"] for b, a in pairs
        ),
    }


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, type=Path)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--only", default="async1,async2")
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--name", default="before_after")
    parser.add_argument("--out", default=None, help="default: results/NAME.json")
    args = parser.parse_args(argv)
    scenarios = args.only.split(",")
    if unknown := set(scenarios) - set(SCENARIOS):
        parser.error(f"--only: unknown {', '.join(sorted(unknown))}")
    folders = sides(args.before)
    runs: list[dict[str, Any]] = []
    server: dict[str, Any] = {}
    for round_ in range(1, args.rounds + 1):
        for scenario in scenarios:
            for side, (folder, python) in folders.items():
                run = one_run(folder, python, scenario, args.jobs)
                server = run.pop("server")
                runs.append({"round": round_, "scenario": scenario, "side": side, **run})
                print(f"round {round_} {scenario} {side}: {run['jobs_per_second']:,.0f} jobs/s "
                      f"(reference {run['reference']:,.0f}, ratio {run['ratio']:.2f})",
                      flush=True)  # fmt: skip
    summary = {scenario: summarise(runs, scenario) for scenario in scenarios}
    results = {"summary": summary, "runs": runs}
    record = ResultRecord(
        name=args.name,
        command=command_line(__spec__, argv),
        server=server,
        parameters={
            **commits(args.before),
            "rounds": args.rounds,
            "jobs": args.jobs,
            "scenarios": scenarios,
            "interleaved": True,
            # Server settings given to every connection of both sides and of
            # pgbench, e.g. "-c commit_delay=2000 -c commit_siblings=0" for
            # commits as slow as a cloud disk's (libpq reads PGOPTIONS).
            "pgoptions": os.environ.get("PGOPTIONS"),
        },
        results=results,
    )
    path = write_result(record, args.out)
    for scenario, paired in summary.items():
        print(f"{scenario}: after/before rate x{paired['median_paired_rate_ratio']:.2f}, "
              f"ratio to reference x{paired['median_paired_reference_ratio']:.2f} "
              f"({paired['before_median_ratio_to_reference']:.2f} -> "
              f"{paired['after_median_ratio_to_reference']:.2f})")  # fmt: skip
    print(f"written to {path}")
    return record


if __name__ == "__main__":
    main()
