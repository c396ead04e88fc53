"""Clearing a flood with bulk actions, without SQL: the issue's 134,000 jobs.

    python -m bench.perf.bulk [--flood 134000] [--other 50000] [--history 100000]
                              [--repeats 3] [--out PATH]

On a fresh server on disk with fsync and synchronous_commit on, each repeat
starts from an empty table and loads: HISTORY finished jobs (made the way
production makes them), OTHER queued jobs of queue "other" (enqueued first,
so that they come first in claim order), then FLOOD queued jobs of queue
"flood". It then times, through the library as `pgqueue jobs bulk` runs it:

* the dry run of ``bulk_cancel(queue="flood")`` (the count a confirmation shows);
* ``bulk_cancel(queue="flood")``, 1,000 jobs per statement, each its own
  transaction, counters and waiters' notifications included;
* ``bulk_retry(queue="flood")`` (all of them back to queued);
* ``bulk_cancel(task="flood")`` (no queue: the filter is not on the index);
* ``bulk_delete(queue="flood")``.

After each step it checks the outcome (how many rows, the cancelled
counter), so that a fast wrong answer cannot pass. Writes results/bulk.json:
seconds and jobs per second per step (median, min, max of the repeats).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import psycopg

from bench.common import bench_database, clear, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from harness.history import add_finished_jobs
from pgqueue import Queue, Settings

STEPS = ("dry_run", "cancel", "retry", "cancel_by_task", "delete")


def load(queue: Queue, flood: int, other: int, history: int) -> None:
    add_finished_jobs(queue, history)
    for name, count in (("other", other), ("flood", flood)):
        for start in range(0, count, 50_000):
            size = min(50_000, count - start)
            queue.enqueue_many([{"task": name, "queue": name}] * size)
    with psycopg.connect(queue.url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE pgqueue_jobs")


def cancelled_counter(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(cancelled), 0) FROM pgqueue_counters WHERE queue = 'flood'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def one_round(queue: Queue, flood: int) -> dict[str, float]:
    """Seconds per step; each step's count is checked."""
    steps: list[tuple[str, Callable[[], int]]] = [
        ("dry_run", lambda: queue.bulk_cancel(queue="flood", dry_run=True)),
        ("cancel", lambda: queue.bulk_cancel(queue="flood")),
        ("retry", lambda: queue.bulk_retry(queue="flood")),
        ("cancel_by_task", lambda: queue.bulk_cancel(task="flood")),
        ("delete", lambda: queue.bulk_delete(queue="flood")),
    ]
    seconds = {}
    for name, step in steps:
        started = time.perf_counter()
        done = step()
        seconds[name] = time.perf_counter() - started
        assert done == flood, f"{name}: {done} jobs, expected {flood}"
    assert cancelled_counter(queue.url) == 2 * flood, "the cancelled counter is off"
    return seconds


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood", type=int, default=134_000)
    parser.add_argument("--other", type=int, default=50_000)
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rounds: list[dict[str, float]] = []
    with bench_database("bulk") as url:
        with Queue(url, settings=Settings(database_url=url)) as queue:
            for _ in range(args.repeats):
                clear(url)
                load(queue, args.flood, args.other, args.history)
                rounds.append(one_round(queue, args.flood))
        server = server_info(url)
    results: dict[str, Any] = {
        "seconds": {step: summary([r[step] for r in rounds]) for step in STEPS},
        "jobs_per_second": {
            step: summary([args.flood / r[step] for r in rounds]) for step in STEPS
        },
    }
    record = ResultRecord(
        name="bulk",
        command=command_line(__spec__, argv),
        server=server,
        parameters=vars(args),
        results=results,
    )
    path = write_result(record, args.out)
    print(
        f"{args.flood:,} flood jobs behind {args.other:,} queued and {args.history:,} finished;"
        f" median of {args.repeats}"
    )
    for step in STEPS:
        s, r = results["seconds"][step], results["jobs_per_second"][step]
        print(
            f"  {step:<15} {s['median']:7.2f} s  ({s['min']:.2f}-{s['max']:.2f})"
            f"  {r['median']:10,.0f} jobs/s"
        )
    print(f"-> {path}")
    return record


if __name__ == "__main__":
    main()
