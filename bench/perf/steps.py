"""What durable steps cost: no-op jobs against jobs of ten no-op durable
steps (``job.step()`` / ``job.step_async()``), drained by the same worker.

    python -m bench.perf.steps [--jobs 2000] [--work-jobs 400] [--concurrency 20]
                               [--repeats 3] [--out PATH]

On a fresh server on disk (fsync and synchronous_commit on), JOBS jobs are
enqueued, then one forked ``AsyncWorker`` process (``concurrency`` slots)
drains them (bench.workers.drain: jobs per second from the first start to
the last finish, database clock). A plain job's handler returns at once
(``noop_sync``, ``noop``); a step job's handler calls ``job.step()`` ten
times on a function that returns at once (``steps_sync``, ``steps_async``,
bench/handlers.py): one read of the job's stored steps and ten fenced
inserts, each its own commit, on the worker's handler connections. Sync
handlers (the worker's threads) and async ones are measured apart. A
third pair does work: WORK_JOBS jobs of ten pieces of 10 ms of blocking
work (``work_sync``), against the same with each piece a step
(``steps_work_sync``), and with a progress report after each piece
(``progress_work_sync``). In each pair the two kinds alternate, ``repeats``
times each. Writes
results/steps.json, with the ratio of the medians (step jobs' rate / plain
jobs' rate) per pair.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from bench.common import bench_database, summary
from bench.handlers import STEPS
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import drain

# Each pair: (plain task, step task), names in bench.handlers; whether it
# runs the work jobs (ten pieces of 10 ms: WORK_JOBS of them) or no-ops.
PAIRS = {
    "sync": ("noop_sync", "steps_sync"),
    "async": ("noop", "steps_async"),
    "sync_10x10ms": ("work_sync", "steps_work_sync"),
    # The same work reporting its progress after each piece (job.progress()).
    "progress_10x10ms": ("work_sync", "progress_work_sync"),
}
WORKING = ("sync_10x10ms", "progress_10x10ms")


def measure(url: str, jobs: int, work_jobs: int, concurrency: int, repeats: int) -> dict[str, Any]:
    """Per pair: the rates of each task (median, min, max) and their ratio."""
    out: dict[str, Any] = {}
    for pair, tasks in PAIRS.items():
        rates: dict[str, list[float]] = {task: [] for task in tasks}
        count = work_jobs if pair in WORKING else jobs
        for _ in range(repeats):
            for task in tasks:
                rates[task].append(drain(url, count, concurrency=concurrency, task=task))
        plain, steps = (summary(rates[task]) for task in tasks)
        out[pair] = {
            "plain_jobs_per_second": plain,
            "steps_jobs_per_second": steps,
            "ratio_steps_to_plain": steps["median"] / plain["median"],
        }
    return out


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--work-jobs", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    started = time.monotonic()
    with bench_database("steps") as url:
        info = server_info(url)
        results = measure(url, args.jobs, args.work_jobs, args.concurrency, args.repeats)
    elapsed = time.monotonic() - started
    record = ResultRecord(
        name="steps",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "jobs": args.jobs,
            "work_jobs": args.work_jobs,
            "concurrency": args.concurrency,
            "repeats": args.repeats,
            "steps_per_job": STEPS,
            "tasks": {pair: list(tasks) for pair, tasks in PAIRS.items()},
            "worker": "1 forked AsyncWorker process (bench.workers.drain)",
            "machine_state": "shared: other agents' builds, tests and benchmarks may run "
            "on the same cores (load averages below)",
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
        },
        results={"elapsed_seconds": elapsed, "results": results},
    )
    path = write_result(record, args.out)
    for pair, row in results.items():
        print(
            f"{pair}: plain {row['plain_jobs_per_second']['median']:,.0f} jobs/s, "
            f"{STEPS} steps {row['steps_jobs_per_second']['median']:,.0f} jobs/s, "
            f"ratio {row['ratio_steps_to_plain']:.2f}"
        )
    print(f"(load {load_before[0]:.1f}) {elapsed:,.0f} s; written to {path}")
    return record


if __name__ == "__main__":
    main()
