"""Drain throughput: SKIP LOCKED vs plain FOR UPDATE, 1 to 32 worker processes.

    python -m bench.benchmark [--jobs 5000] [--workers 1,2,4,8,16,32] [--repeats 3]
                              [--models single,batched] [--out PATH]

On a fresh server on disk (fsync and synchronous_commit on), for each round:
JOBS no-op jobs are pre-loaded (enqueue_many, one transaction), W worker
processes (forked) open their connections and wait on a barrier, the barrier
releases them together, and they drain the queue. Rate = JOBS /
(max(finished_at) - min(started_at)), both from the database clock, so process
start-up and shut-down are not counted.

Two claim modes, chosen by ``Settings(skip_locked=...)`` (the same job_claim
statement with FOR UPDATE SKIP LOCKED or with a plain FOR UPDATE), and two
worker models:

* ``single``: the reference's model. Each process loops: claim 1 job
  (job_claim, LIMIT 1), ack it (job_finish), until a claim comes back empty.
  One dedicated autocommit connection per process, so a job is exactly two
  short transactions (two commits, two round trips), no pool checkout.
* ``batched``: pgqueue's worker. Each process runs an ``AsyncWorker`` (claims
  up to its free slots per statement, acks in batches, concurrency
  ``--concurrency``, default 100), until every job has succeeded.

Rounds are interleaved (for each repeat, for each W: both modes, both models)
so that drift on the shared machine hits every cell alike; each
SKIP LOCKED / FOR UPDATE ratio is taken within one round.
Writes results/benchmark.json.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import time
from multiprocessing.synchronize import Barrier, Event
from typing import Any

import psycopg

from bench.common import bench_database, server_info, summary, write_result
from bench.worker_throughput import clear, rate
from pgqueue import Queue, Settings
from pgqueue import transitions as t
from pgqueue.transitions import Outcome

MODES = {"skip_locked": True, "for_update": False}
MODELS = ("single", "batched")
BARRIER_TIMEOUT = 120.0
DRAIN_TIMEOUT = 1800.0


# -- worker processes ---------------------------------------------------------------


def _single_worker(url: str, skip_locked: bool, barrier: Barrier, name: str) -> None:
    """Claim one job, ack it, repeat until a claim finds nothing."""
    settings = Settings(database_url=url, skip_locked=skip_locked)
    with (
        Queue(url, settings=Settings(database_url=url, pool_min_size=0, pool_max_size=1)) as q,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        conn.execute("SELECT 1")  # connected and authenticated before the barrier
        barrier.wait(BARRIER_TIMEOUT)
        while True:
            jobs = q.run(t.claim(settings, limit=1, worker=name, queues=None), conn)
            if not jobs:
                return
            q.run(t.finish(settings, [Outcome.success(jobs[0], None)]), conn)


def _batched_worker(
    url: str, skip_locked: bool, concurrency: int, barrier: Barrier, done: Event, name: str
) -> None:
    """pgqueue's AsyncWorker with the no-op handler, until the parent says done."""
    from pgqueue.worker import AsyncWorker

    async def noop(job: Any) -> None:
        return None

    settings = Settings(database_url=url, skip_locked=skip_locked, concurrency=concurrency)

    async def main() -> None:
        worker = AsyncWorker({"noop": noop}, settings=settings, name=name)
        barrier.wait(BARRIER_TIMEOUT)
        runner = asyncio.create_task(worker.run())
        await asyncio.to_thread(done.wait, DRAIN_TIMEOUT)
        await worker.stop()
        await runner

    asyncio.run(main())


def _child(
    model: str,
    url: str,
    skip_locked: bool,
    concurrency: int,
    barrier: Barrier,
    done: Event,
    index: int,
) -> None:
    name = f"bench-{model}-{index}"
    try:
        if model == "single":
            _single_worker(url, skip_locked, barrier, name)
        else:
            _batched_worker(url, skip_locked, concurrency, barrier, done, name)
    except BaseException:
        barrier.abort()
        raise


# -- one round ----------------------------------------------------------------------


def _succeeded(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueue_jobs WHERE state = 'succeeded'").fetchone()
    return int(row[0]) if row else 0


def drain(
    url: str,
    jobs: int,
    workers: int,
    model: str,
    skip_locked: bool,
    concurrency: int,
    timings: dict[str, float] | None = None,
) -> float:
    """Pre-load ``jobs``, release ``workers`` processes together, return jobs/s
    (``timings`` gets the enqueue_many time)."""
    clear(url)
    with Queue(url, settings=Settings(database_url=url, pool_min_size=0, pool_max_size=1)) as q:
        began = time.perf_counter()
        q.enqueue_many([{"task": "noop"}] * jobs)
        if timings is not None:
            timings["enqueue_seconds"] = time.perf_counter() - began
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(workers + 1)
    done = ctx.Event()
    procs = [
        ctx.Process(
            target=_child,
            args=(model, url, skip_locked, concurrency, barrier, done, i),
            daemon=True,
        )
        for i in range(workers)
    ]
    for proc in procs:
        proc.start()
    try:
        barrier.wait(BARRIER_TIMEOUT)
        deadline = time.monotonic() + DRAIN_TIMEOUT
        if model == "batched":
            # AsyncWorkers never stop by themselves: watch the table.
            while _succeeded(url) < jobs:
                if time.monotonic() > deadline or not any(p.is_alive() for p in procs):
                    raise RuntimeError("batched workers did not finish the jobs")
                time.sleep(0.05)
        done.set()
        for proc in procs:
            proc.join(max(1.0, deadline - time.monotonic()))
    finally:
        done.set()
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--workers", type=_ints, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            parser.error(f"unknown model {m!r}")

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
                    for mode, skip in MODES.items():
                        rates[mode] = drain(url, args.jobs, w, model, skip, args.concurrency)
                        runs[model][mode][w].append(rates[mode])
                        print(
                            f"repeat {repeat + 1}/{args.repeats} {model:>7} {mode:>11} "
                            f"{w:>2} workers: {rates[mode]:>9,.1f} jobs/s "
                            f"[{time.monotonic() - started:,.0f} s]",
                            flush=True,
                        )
                    ratios[model][w].append(rates["skip_locked"] / rates["for_update"])
    elapsed = time.monotonic() - started

    table: dict[str, Any] = {}
    for model in models:
        table[model] = {
            str(w): {
                **{
                    mode: summary(runs[model][mode][w]) | {"runs": runs[model][mode][w]}
                    for mode in MODES
                },
                "ratio_skip_locked_to_for_update": summary(ratios[model][w]),
            }
            for w in args.workers
        }
    payload: dict[str, Any] = {
        "command": "python -m bench.benchmark "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "server": info,
        "settings": {
            "jobs": args.jobs,
            "workers": args.workers,
            "repeats": args.repeats,
            "models": models,
            "batched_concurrency": args.concurrency,
            "single_model": "dedicated autocommit connection per process; claim(limit=1) "
            "then finish([success]) per job, until a claim returns nothing",
            "batched_model": "AsyncWorker per process (batched claims and acks, LISTEN on)",
            "rate": "jobs / (max(finished_at) - min(started_at)), database clock",
            "process_start": "fork, then a multiprocessing barrier after connecting",
        },
        "elapsed_seconds": elapsed,
        "results_jobs_per_second": table,
    }
    path = write_result("benchmark", payload, args.out)
    print(
        f"\nmedian jobs/s of {args.repeats} (min-max); ratio = SKIP LOCKED / FOR UPDATE, per round"
    )
    for model in models:
        print(f"\n{model} model")
        print(f"{'workers':>7}  {'SKIP LOCKED':>26}  {'plain FOR UPDATE':>26}  {'ratio':>5}")
        for w in args.workers:
            cells = []
            for mode in MODES:
                s = table[model][str(w)][mode]
                cells.append(f"{s['median']:>8,.0f} ({s['min']:,.0f}-{s['max']:,.0f})")
            r = table[model][str(w)]["ratio_skip_locked_to_for_update"]["median"]
            print(f"{w:>7}  {cells[0]:>26}  {cells[1]:>26}  {r:>5.2f}")
    print(f"\n{elapsed:,.0f} s; written to {path}")
    return payload


if __name__ == "__main__":
    main()
