"""Enqueue-to-start latency at a fixed enqueue rate, NOTIFY on vs poll only.

    python -m bench.latency [--jobs 1000] [--rate 100] [--workers 1,2,4,8,16,32]
                            [--poll-off 0.05] [--repeats 1] [--out PATH]

On a fresh server on disk (fsync and synchronous_commit on): W worker
processes (forked, each an ``AsyncWorker`` with the no-op handler, SKIP
LOCKED) are started and connected; then one producer enqueues JOBS jobs, one
``Queue.enqueue`` each, at a fixed RATE per second (an absolute schedule, so a
slow enqueue does not shift the ones after it). Latency = started_at - run_at
of each job, both from the database clock: run_at is the enqueue statement's
now(), so it includes the producer's own commit (a WAL flush) and the
notification's delivery, and ends when a worker's claim statement starts.

Two modes:
* ``notify``: ``AsyncWorker(listen=True)``, pgqueue's default: LISTEN wakes the
  claimer; the poll interval stays at its default (1 s), only a fallback.
* ``poll``: ``AsyncWorker(listen=False)`` (the worker's documented switch for
  proxies that drop notifications), poll interval --poll-off (default 0.05 s,
  the reference system's poll), so the poll alone sets latency.
Writes results/latency.json.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import time
from multiprocessing.synchronize import Barrier, Event
from typing import Any

import psycopg

from bench.common import bench_database, server_info, start_latency_percentiles, write_result
from bench.worker_throughput import clear
from pgqueue import Queue, Settings

MODES = ("notify", "poll")
TIMEOUT = 600.0


def _worker(url: str, listen: bool, poll: float, barrier: Barrier, done: Event, name: str) -> None:
    from pgqueue.worker import AsyncWorker

    async def noop(job: Any) -> None:
        return None

    settings = Settings(database_url=url, poll_interval_seconds=poll)

    async def main() -> None:
        worker = AsyncWorker({"noop": noop}, settings=settings, name=name, listen=listen)
        barrier.wait(120)
        runner = asyncio.create_task(worker.run())
        await asyncio.to_thread(done.wait, TIMEOUT)
        await worker.stop()
        await runner

    try:
        asyncio.run(main())
    except BaseException:
        barrier.abort()
        raise


def _wait_connected(url: str, workers: int, listen: bool) -> None:
    """Every worker has its claim connection (and LISTEN, in notify mode)."""
    deadline = time.monotonic() + 60
    query = (
        "SELECT count(*) FILTER (WHERE application_name = 'pgqueue-worker'), "
        "count(*) FILTER (WHERE query ILIKE 'LISTEN%%') FROM pg_stat_activity"
    )
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(query).fetchone()
            assert row is not None
            if row[0] >= workers and (not listen or row[1] >= workers):
                time.sleep(0.5)  # let the first (empty) claims and polls settle
                return
            time.sleep(0.05)
    raise RuntimeError("workers did not connect")


def run_once(
    url: str, jobs: int, per_second: float, workers: int, mode: str, poll_off: float
) -> dict[str, float]:
    clear(url)
    listen = mode == "notify"
    poll = Settings().poll_interval_seconds if listen else poll_off
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(workers + 1)
    done = ctx.Event()
    procs = [
        ctx.Process(
            target=_worker,
            args=(url, listen, poll, barrier, done, f"latency-{mode}-{i}"),
            daemon=True,
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        barrier.wait(120)
        _wait_connected(url, workers, listen)
        with Queue(url, settings=Settings(database_url=url, pool_min_size=1, pool_max_size=1)) as q:
            interval = 1.0 / per_second
            start = time.monotonic()
            for i in range(jobs):
                pause = start + i * interval - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                q.enqueue("noop")
            produce_seconds = time.monotonic() - start
            deadline = time.monotonic() + TIMEOUT
            while True:
                row = q.read("queue_stats")
                if not any(r["queued"] or r["running"] or r["scheduled"] for r in row):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("jobs did not finish")
                time.sleep(0.05)
    finally:
        done.set()
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join()
    return {**start_latency_percentiles(url, jobs), "achieved_rate": jobs / produce_seconds}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--workers", type=_ints, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--poll-off", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    runs: dict[str, dict[int, list[dict[str, float]]]] = {
        m: {w: [] for w in args.workers} for m in MODES
    }
    started = time.monotonic()
    with bench_database("latency") as url:
        info = server_info(url)
        for repeat in range(args.repeats):
            for w in args.workers:
                for mode in MODES:
                    r = run_once(url, args.jobs, args.rate, w, mode, args.poll_off)
                    runs[mode][w].append(r)
                    print(
                        f"repeat {repeat + 1}/{args.repeats} {mode:>6} {w:>2} workers: "
                        f"p50 {r['p50_ms']:7.2f}  p95 {r['p95_ms']:7.2f}  "
                        f"p99 {r['p99_ms']:7.2f} ms  (rate {r['achieved_rate']:.1f}/s) "
                        f"[{time.monotonic() - started:,.0f} s]",
                        flush=True,
                    )
    elapsed = time.monotonic() - started

    def med(values: list[dict[str, float]], key: str) -> float:
        return statistics.median(v[key] for v in values)

    table = {
        mode: {
            str(w): {
                **{k: med(runs[mode][w], k) for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")},
                "runs": runs[mode][w],
            }
            for w in args.workers
        }
        for mode in MODES
    }
    payload: dict[str, Any] = {
        "command": "python -m bench.latency "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "server": info,
        "settings": {
            "jobs": args.jobs,
            "rate_per_second": args.rate,
            "workers": args.workers,
            "repeats": args.repeats,
            "notify_mode": "AsyncWorker(listen=True), poll interval "
            f"{Settings().poll_interval_seconds} s (default)",
            "poll_mode": f"AsyncWorker(listen=False), poll interval {args.poll_off} s",
            "latency": "started_at - run_at, database clock (includes the producer's commit)",
            "claim": "SKIP LOCKED",
        },
        "elapsed_seconds": elapsed,
        "results_ms": table,
    }
    path = write_result("latency", payload, args.out)
    print(
        f"\nenqueue-to-start latency (ms), {args.jobs} jobs at {args.rate:g}/s"
        + (f", median of {args.repeats} runs" if args.repeats > 1 else "")
    )
    print(f"{'workers':>7}  {'NOTIFY p50/p95/p99':>24}  {'poll only p50/p95/p99':>24}")
    for w in args.workers:
        cells = []
        for mode in MODES:
            s = table[mode][str(w)]
            cells.append(f"{s['p50_ms']:6.1f} {s['p95_ms']:6.1f} {s['p99_ms']:6.1f}")
        print(f"{w:>7}  {cells[0]:>24}  {cells[1]:>24}")
    print(f"\n{elapsed:,.0f} s; written to {path}")
    return payload


if __name__ == "__main__":
    main()
