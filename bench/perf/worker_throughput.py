"""Worker throughput (and idle latency), against a pure-SQL reference measured in the same run.

    python -m bench.perf.worker_throughput [--jobs 20000] [--repeats 3] [--latency-jobs 1000]
    python -m bench.perf.worker_throughput --outside-harness [...]  (bench.perf.outside_harness)

On a fresh server on disk with fsync and synchronous_commit on:

* throughput: JOBS no-op jobs enqueued in one transaction while the workers
  wait (so they are all ready at once, as if pre-loaded), drained by 1 worker
  process, 2 worker processes, 1 process with a sync (thread-pool) no-op
  handler, and 1 process with the sync no-op handler isolated (in child
  processes: each run pickles the job and its result). Rate = jobs /
  (max(finished_at) - min(started_at)), database clock. Workers are separate
  processes, started before the jobs commit.
* reference: pgbench, 2 clients, each transaction claims 100 rows with
  pgqueue's own job_claim statement, then acks them with its own job_finish
  statement in a second transaction. Same rate formula. Also a bare variant
  (claim without the latency histogram, ack by a plain UPDATE), so that the
  cost of pgqueue's bookkeeping is visible too.
* commit latency: before each round, 200 one-row INSERT commits one after
  another (p50, p90), stated next to the rates: how slow this run's disk
  commits were, which decides how much a worker must pipeline.
* latency: an idle worker, one job enqueued every 10 ms (100 jobs/s);
  latency = started_at - run_at (database clock), p50/p95/p99.

Writes results/worker_throughput.json.
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    bench_database,
    clear,
    has_live_jobs,
    rate,
    start_latency_percentiles,
    summary,
)
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import wait_connected
from pgqueue import Queue, Settings
from pgqueue.db.embedded import EmbeddedPostgres
from pgqueue.sql import QUERIES

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = 2
BATCH = 100
# --only's names for the scenarios.
ONLY = {
    "async1": "async_1_process",
    "async2": "async_2_processes",
    "sync1": "sync_1_process",
    "isolated1": "isolated_1_process",
    "reference": "reference_pgbench",
}


# -- worker processes ------------------------------------------------------------


def byte_compile(*trees: Path) -> None:
    """Write the bytecode of the Python files under ``trees`` that lack it,
    as installing a package does (the competitors' virtualenvs were made by
    pip, which compiles at install). A checkout on PYTHONPATH is not
    compiled, and where PYTHONDONTWRITEBYTECODE is set (as on the CI
    machines) each spawned worker would compile pgqueue's hundred modules
    again at every start: about 0.1 s of CPU a process."""
    for tree in trees:
        compileall.compile_dir(tree, quiet=1)


def compile_workers(src: Path | None = None) -> None:
    """Compile what a spawned worker imports: this checkout's pgqueue (or
    the one in ``src``) and the benchmarks' handlers. A harness that clocks
    the start calls it before its clock, as an install compiles once."""
    byte_compile(src or ROOT / "src", ROOT / "bench")


def spawn_workers(
    url: str,
    processes: int,
    task: str,
    concurrency: int,
    prefetch: int | None = None,
    src: Path | None = None,
    byte_compiled: bool = True,
    command_line: bool = False,
) -> list[subprocess.Popen[bytes]]:
    """``processes`` worker processes of ``bench.perf.worker_child``, or, with
    ``command_line``, one ``pgqueue worker --processes PROCESSES`` (its
    supervisor and children; without ``prefetch``)."""
    # This checkout's pgqueue (or the one in ``src``: another checkout's) and
    # bench first, and the caller's path after (bench.compare.before_after
    # runs another checkout's copy of this file).
    path = [str(src or ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    if byte_compiled:
        compile_workers(src)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)))
    if command_line:
        options = ["--concurrency", str(concurrency), "--processes", str(processes)]
        worker = ["worker", "--handlers", "bench.handlers:HANDLERS", *options]
        argv = [sys.executable, "-m", "pgqueue", "--database-url", url, *worker]
        return [subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)]
    child = [sys.executable, "-m", "bench.perf.worker_child", url, task, str(concurrency)]
    extra = [] if prefetch is None else [str(prefetch)]
    return [subprocess.Popen([*child, *extra], cwd=ROOT, env=env) for _ in range(processes)]


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    return [proc.wait(timeout=60) for proc in procs]


def drain(
    url: str, jobs: int, processes: int, task: str, concurrency: int, prefetch: int | None
) -> float:
    clear(url)
    procs = spawn_workers(url, processes, task, concurrency, prefetch)
    try:
        wait_connected(url, processes)
        with Queue(url, settings=Settings(database_url=url)) as q:
            q.enqueue_many([{"task": task}] * jobs)
        with psycopg.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 300
            while has_live_jobs(conn) and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        codes = stop_workers(procs)
    if any(codes):
        raise RuntimeError(f"workers exited with {codes}")
    return rate(url, jobs)


# -- the pure-SQL reference ---------------------------------------------------------


def pgbench_script(bare: bool) -> str:
    """pgqueue's claim and finish statements as a pgbench script: the claim's
    ids and tokens come back as arrays (\\gset) and feed the finish."""
    if bare:
        claim = (
            # The queue named, as every claim of the worker names it: the
            # one index in claim order is per queue (migration 0016 dropped
            # the one across queues, and without the queue this read and
            # sorted every queued row: 0.65x the reference instead of 1.1x).
            "WITH picked AS (SELECT id FROM pgqueue_jobs WHERE queue = 'default' "
            "AND state = 'queued' AND run_at <= now() ORDER BY priority DESC, run_at, id "
            "LIMIT :limit "
            "FOR UPDATE SKIP LOCKED), claimed AS (UPDATE pgqueue_jobs j SET state = 'running', "
            "attempts = j.attempts + 1, lease_token = nextval('pgqueue_lease_token_seq'), "
            "lease_expires_at = now() + make_interval(secs => :lease_seconds), "
            "worker = :worker, started_at = now() FROM picked WHERE j.id = picked.id "
            "RETURNING j.*)"
        )
        finish = (
            "UPDATE pgqueue_jobs j SET state = 'succeeded', result = o.result, "
            "finished_at = now(), lease_expires_at = NULL "
            "FROM unnest(:ids::bigint[], :tokens::bigint[], :results::jsonb[]) "
            "AS o(id, token, result) WHERE j.id = o.id AND j.lease_token = o.token "
            "AND j.state = 'running'"
        )
    else:
        # The worker's own statements: the claim's CTEs, up to the line that
        # closes the last one, without its final SELECT.
        text = QUERIES["job_claim"]
        claim = text[: text.rindex("\n)") + 2]
        finish = QUERIES["job_finish"]
    claim += (
        "\nSELECT array_agg(id) AS ids, array_agg(lease_token) AS tokens, "
        "array_agg(true) AS succeeded, array_agg('null'::jsonb) AS results, "
        "array_agg(NULL::text) AS errors, array_agg(true) AS retryable FROM claimed"
    )

    def variables(sql: str) -> str:
        sql = re.sub(r"%\((\w+)\)s", r":\1", sql).replace("%%", "%")
        return " ".join(sql.split())

    return f"{variables(claim)}\n\\gset\n{variables(finish)};\n".replace(
        "FROM claimed\n\\gset", "FROM claimed \\gset"
    )


def reference(url: str, jobs: int, bare: bool) -> float:
    clear(url)
    with Queue(url, settings=Settings(database_url=url)) as q:
        q.enqueue_many([{"task": "noop"}] * jobs)
    pgbench_drain(url, jobs, bare)
    return rate(url, jobs)


def pgbench_drain(url: str, jobs: int, bare: bool) -> None:
    """Claim and ack ``jobs`` queued jobs with pgbench: CLIENTS clients,
    BATCH jobs a claim (``jobs`` a multiple of CLIENTS * BATCH)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(pgbench_script(bare))
        script = f.name
    bounds = "{" + ",".join(str(b) for b in Settings().latency_buckets) + "}"
    defines = {
        # The queue of every job, with all of the batch as its share (as the
        # worker claims it).
        "queues": "{default}",
        "shares": "{" + str(BATCH) + "}",
        "limit": BATCH,
        "lease_seconds": 30,
        "worker": "pgbench",
        "latency_bounds": bounds,
        "backoff_base": 1,
        "backoff_cap": 3600,
        "notify_finished": "true",
    }
    command = [
        str(EmbeddedPostgres.binary("pgbench")),
        "-n",
        "-M",
        "prepared",
        "-c",
        str(CLIENTS),
        "-j",
        str(CLIENTS),
        "-t",
        str(jobs // (CLIENTS * BATCH)),
        "-f",
        script,
    ]
    for name, value in defines.items():
        command += ["-D", f"{name}={value}"]
    command.append(url)
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    finally:
        os.unlink(script)
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed: {done.stderr}\n{done.stdout}")


# -- commit latency ------------------------------------------------------------------------


def commit_latency(url: str, commits: int = 200) -> dict[str, float]:
    """Milliseconds per commit of a one-row INSERT, one after another on one
    connection (p50, p90): the least a claim or an ack waits for. It sets
    how far the worker must pipeline to follow CPU rather than the disk."""
    times = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_commit_probe (at timestamptz)")
        for _ in range(commits):
            start = time.perf_counter()
            conn.execute("INSERT INTO bench_commit_probe VALUES (now())")
            times.append((time.perf_counter() - start) * 1000)
        conn.execute("DROP TABLE bench_commit_probe")
    return {"p50_ms": statistics.median(times), "p90_ms": statistics.quantiles(times, n=10)[8]}


# -- latency -----------------------------------------------------------------------------


def latency(url: str, jobs: int, per_second: float) -> dict[str, float]:
    clear(url)
    procs = spawn_workers(url, 1, "noop", 100)
    try:
        wait_connected(url, 1)
        with Queue(url, settings=Settings(database_url=url)) as q:
            interval = 1.0 / per_second
            start = time.monotonic()
            for i in range(jobs):
                q.enqueue("noop")
                pause = start + (i + 1) * interval - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            time.sleep(0.5)
    finally:
        stop_workers(procs)
    return {**start_latency_percentiles(url, jobs), "jobs": jobs, "per_second": per_second}


# -- main ------------------------------------------------------------------------------------


def paired_ratio(runs: dict[str, list[float]], top: str, bottom: str) -> float | None:
    """The median of one scenario's rate over another's, round by round
    (None unless both ran)."""
    if top not in runs or bottom not in runs:
        return None
    return statistics.median(a / b for a, b in zip(runs[top], runs[bottom], strict=True))


def main(argv: list[str] | None = None) -> ResultRecord | None:
    rest = sys.argv[1:] if argv is None else argv
    if "--outside-harness" in rest:
        # Load, ANALYZE, spawn, clock; with PgQueuer in the same run.
        from bench.perf import outside_harness

        return outside_harness.main([a for a in rest if a != "--outside-harness"])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--latency-jobs", type=int, default=1000)
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument(
        "--only",
        type=lambda text: text.split(","),
        default=None,
        help=f"comma-separated: {','.join(ONLY)} (with the reference always)",
    )
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--prefetch", type=int, default=None, help="the workers' prefetch (default: the setting's)"
    )
    args = parser.parse_args(argv)
    if args.jobs % (CLIENTS * BATCH):
        # The pgbench reference drains in whole transactions of BATCH rows per client.
        parser.error(f"--jobs must be a multiple of {CLIENTS * BATCH}")

    def worker(processes: int, task: str) -> Callable[[str], float]:
        return lambda url: drain(url, args.jobs, processes, task, args.concurrency, args.prefetch)

    scenarios: dict[str, Callable[[str], float]] = {
        "async_1_process": worker(1, "noop"),
        "async_2_processes": worker(2, "noop"),
        "sync_1_process": worker(1, "noop_sync"),
        "isolated_1_process": worker(1, "noop_sync_isolated"),
        "reference_pgbench": lambda url: reference(url, args.jobs, bare=False),
        "reference_pgbench_bare": lambda url: reference(url, args.jobs, bare=True),
    }
    if args.only:
        unknown = set(args.only) - set(ONLY)
        if unknown:
            parser.error(
                f"--only: unknown {', '.join(sorted(unknown))}; pick from {', '.join(ONLY)}"
            )
        keep = {ONLY[name] for name in args.only} | {"reference_pgbench"}
        scenarios = {k: v for k, v in scenarios.items() if k in keep}
    runs: dict[str, list[float]] = {name: [] for name in scenarios}
    ratios: dict[str, list[float]] = {name: [] for name in scenarios}
    commits: list[dict[str, float]] = []
    with bench_database("worker") as url:
        info = server_info(url)
        for repeat in range(args.repeats):
            commits.append(commit_latency(url))
            print(
                f"round {repeat + 1} commit latency: p50 {commits[-1]['p50_ms']:.2f} ms, "
                f"p90 {commits[-1]['p90_ms']:.2f} ms",
                flush=True,
            )
            # Interleaved, so that the disk's drift hits every scenario alike;
            # each ratio uses the reference of its own round.
            round_rates = {}
            for name, run in scenarios.items():
                round_rates[name] = run(url)
                runs[name].append(round_rates[name])
                print(f"round {repeat + 1} {name}: {round_rates[name]:,.0f} jobs/s", flush=True)
            for name in scenarios:
                ratios[name].append(round_rates[name] / round_rates["reference_pgbench"])
        lat = None if args.skip_latency else latency(url, args.latency_jobs, 100.0)
    sync_over_async = paired_ratio(runs, "sync_1_process", "async_1_process")
    isolated_over_sync = paired_ratio(runs, "isolated_1_process", "sync_1_process")
    results: dict[str, Any] = {
        "rates_jobs_per_second": {k: summary(v) | {"runs": v} for k, v in runs.items()},
        "ratio_to_reference": {k: summary(v) for k, v in ratios.items()},
        "targets": {"async_1_process": 0.5, "async_2_processes": 0.7, "sync_over_async": 0.5},
        "sync_over_async": sync_over_async,
        "isolated_over_sync": isolated_over_sync,
        # One-row INSERT commits, measured before each round (the first: at
        # the start of the run).
        "commit_latency_ms": {"at_start": commits[0], "by_round": commits},
    }
    if lat is not None:
        results["latency_idle_100_per_second"] = lat
    record = ResultRecord(
        name="worker_throughput" if not args.only else f"worker_throughput_{'_'.join(args.only)}",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "jobs": args.jobs,
            "repeats": args.repeats,
            "concurrency": args.concurrency,
            "prefetch": Settings().prefetch if args.prefetch is None else args.prefetch,
        },
        results=results,
    )
    path = write_result(record, args.out)
    print()
    print(
        f"{'commit latency at start':>26}: p50 {commits[0]['p50_ms']:.2f} ms, "
        f"p90 {commits[0]['p90_ms']:.2f} ms (one-row INSERT)"
    )
    for k, v in runs.items():
        print(
            f"{k:>26}: {statistics.median(v):>9,.0f} jobs/s  "
            f"ratio {statistics.median(ratios[k]):.2f}"
        )
    for label, ratio in (
        ("sync / async", sync_over_async),
        ("isolated / sync", isolated_over_sync),
    ):
        if ratio is not None:
            print(f"{label:>26}: {ratio:.2f}")
    if lat is not None:
        print(
            f"{'idle latency':>26}: p50 {lat['p50_ms']:.2f} ms, p95 {lat['p95_ms']:.2f} ms, "
            f"p99 {lat['p99_ms']:.2f} ms"
        )
    print(f"written to {path}")
    return record


if __name__ == "__main__":
    main()
