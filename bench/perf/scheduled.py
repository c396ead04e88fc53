"""Delayed jobs at scale: does a backlog of scheduled jobs slow the queue?

    python -m bench.perf.scheduled [--scheduled 1000000] [--jobs 20000] [--rounds 3]
                                   [--calls 200] [--out PATH]

One server with fsync on, two databases: ``plain`` holds nothing but the
runnable jobs of each round; ``scheduled`` also holds SCHEDULED jobs due 1 to
30 days ahead (four queues, three priorities). Two questions, each asked of
both databases in the same run:

* the idle worker's cost: what one idle poll sends, a claim that finds
  nothing (``job_claim``) and the question "when is the next delayed job
  due?" (``queue_next_wake``), timed CALLS times each (median ms). The old
  statement (a plain ``min(run_at)`` over the queued rows, kept in
  this file as ``NEXT_RUN_AT_BEFORE``) is timed too, for the before figure;
* the claim rate of runnable jobs: JOBS no-op jobs drained by one worker
  process, rounds interleaved between the databases (jobs/s, database
  clock, median).

Writes results/scheduled.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, LiteralString

import psycopg

from bench.common import bench_server, rate, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import async_workers, wait_drained
from pgqueue import Queue, Settings, migrate
from pgqueue.sql import QUERIES

# The delayed-job part of the idle poll before issue 13: it read every
# queued row's run_at (job_next_run_at; now in queue_next_wake).
NEXT_RUN_AT_BEFORE: LiteralString = """
SELECT extract(epoch FROM min(run_at) - now())::double precision AS seconds
FROM pgqueue_jobs
WHERE state = 'queued' AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
"""
# An idle worker of every queue claims from the queues that have queued jobs:
# the four of the backlog, whose jobs are not due yet.
IDLE_CLAIM = {
    "limit": 100,
    "queues": ["q0", "q1", "q2", "q3"],
    "shares": [25, 25, 25, 25],
    "lease_seconds": 30,
    "worker": "idle",
    "latency_bounds": [1.0],
}
DATABASES = ("plain", "scheduled")


def add_scheduled(url: str, count: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgqueue_jobs (task, queue, priority, run_at)"
            " SELECT 'noop', 'q' || (i %% 4), i %% 3, now() + make_interval(days => 1 + i %% 30)"
            " FROM generate_series(1, %s) i",
            (count,),
        )
        conn.execute("VACUUM ANALYZE pgqueue_jobs")


def time_statement(url: str, query: LiteralString, params: dict[str, Any], calls: int) -> float:
    """Median milliseconds of one execution, prepared as the worker sends it."""
    times = []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(calls):
            began = time.perf_counter()
            conn.execute(query, params, prepare=True).fetchall()
            times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def idle_costs(url: str, calls: int) -> dict[str, float]:
    return {
        "job_claim_empty_ms": time_statement(url, QUERIES["job_claim"], IDLE_CLAIM, calls),
        "job_next_run_at_ms": time_statement(
            url, QUERIES["queue_next_wake"], {"queues": None}, calls
        ),
        "job_next_run_at_one_queue_ms": time_statement(
            url, QUERIES["queue_next_wake"], {"queues": ["q1"]}, calls
        ),
        "job_next_run_at_before_ms": time_statement(
            url, NEXT_RUN_AT_BEFORE, {"queues": None}, calls
        ),
    }


def drain_round(url: str, jobs: int) -> float:
    """Enqueue JOBS runnable no-op jobs beside whatever is scheduled; one
    worker drains them; their rate."""
    with psycopg.connect(url, autocommit=True) as conn:
        last = conn.execute("SELECT coalesce(max(id), 0) FROM pgqueue_jobs").fetchone()
        assert last is not None
        conn.execute("CHECKPOINT")
    with Queue(url, settings=Settings(database_url=url, pool_max_size=1)) as q:
        q.enqueue_many([{"task": "noop", "queue": "runnable"}] * jobs)
    with async_workers(1, Settings(database_url=url), name="scheduled") as procs:
        wait_drained(url, jobs, procs, after_id=last[0])
    return rate(url, jobs, after_id=last[0])


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scheduled", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    with bench_server("scheduled") as server:
        urls = {}
        for name in DATABASES:
            with psycopg.connect(server.url, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {name}")
            urls[name] = server.url.rsplit("/", 1)[0] + "/" + name
            migrate(urls[name])
        add_scheduled(urls["scheduled"], args.scheduled)
        idle = {name: idle_costs(urls[name], args.calls) for name in DATABASES}
        rates: dict[str, list[float]] = {name: [] for name in DATABASES}
        for _ in range(args.rounds):
            for name in DATABASES:
                rates[name].append(drain_round(urls[name], args.jobs))
                print(f"{name:>10}: {rates[name][-1]:,.0f} jobs/s", flush=True)
        results = {
            "idle_poll_ms": idle,
            "drain_jobs_per_second": {name: summary(rates[name]) for name in DATABASES},
            "drain_ratio_scheduled_to_plain": statistics.median(rates["scheduled"])
            / statistics.median(rates["plain"]),
            "idle_poll_ratio_scheduled_to_plain": (
                idle["scheduled"]["job_claim_empty_ms"] + idle["scheduled"]["job_next_run_at_ms"]
            )
            / (idle["plain"]["job_claim_empty_ms"] + idle["plain"]["job_next_run_at_ms"]),
        }
        record = ResultRecord(
            name="scheduled",
            command=command_line(__spec__, argv),
            server=server_info(urls["plain"]),
            parameters=vars(args),
            results=results,
        )
    for name in DATABASES:
        print(f"{name:>10}: idle poll {idle[name]}")
    print(f"drain scheduled/plain: {results['drain_ratio_scheduled_to_plain']:.3f}")
    print(f"written to {write_result(record, args.out)}")
    return record


if __name__ == "__main__":
    main()
