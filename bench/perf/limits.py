"""Queue controls: what a limit costs the claim, how fast a limited queue
drains, and how long a flood in one queue makes another queue's jobs wait.

    python -m bench.perf.limits [--jobs 20000] [--repeats 3] [--flood 100000] [--only NAME]
                                [--rate-jobs 5000] [--trickle 60]

On a fresh server on disk with fsync and synchronous_commit on:

* claim_cost: one connection claims JOBS pre-loaded jobs of one queue in
  claims of 100 and acks each batch (as a worker does), with no controls, a
  concurrency limit and a rate limit both too high to bind, and a per-key
  concurrency limit of 5 over 100 keys (which never holds a claim of 100
  back), so that what is measured is the path a limited claim takes: its
  lock, its counts, its choice. Per job: the claim statement's
  time (client clock, round trip included) and, when the server runs on
  this machine, the server's CPU time for claim and ack together.
* drain: 2 worker processes (no-op handler, concurrency 100) drain JOBS
  jobs with no controls, a concurrency limit of 50 and of 10, per-key limits
  of 5 over 20 keys, and a rate limit of 2,000 per second (RATE_JOBS jobs);
  jobs/s from first start to last finish (database clock).
* fairness: FLOOD jobs in queue "flood", then TRICKLE jobs in queue
  "trickle", 20 a second, one worker process serving both (named, and every
  queue); the trickle jobs' start latency (started_at - run_at) and the
  flood's drain rate. Run with another checkout's interpreter to measure it
  (``--only fairness`` uses no queue controls).

Writes results/limits.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import psycopg

from bench.common import bench_database, clear, rate, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import async_workers, wait_connected, wait_drained
from pgqueue import Outcome, Queue, Settings
from pgqueue.core import transitions as t

QUEUE = "bench"
BATCH = 100
KEYS = 100
# Limits that never bind in claim_cost: what is measured is the path, not a wait.
NEVER = 1_000_000
CLAIM_COST: dict[str, dict[str, Any]] = {
    "no_controls": {},
    "concurrency_limit": {"concurrency_limit": NEVER},
    "rate_limit": {"rate_limit": NEVER, "rate_period_seconds": 3600.0},
    # 5 a key, 100 keys: a claim of 100 is never held back, and reads 5 jobs a key.
    "concurrency_limit_per_key_5": {"concurrency_limit_per_key": 5},
}
DRAIN: dict[str, dict[str, Any]] = {
    "no_controls": {},
    "concurrency_limit_50": {"concurrency_limit": 50},
    "concurrency_limit_10": {"concurrency_limit": 10},
    "concurrency_limit_5_per_key_20_keys": {"concurrency_limit_per_key": 5},
    "rate_limit_2000_per_second": {"rate_limit": 2000, "rate_period_seconds": 1.0},
}
DRAIN_KEYS = 20
TICK = os.sysconf("SC_CLK_TCK")


def reset(url: str) -> None:
    clear(url, checkpoint=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE pgqueue_queues, pgqueue_starts")


def load(q: Queue, jobs: int, limits: dict[str, Any], keys: int) -> None:
    """Set the queue's limits and enqueue ``jobs`` no-op jobs in it, spread
    over ``keys`` concurrency keys under a per-key limit."""
    if limits:
        q.set_limits(QUEUE, **limits)
    keyed = "concurrency_limit_per_key" in limits
    q.enqueue_many(
        [
            {"task": "noop", "queue": QUEUE, "concurrency_key": f"k{i % keys}" if keyed else None}
            for i in range(jobs)
        ]
    )


def _backend_cpu(conn: psycopg.Connection[Any]) -> float | None:
    """Seconds of CPU the connection's server process has used, when it runs
    here and its /proc entry is readable."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    try:
        with open(f"/proc/{row[0]}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def claim_cost(url: str, jobs: int, limits: dict[str, Any]) -> dict[str, float | None]:
    """Claim and ack JOBS jobs of one queue in batches; time the claims."""
    reset(url)
    settings = Settings(database_url=url, pool_min_size=1, pool_max_size=1)
    with Queue(url, settings=settings) as q, psycopg.connect(url, autocommit=True) as conn:
        load(q, jobs, limits, KEYS)
        conn.execute("VACUUM ANALYZE pgqueue_jobs")
        # Claims and acks on one connection of our own, whose server process we time.
        cpu_before = _backend_cpu(conn)
        claiming = done = 0.0
        while True:
            began = time.perf_counter()
            claimed = q.run(t.claim(settings, limit=BATCH, worker="b", queues=[QUEUE]), conn)
            claiming += time.perf_counter() - began
            if not claimed:
                break
            q.run(t.finish(settings, [Outcome.success(job, None) for job in claimed]), conn)
            done += len(claimed)
        cpu_after = _backend_cpu(conn)
    assert done == jobs, f"claimed {done} of {jobs}"
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return {
        "claim_ms_per_statement": claiming / (jobs / BATCH) * 1000,
        "claim_us_per_job": claiming / jobs * 1e6,
        "server_cpu_us_per_job_claim_and_ack": None if cpu is None else cpu / jobs * 1e6,
    }


def drain(url: str, jobs: int, rate_jobs: int, limits: dict[str, Any]) -> dict[str, float]:
    """2 worker processes drain ``jobs`` no-op jobs (``rate_jobs`` under a
    rate limit) under ``limits``."""
    jobs = rate_jobs if "rate_limit" in limits else jobs
    reset(url)
    with Queue(url, settings=Settings(database_url=url)) as q:
        load(q, jobs, limits, DRAIN_KEYS)
    with async_workers(2, Settings(database_url=url, concurrency=100), name="limits") as procs:
        wait_drained(url, jobs, procs)
    return {"jobs_per_second": rate(url, jobs)}


def fairness(url: str, flood: int, trickle: int, queues: Sequence[str] | None) -> dict[str, Any]:
    """A flood in one queue, a trickle in another, one worker for both (no
    queue controls: another checkout, without them, can run this too)."""
    clear(url, checkpoint=False)
    with Queue(url, settings=Settings(database_url=url)) as q:
        q.enqueue_many([{"task": "noop", "queue": "flood"}] * flood)
        settings = Settings(database_url=url, concurrency=100)
        with async_workers(1, settings, name="fair", queues=queues) as procs:
            wait_connected(url, 1)
            ids: list[int] = []
            for _ in range(trickle):  # 20 a second
                ids.append(q.enqueue("noop", queue="trickle").id)
                time.sleep(0.05)
            wait_drained(url, flood + trickle, procs)
    with psycopg.connect(url) as conn:
        waits = [
            row[0]
            for row in conn.execute(
                "SELECT extract(epoch FROM started_at - run_at)::float8 * 1000 FROM pgqueue_jobs "
                "WHERE id = ANY(%s) ORDER BY 1",
                (ids,),
            )
        ]
    return {
        "trickle_start_ms": {
            "p50": statistics.median(waits),
            "p99": statistics.quantiles(waits, n=100, method="inclusive")[98],
            "max": waits[-1],
        },
        "flood_jobs_per_second": rate(url, flood, queue="flood"),
    }


def _rounds(
    repeats: int, scenarios: dict[str, Callable[[], Any]], runs: dict[str, list[Any]]
) -> None:
    for repeat in range(repeats):
        for name, run in scenarios.items():
            result = run()
            runs.setdefault(name, []).append(result)
            print(f"  round {repeat + 1} {name}: {result}", flush=True)


def _medians(values: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds (nested dicts keep their shape)."""
    out: dict[str, Any] = {}
    for key, first in values[0].items():
        column = [v[key] for v in values]
        if isinstance(first, dict):
            out[key] = _medians(column)
        elif first is None:
            out[key] = None
        else:
            out[key] = summary(column)
    return out


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--flood", type=int, default=100_000)
    parser.add_argument("--rate-jobs", type=int, default=5000)
    parser.add_argument("--trickle", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["claim_cost", "drain", "fairness"], default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    runs: dict[str, list[Any]] = {}
    with bench_database("limits") as url:
        groups: dict[str, dict[str, Callable[[], Any]]] = {
            "claim_cost": {
                f"claim_cost.{name}": partial(claim_cost, url, args.jobs, limits)
                for name, limits in CLAIM_COST.items()
            },
            "drain": {
                f"drain.{name}": partial(drain, url, args.jobs, args.rate_jobs, limits)
                for name, limits in DRAIN.items()
            },
            "fairness": {
                "fairness.named_queues": partial(
                    fairness, url, args.flood, args.trickle, ["flood", "trickle"]
                ),
                "fairness.every_queue": partial(fairness, url, args.flood, args.trickle, None),
            },
        }
        for group, scenarios in groups.items():
            if args.only in (None, group):
                print(group, flush=True)
                _rounds(args.repeats, scenarios, runs)
        server = server_info(url)
    results: dict[str, Any] = {}
    for name, values in runs.items():
        group, scenario = name.split(".", 1)
        results.setdefault(group, {})[scenario] = _medians(values)
    record = ResultRecord(
        name="limits",
        command=command_line(__spec__, argv),
        server=server,
        parameters={
            "jobs": args.jobs,
            "flood": args.flood,
            "repeats": args.repeats,
            "batch": BATCH,
            "claim_cost_keys": KEYS,
            "drain_keys": DRAIN_KEYS,
            "rate_jobs": args.rate_jobs,
            "trickle": args.trickle,
            "only": args.only,
        },
        results=results,
    )
    path = write_result(record, args.out)
    print(f"written to {path}")
    return record


if __name__ == "__main__":
    main()
