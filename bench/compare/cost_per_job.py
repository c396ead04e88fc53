"""The work a plain job costs, before and after a change, interleaved.

    python -m bench.compare.cost_per_job --before DIR [--rounds 5] [--jobs 20000]
                                         [--name cost_per_job]

A drain's rate on a shared machine moves with the neighbours' load (the same
query ran 40% slower from one minute to the next while this was written).
The work done per job moves much less, and part of it not at all. Each run
drains JOBS plain no-op jobs with one default AsyncWorker process on a fresh
server with pg_stat_statements, and records per job:

* per statement of the worker (pg_stat_statements): buffers hit and dirtied,
  WAL records and bytes — the same for the same statements on the same
  schema whatever the load — and execution time;
* WAL bytes in all (pg_current_wal_lsn before and after);
* CPU seconds (user + system) of the worker process (/proc/PID/stat);
* and, for reference only, the drain rate (database clock).

DIR is a checkout of the "before" commit with its own virtualenv (as for
bench.compare.before_after). Each run is this file run by that side's python
in that side's folder, so it drains with that side's pgqueue, migrations and
bench helpers; the rounds alternate which side goes first. The figures to
read are the medians of the paired ratios, after over before.

Writes results/<NAME>.json (default: cost_per_job).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench.common import STATEMENT_HEADS
from bench.record import ResultRecord, command_line, write_result

ROOT = Path(__file__).resolve().parents[2]
PER_JOB = ("shared_blks_hit", "shared_blks_dirtied", "wal_records", "wal_bytes", "total_exec_time")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _role(query: str) -> str | None:
    text = " ".join(query.split())
    return next((role for role, heads in STATEMENT_HEADS.items() if text.startswith(heads)), None)


def one(jobs: int) -> dict[str, Any]:
    """One drain, by the side whose folder this process runs in (its
    pgqueue and bench helpers are the ones imported)."""
    import psycopg

    from bench.common import bench_server, clear
    from bench.record import server_info
    from bench.workers import async_workers, wait_drained
    from pgqueue import Queue, Settings
    from pgqueue.db.migrate import migrate

    with bench_server("cost") as server:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = pg_stat_statements")
        server.restart()
        url = server.url
        migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        server_settings = server_info(url)
        clear(url)
        with Queue(url, settings=Settings(database_url=url)) as queue:
            queue.enqueue_many([{"task": "noop"}] * jobs)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
            lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        with async_workers(1, Settings(database_url=url), name="bench") as procs:
            wait_drained(url, jobs, procs)
            assert procs[0].pid is not None
            worker_cpu = _cpu_seconds(procs[0].pid)
        with psycopg.connect(url, autocommit=True) as conn:
            wal = conn.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (lsn,)).fetchone()
            span = conn.execute(
                "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8"
                " FROM pgqueue_jobs WHERE state = 'succeeded'"
            ).fetchone()
            rows = conn.execute(
                f"SELECT query, calls, {', '.join(PER_JOB)} FROM pg_stat_statements WHERE toplevel"
            ).fetchall()
    statements: dict[str, dict[str, float]] = {}
    for query, calls, *values in rows:
        role = _role(query)
        if role is not None:
            mine = statements.setdefault(role, dict.fromkeys(["calls", *PER_JOB], 0.0))
            mine["calls"] += calls
            for name, value in zip(PER_JOB, values, strict=True):
                mine[name] += float(value)
    assert wal is not None and span is not None
    return {
        "server": server_settings,
        "jobs_per_second": jobs / span[0],
        "wal_bytes_per_job": float(wal[0]) / jobs,
        "worker_cpu_us_per_job": worker_cpu / jobs * 1e6,
        "statements_per_job": {
            role: {name: value / jobs for name, value in figures.items()}
            for role, figures in statements.items()
        },
    }


def side_run(folder: Path, python: str, jobs: int) -> dict[str, Any]:
    from bench.compare.before_after import side_env

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        command = [python, __file__, "--one", "--jobs", str(jobs), "--out", str(out)]
        subprocess.run(
            command, cwd=folder, env=side_env(folder), check=True, capture_output=True, text=True
        )
        return json.loads(out.read_text())  # type: ignore[no-any-return]


def _flat(run: dict[str, Any]) -> dict[str, float]:
    """A run's figures as name → value (statement figures as role.name)."""
    flat = {k: v for k, v in run.items() if isinstance(v, float)}
    for role, figures in run["statements_per_job"].items():
        flat |= {f"{role}.{name}": value for name, value in figures.items()}
    return flat


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per figure: the median of each side, and the median of the paired
    ratios after / before."""
    before = [_flat(r) for r in runs if r["side"] == "before"]
    after = [_flat(r) for r in runs if r["side"] == "after"]
    out = {}
    for name in before[0].keys() & after[0].keys():
        pairs = [(b[name], a[name]) for b, a in zip(before, after, strict=True)]
        out[name] = {
            "before": statistics.median(b for b, _ in pairs),
            "after": statistics.median(a for _, a in pairs),
            "median_paired_ratio": statistics.median(a / b for b, a in pairs if b),
        }
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--name", default="cost_per_job")
    parser.add_argument("--out", default=None, help="default: results/NAME.json")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        Path(args.out).write_text(json.dumps(one(args.jobs)))
        return
    if args.before is None:
        parser.error("--before DIR is required")
    # Here, not at the top: a side's run imports this file in that side's
    # folder, whose bench/ may have no before_after.
    from bench.compare.before_after import commits, sides

    folders = sides(args.before)
    runs: list[dict[str, Any]] = []
    server: dict[str, Any] = {}
    for round_ in range(1, args.rounds + 1):
        order = list(folders) if round_ % 2 else list(reversed(folders))
        for side in order:
            folder, python = folders[side]
            run = side_run(folder, python, args.jobs)
            server = run.pop("server")
            runs.append({"round": round_, "side": side, **run})
            print(f"round {round_} {side}: {run['jobs_per_second']:,.0f} jobs/s, "
                  f"worker {run['worker_cpu_us_per_job']:.0f} us/job, "
                  f"WAL {run['wal_bytes_per_job']:.0f} B/job", flush=True)  # fmt: skip
    summary = summarise(runs)
    record = ResultRecord(
        name=args.name,
        command=command_line(__spec__, argv),
        server=server,
        parameters={
            **commits(args.before),
            "rounds": args.rounds,
            "jobs": args.jobs,
            "worker": "one AsyncWorker process, default settings, no-op handler",
            "interleaved": True,
        },
        results={"summary": summary, "runs": runs},
    )
    path = write_result(record, args.out)
    for name, figures in summary.items():
        print(f"{name:32} before {figures['before']:12.4f}  after {figures['after']:12.4f}"
              f"  x{figures['median_paired_ratio']:.3f}")  # fmt: skip
    print(f"written to {path}")


if __name__ == "__main__":
    main()
