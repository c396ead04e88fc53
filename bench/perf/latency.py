"""Enqueue-to-start latency at a fixed enqueue rate, NOTIFY on vs poll only.

    python -m bench.perf.latency [--jobs 1000] [--rate 100] [--workers 1,2,4,8,16,32]
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
import statistics
import time

from bench.common import bench_database, clear, start_latency_percentiles
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import async_workers, wait_connected, wait_drained
from pgqueue import Queue, Settings

MODES = ("notify", "poll")


def run_once(
    url: str, jobs: int, per_second: float, workers: int, mode: str, poll_off: float
) -> dict[str, float]:
    clear(url)
    listen = mode == "notify"
    poll = Settings().poll_interval_seconds if listen else poll_off
    settings = Settings(database_url=url, poll_interval_seconds=poll)
    with async_workers(workers, settings, name=f"latency-{mode}", listen=listen) as procs:
        wait_connected(url, workers, listen=listen)
        with Queue(url, settings=Settings(database_url=url, pool_min_size=1, pool_max_size=1)) as q:
            interval = 1.0 / per_second
            start = time.monotonic()
            for i in range(jobs):
                pause = start + i * interval - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                q.enqueue("noop")
            produce_seconds = time.monotonic() - start
        wait_drained(url, jobs, procs)
    return {**start_latency_percentiles(url, jobs), "achieved_rate": jobs / produce_seconds}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> ResultRecord:
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
    record = ResultRecord(
        name="latency",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
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
        results={"elapsed_seconds": elapsed, "results_ms": table},
    )
    path = write_result(record, args.out)
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
    return record


if __name__ == "__main__":
    main()
