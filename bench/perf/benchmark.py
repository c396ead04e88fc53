"""Drain throughput: SKIP LOCKED vs plain FOR UPDATE, 1 to 32 worker processes.

    python -m bench.perf.benchmark [--jobs 5000] [--workers 1,2,4,8,16,32] [--repeats 3]
                                   [--models single,batched] [--concurrency 100] [--out PATH]

On a fresh server on disk (fsync and synchronous_commit on), for each round:
JOBS no-op jobs are pre-loaded (enqueue_many, one transaction), W worker
processes (forked) open their connections and wait on a barrier, the barrier
releases them together, and they drain the queue. Rate = JOBS /
(max(finished_at) - min(started_at)), both from the database clock, so process
start-up and shut-down are not counted.

Two claim modes: pgqueue's own claim (``transitions.claim``, its
``job_claim`` statement: FOR UPDATE SKIP LOCKED), and the same statement with a
plain FOR UPDATE (``CLAIM_FOR_UPDATE``). Every worker process
runs the same loop on one dedicated autocommit connection: claim up to N jobs
in the mode's way, ack them with one ``transitions.finish`` (``job_finish``),
until a claim comes back empty. Two worker models, by N:

* ``single``: the reference's model, N = 1: a job is exactly two short
  transactions (two commits, two round trips).
* ``batched``: N = --concurrency (default 100, the worker's default
  concurrency and the most one of its claims takes): batched claims and acks,
  as pgqueue's worker sends them.

(The committed results/benchmark.json predates this loop: its batched model
was one ``AsyncWorker`` per process, switched to plain FOR UPDATE by a setting
the product carried for this benchmark alone; its "batched_model" parameter
says so.)

Rounds are interleaved (for each repeat, for each W: both models, both modes)
so that drift on the shared machine hits every cell alike; each
SKIP LOCKED / FOR UPDATE ratio is taken within one round.
Writes results/benchmark.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row

from bench.common import bench_database, clear, rate, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from pgqueue import Job, Outcome, Queue, Settings
from pgqueue.core import transitions as t
from pgqueue.sql import QUERIES

# pgqueue's own job_claim with SKIP LOCKED taken out: the product claims with
# SKIP LOCKED only, and the comparison needs nothing from it but its statement.
CLAIM_FOR_UPDATE: LiteralString = QUERIES["job_claim"].replace(
    "FOR UPDATE SKIP LOCKED", "FOR UPDATE"
)

MODES = ("skip_locked", "for_update")
# The queue of every job (the default one); claims name it, as a worker does.
QUEUE = "default"
MODELS = ("single", "batched")
BARRIER_TIMEOUT = 120.0
DRAIN_TIMEOUT = 1800.0


# -- worker processes ---------------------------------------------------------------


def _claimer(
    mode: str, q: Queue, conn: psycopg.Connection[Any], limit: int, name: str
) -> Callable[[], list[Job]]:
    """A claim of up to ``limit`` jobs: pgqueue's own (its claim flow), or
    this file's plain FOR UPDATE copy of its statement."""
    settings = q.settings
    if mode == "skip_locked":
        return lambda: q.run(t.claim(settings, limit=limit, worker=name, queues=[QUEUE]), conn)
    params = {
        "limit": limit,
        "queues": [QUEUE],
        "shares": [limit],
        "lease_seconds": settings.lease_seconds,
        "worker": name,
        "latency_bounds": list(settings.latency_buckets),
    }
    return lambda: [Job.from_row(r) for r in conn.execute(CLAIM_FOR_UPDATE, params).fetchall()]


def _drain_loop(url: str, mode: str, limit: int, barrier: Barrier, name: str) -> None:
    """Claim up to ``limit`` jobs, ack them, repeat until a claim finds nothing."""
    settings = Settings(database_url=url, pool_min_size=0, pool_max_size=1)
    with (
        Queue(url, settings=settings) as q,
        psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn,
    ):
        claim = _claimer(mode, q, conn, limit, name)
        conn.execute("SELECT 1")  # connected and authenticated before the barrier
        barrier.wait(BARRIER_TIMEOUT)
        while jobs := claim():
            q.run(t.finish(settings, [Outcome.success(job, None) for job in jobs]), conn)


def _child(url: str, mode: str, limit: int, barrier: Barrier, name: str) -> None:
    try:
        _drain_loop(url, mode, limit, barrier, name)
    except BaseException:
        barrier.abort()  # the parent must not wait for a child that died
        raise


# -- one round ----------------------------------------------------------------------


def drain(url: str, jobs: int, workers: int, mode: str, limit: int) -> float:
    """Pre-load ``jobs``, release ``workers`` processes together; jobs/s."""
    clear(url)
    with Queue(url, settings=Settings(database_url=url, pool_min_size=0, pool_max_size=1)) as q:
        q.enqueue_many([{"task": "noop"}] * jobs)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(workers + 1)
    procs = [
        ctx.Process(
            target=_child, args=(url, mode, limit, barrier, f"bench-{mode}-{i}"), daemon=True
        )
        for i in range(workers)
    ]
    for proc in procs:
        proc.start()
    try:
        barrier.wait(BARRIER_TIMEOUT)
        deadline = time.monotonic() + DRAIN_TIMEOUT
        for proc in procs:
            proc.join(max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    codes = [p.exitcode for p in procs]
    if any(codes):
        raise RuntimeError(f"workers exited with {codes}")
    return rate(url, jobs)


# -- main ---------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _table(
    runs: dict[str, dict[str, dict[int, list[float]]]],
    ratios: dict[str, dict[int, list[float]]],
    workers: list[int],
) -> dict[str, Any]:
    """model -> workers -> {mode: summary and runs, ratio: summary}."""
    return {
        model: {
            str(w): {
                **{mode: summary(by_mode[mode][w]) | {"runs": by_mode[mode][w]} for mode in MODES},
                "ratio_skip_locked_to_for_update": summary(ratios[model][w]),
            }
            for w in workers
        }
        for model, by_mode in runs.items()
    }


def _print_table(table: dict[str, Any], workers: list[int], repeats: int) -> None:
    print(f"\nmedian jobs/s of {repeats} (min-max); ratio = SKIP LOCKED / FOR UPDATE, per round")
    for model, rows in table.items():
        print(f"\n{model} model")
        print(f"{'workers':>7}  {'SKIP LOCKED':>26}  {'plain FOR UPDATE':>26}  {'ratio':>5}")
        for w in workers:
            cells = []
            for mode in MODES:
                s = rows[str(w)][mode]
                cells.append(f"{s['median']:>8,.0f} ({s['min']:,.0f}-{s['max']:,.0f})")
            r = rows[str(w)]["ratio_skip_locked_to_for_update"]["median"]
            print(f"{w:>7}  {cells[0]:>26}  {cells[1]:>26}  {r:>5.2f}")


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--workers", type=_ints, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--concurrency", type=int, default=100, help="jobs per batched claim")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            parser.error(f"unknown model {m!r}")
    limits = {"single": 1, "batched": args.concurrency}

    runs: dict[str, dict[str, dict[int, list[float]]]] = {
        m: {mode: {w: [] for w in args.workers} for mode in MODES} for m in models
    }
    ratios: dict[str, dict[int, list[float]]] = {m: {w: [] for w in args.workers} for m in models}
    started = time.monotonic()
    with bench_database("benchmark") as url:
        info = server_info(url)
        for repeat in range(args.repeats):
            for w in args.workers:
                for model in models:
                    rates = {}
                    for mode in MODES:
                        rates[mode] = drain(url, args.jobs, w, mode, limits[model])
                        runs[model][mode][w].append(rates[mode])
                        print(
                            f"repeat {repeat + 1}/{args.repeats} {model:>7} {mode:>11} "
                            f"{w:>2} workers: {rates[mode]:>9,.1f} jobs/s "
                            f"[{time.monotonic() - started:,.0f} s]",
                            flush=True,
                        )
                    ratios[model][w].append(rates["skip_locked"] / rates["for_update"])
    elapsed = time.monotonic() - started
    table = _table(runs, ratios, args.workers)
    record = ResultRecord(
        name="benchmark",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "jobs": args.jobs,
            "workers": args.workers,
            "repeats": args.repeats,
            "models": models,
            "batched_concurrency": args.concurrency,
            "single_model": "dedicated autocommit connection per process; claim 1 job "
            "then finish([success]) per job, until a claim returns nothing",
            "batched_model": f"the same loop claiming up to {args.concurrency} jobs per "
            "statement and acking them in one job_finish",
            "claim": "skip_locked: pgqueue's job_claim; for_update: its copy in "
            "bench/perf/benchmark.py without SKIP LOCKED",
            "rate": "jobs / (max(finished_at) - min(started_at)), database clock",
            "process_start": "fork, then a multiprocessing barrier after connecting",
        },
        results={"elapsed_seconds": elapsed, "results_jobs_per_second": table},
    )
    path = write_result(record, args.out)
    _print_table(table, args.workers, args.repeats)
    print(f"\n{elapsed:,.0f} s; written to {path}")
    return record


if __name__ == "__main__":
    main()
