"""What a jobs table holds after a while in production: a history of
finished jobs, and a live load of queued, scheduled and running ones.

Benchmarks fill their tables with these (bench.perf.history,
bench.perf.fillfactor, bench.perf.metrics_history), and the query-plan tests
check that the statistics and claims stay on their indexes under the same
contents (tests/integration/schema/test_schema.py).
"""

from __future__ import annotations

from typing import Any

import psycopg

from pgqueue import Outcome, Queue

__all__ = ["LIVE_LOAD", "add_finished_jobs", "add_live_load"]

# What add_live_load adds, for the records of the benchmarks that use it.
LIVE_LOAD = {"queued": 1000, "scheduled": 200, "running": 50, "queues": 4}


def add_finished_jobs(queue: Queue, count: int, queue_name: str = "history") -> None:
    """``count`` finished jobs made the way production makes them (enqueued,
    claimed, acked), so that the table's pages look like a real history's. A
    bulk INSERT of finished rows is faster but leaves different pages (see
    bench.perf.fillfactor)."""
    for start in range(0, count, 50_000):
        size = min(50_000, count - start)
        queue.enqueue_many([{"task": "noop", "queue": queue_name} for _ in range(size)])
        while claimed := queue.claim(100, worker="history", queues=[queue_name]):
            queue.finish([Outcome.success(job, None) for job in claimed])


def add_live_load(conn: psycopg.Connection[Any]) -> None:
    """LIVE_LOAD: 1,000 queued, 200 scheduled (an hour ahead) and 50 running
    jobs (leases an hour long) over the queues q0-q3, and a start-latency
    histogram for each queue."""
    conn.execute(
        "INSERT INTO pgqueue_jobs (queue, task) "
        "SELECT 'q' || (i % 4), 'noop' FROM generate_series(1, 1000) i"
    )
    conn.execute(
        "INSERT INTO pgqueue_jobs (queue, task, run_at) "
        "SELECT 'q' || (i % 4), 'noop', now() + interval '1 hour' FROM generate_series(1, 200) i"
    )
    conn.execute(
        "INSERT INTO pgqueue_jobs (queue, task, state, attempts, started_at, lease_token, "
        "lease_expires_at, worker) "
        "SELECT 'q' || (i % 4), 'noop', 'running', 1, now(), i, now() + interval '1 hour', 'w' "
        "FROM generate_series(1, 50) i"
    )
    conn.execute(
        "INSERT INTO pgqueue_start_latency (queue, shard, bucket, count, sum_seconds) "
        "SELECT 'q' || q, s, b, 10, 0.01 * b "
        "FROM generate_series(0, 3) q, generate_series(0, 15) s, generate_series(0, 16) b"
    )
