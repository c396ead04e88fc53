"""Worker throughput measured the way an outside harness measures it: load,
ANALYZE, spawn, clock. pgqueue and PgQueuer in the same run.

    python -m bench.perf.outside_harness [--jobs 20000] [--repeats 5]
        [--before DIR] [--venv-dir DIR] [--no-pgqueuer] [--uncompiled]
        [--slow-commits] [--page-cost N] [--serializable] [--out PATH]
    (or python -m bench.perf.worker_throughput --outside-harness ...)

Each measurement: empty the queue, enqueue JOBS no-op jobs in one call (the
system's own bulk enqueue), run ``VACUUM ANALYZE`` on the queue table (what
autovacuum does after any large enqueue: the planner then sees a table full
of queued jobs), CHECKPOINT, then spawn the worker processes and clock, on
the wall, from the spawn until the queue table has no job left to run. The
clock includes the processes' start (imports, connections), as an outside
harness's does; bench.perf.worker_throughput's own drains start their
clock at the first claim of workers that were already waiting.

Each round first measures the server's commit latency (one-row INSERT
commits, one after another: the file's commit_latency_ms). With
--slow-commits the server delays every commit by 2 ms (commit_delay), as a
slow disk would: where the worker's second claim and ack connections pay.
With --page-cost 4 the server plans at PostgreSQL's default
random_page_cost, as a server of the user's own does (the embedded
server's is 1.1). With --serializable the server's
default_transaction_isolation is serializable, as a database may set it for
its applications: every session that does not set its own runs at it.

Scenarios (rounds interleave them, so that the shared machine's drift hits
all alike; each ratio is taken within a round, then the median):
  * pgqueue: 1 and 2 processes at concurrency 100 (the default), 2 at 1,000,
    each process an application's own worker (bench.perf.worker_child); and
    ``pgqueue worker --processes 2`` (the command line: its supervisor and
    two children);
  * with --before DIR (a checkout of an earlier commit): the same four
    with that checkout's pgqueue in the worker processes (its ``src``), on
    the same server and schema;
  * with --uncompiled: 2 processes at concurrency 100 importing pgqueue from
    a copy of src without bytecode. The other scenarios' pgqueue is
    byte-compiled before the spawn, as a pip install compiles it (and as pip
    compiled PgQueuer); where PYTHONDONTWRITEBYTECODE is set (this machine)
    nothing else would, and each process would compile every module it
    imports at each start;
  * PgQueuer 1.6 (its own virtualenv, as bench.compare.compare makes it):
    1 and 2 processes, each one QueueManager with batch_size 100, the
    fastest of its shapes in results/compare.json, asyncpg and uvloop,
    run(mode=drain).

Writes results/outside_harness.json.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    LIVE_JOBS,
    add_page_cost_option,
    bench_database,
    clear,
    page_cost_options,
    summary,
)
from bench.compare.compare import database_url, ensure_venv, run_helper
from bench.perf.worker_throughput import (
    commit_latency,
    compile_workers,
    spawn_workers,
    stop_workers,
)
from bench.record import ResultRecord, command_line, server_info, write_result
from pgqueue import Queue, Settings

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PGQUEUER_SCRIPT = ROOT / "bench" / "compare" / "_pgqueuer.py"
PGQUEUER_BATCH = 100
POLL_SECONDS = 0.01
DRAIN_TIMEOUT = 600.0


def _wait_until_empty(conn: psycopg.Connection[Any], empty: str) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while not conn.execute(empty).fetchone()[0]:  # type: ignore[index]
        if time.monotonic() > deadline:
            raise RuntimeError("the queue was not drained in time")
        time.sleep(POLL_SECONDS)


def pgqueue_drain(
    url: str,
    jobs: int,
    processes: int,
    concurrency: int,
    src: Path | None = None,
    byte_compiled: bool = True,
    command_line: bool = False,
    keep: bool = False,
) -> float:
    """Jobs per second, from the spawn of the worker processes to an empty
    queue. ``byte_compiled``: False runs ``src`` as it is (see --uncompiled);
    ``command_line``: one ``pgqueue worker --processes PROCESSES``;
    ``keep``: the jobs of earlier drains stay (no TRUNCATE), as in a queue
    that has run for a while (bench.perf.long_transaction)."""
    if not keep:
        clear(url, checkpoint=False)
    with Queue(url, settings=Settings(database_url=url)) as queue:
        queue.enqueue_many([{"task": "noop"}] * jobs)
    with psycopg.connect(url, autocommit=True) as conn:
        # The watcher's polls are not the system's: at the server's default
        # isolation (--serializable) they could fail as a serializable read.
        conn.execute("SET default_transaction_isolation = 'read committed'")
        conn.execute("VACUUM ANALYZE pgqueue_jobs")
        conn.execute("CHECKPOINT")
        if byte_compiled:
            compile_workers(src)  # before the clock: an install compiles once
        started = time.monotonic()
        procs = spawn_workers(
            url,
            processes,
            "noop",
            concurrency,
            src=src,
            byte_compiled=False,  # compiled above, or (--uncompiled) not at all
            command_line=command_line,
        )
        try:
            _wait_until_empty(conn, f"SELECT NOT ({LIVE_JOBS})")
            seconds = time.monotonic() - started
        finally:
            codes = stop_workers(procs)
    # A process still starting when the others had emptied the queue dies
    # of the SIGTERM before its handler is in place.
    if any(code not in (0, -signal.SIGTERM) for code in codes):
        raise RuntimeError(f"workers exited with {codes}")
    return jobs / seconds


def pgqueuer_drain(python: Path, url: str, jobs: int, processes: int, keep: bool = False) -> float:
    """The same for PgQueuer: its bulk enqueue, VACUUM ANALYZE, then
    ``processes`` processes of one QueueManager each, until its queue table
    is empty (PgQueuer deletes a job as it completes). ``keep``: no TRUNCATE
    of its tables first."""
    with psycopg.connect(url, autocommit=True) as conn:
        installed = conn.execute("SELECT to_regclass('pgqueuer') IS NOT NULL").fetchone()
        install = [] if installed and installed[0] else ["--install"]
        load = [*install, "--phase", "load", *(["--keep"] if keep else [])]
        run_helper(python, "_pgqueuer.py", [url, str(jobs), "1", "1", *load])
        conn.execute("CHECKPOINT")
        started = time.monotonic()
        procs = [
            subprocess.Popen(
                [
                    str(python),
                    str(PGQUEUER_SCRIPT),
                    url,
                    str(jobs),
                    "1",
                    str(PGQUEUER_BATCH),
                    "--phase",
                    "consume",
                ],
                cwd="/",
                stdout=subprocess.DEVNULL,
            )
            for _ in range(processes)
        ]
        try:
            _wait_until_empty(conn, "SELECT NOT EXISTS (SELECT 1 FROM pgqueuer)")
            seconds = time.monotonic() - started
        finally:
            codes = [proc.wait(timeout=60) for proc in procs]
    if any(codes):
        raise RuntimeError(f"PgQueuer processes exited with {codes}")
    return jobs / seconds


@functools.cache
def uncompiled_copy() -> Path:
    """A copy of this checkout's src without bytecode, for --uncompiled: how
    the workers start where PYTHONDONTWRITEBYTECODE is set and nothing
    compiled pgqueue ahead (each process compiles every module it imports)."""
    copy = Path(tempfile.mkdtemp(prefix="pgqueue-uncompiled-")) / "src"
    shutil.copytree(ROOT / "src", copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _ratios(runs: dict[str, list[float]], pairs: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """The median over rounds of each pair's ratio (None unless both ran)."""
    out: dict[str, Any] = {}
    for name, (top, bottom) in pairs.items():
        if runs.get(top) and runs.get(bottom):
            each = [a / b for a, b in zip(runs[top], runs[bottom], strict=True)]
            out[name] = {"median": statistics.median(each), "rounds": each}
    return out


RATIOS = {
    "pgqueue_2_over_pgqueuer_2": ("pgqueue_2_processes", "pgqueuer_2_processes"),
    "pgqueue_1_over_pgqueuer_1": ("pgqueue_1_process", "pgqueuer_1_process"),
    "concurrency_1000_over_100": ("pgqueue_2_processes_c1000", "pgqueue_2_processes"),
    "after_over_before_1": ("pgqueue_1_process", "before_1_process"),
    "after_over_before_2": ("pgqueue_2_processes", "before_2_processes"),
    "after_over_before_2_c1000": ("pgqueue_2_processes_c1000", "before_2_processes_c1000"),
    "compiled_over_uncompiled_2": ("pgqueue_2_processes", "uncompiled_2_processes"),
    "cli_2_over_pgqueuer_2": ("pgqueue_cli_2_processes", "pgqueuer_2_processes"),
    "after_over_before_cli_2": ("pgqueue_cli_2_processes", "before_cli_2_processes"),
}
# Each commit waits 2 ms before its flush (commit_siblings 0: whatever the
# other sessions do), as on a disk whose flush takes that long.
SLOW_COMMITS = {"commit_delay": "2000", "commit_siblings": "0"}
GOALS = {"pgqueue_2_over_pgqueuer_2": 1.5, "pgqueue_1_over_pgqueuer_1": 1.2}


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", type=Path, default=None, help="an earlier checkout")
    parser.add_argument("--venv-dir", type=Path, default=ROOT / ".bench-venvs")
    parser.add_argument("--no-pgqueuer", action="store_true", help="pgqueue alone (smoke test)")
    parser.add_argument(
        "--uncompiled",
        action="store_true",
        help="also 2 processes of pgqueue imported from a copy of src without bytecode",
    )
    parser.add_argument(
        "--slow-commits",
        action="store_true",
        help="a server whose every commit waits 2 ms more (commit_delay), as on a slow disk",
    )
    add_page_cost_option(parser)
    parser.add_argument(
        "--serializable",
        action="store_true",
        help="a server whose default_transaction_isolation is serializable",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    scenarios: dict[str, Any] = {}
    sides = [("pgqueue", None)] + ([("before", args.before / "src")] if args.before else [])
    for label, src in sides:
        for name, processes, concurrency, cli in (
            ("1_process", 1, 100, False),
            ("2_processes", 2, 100, False),
            ("2_processes_c1000", 2, 1000, False),
            ("cli_2_processes", 2, 100, True),
        ):
            scenarios[f"{label}_{name}"] = lambda url, p=processes, c=concurrency, s=src, k=cli: (
                pgqueue_drain(url, args.jobs, p, c, src=s, command_line=k)
            )
    if args.uncompiled:
        scenarios["uncompiled_2_processes"] = lambda url: pgqueue_drain(
            url, args.jobs, 2, 100, src=uncompiled_copy(), byte_compiled=False
        )
    pgqueuer_version = None
    if not args.no_pgqueuer:
        python, pgqueuer_version = ensure_venv(args.venv_dir, "pgqueuer")
        if python is None:
            raise SystemExit(pgqueuer_version)
        for processes in (1, 2):
            name = "pgqueuer_1_process" if processes == 1 else "pgqueuer_2_processes"
            scenarios[name] = lambda url, p=processes, py=python: pgqueuer_drain(
                py, database_url(url, "bench_pgqueuer"), args.jobs, p
            )

    runs: dict[str, list[float]] = {name: [] for name in scenarios}
    commits: list[dict[str, float]] = []
    options = (SLOW_COMMITS if args.slow_commits else {}) | page_cost_options(args.page_cost)
    if args.serializable:
        options["default_transaction_isolation"] = "serializable"
    with bench_database("outside_harness", options or None) as url:
        info = server_info(url)
        for repeat in range(args.repeats):
            commits.append(commit_latency(url))
            for name, drain in scenarios.items():
                runs[name].append(drain(url))
                print(f"round {repeat + 1} {name}: {runs[name][-1]:,.0f} jobs/s", flush=True)
    ratios = _ratios(runs, RATIOS)
    record = ResultRecord(
        name="outside_harness",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "jobs": args.jobs,
            "repeats": args.repeats,
            "before": str(args.before) if args.before else None,
            "pgqueuer": pgqueuer_version,
            "pgqueuer_batch_size": PGQUEUER_BATCH,
            "clock": "wall, from the spawn of the worker processes to an empty queue",
            "statistics": "VACUUM ANALYZE of the loaded queue table before the spawn",
            "server_options": options or None,
        },
        results={
            "rates_jobs_per_second": {k: summary(v) | {"runs": v} for k, v in runs.items()},
            "ratios": ratios,
            "goals": GOALS,
            "commit_latency_ms": {"by_round": commits},
        },
    )
    path = write_result(record, args.out)
    print()
    for name, values in runs.items():
        print(f"{name:>28}: {statistics.median(values):>9,.0f} jobs/s")
    for name, ratio in ratios.items():
        goal = f" (goal {GOALS[name]})" if name in GOALS else ""
        print(f"{name:>28}: {ratio['median']:.2f}{goal}")
    print(f"written to {path}")
    return record


if __name__ == "__main__":
    main()
