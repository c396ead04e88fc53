"""What the reaper and the pruner cost when every worker runs them, against
an elected leader. The worker issue asks for whichever measures cheaper.

    python -m bench.perf.maintenance [--running 500] [--finished 1000000] [--calls 2000]
                                     [--workers 8] [--out PATH]

On a server with fsync on, a table holding RUNNING jobs with live leases (the
workers' slots) and FINISHED jobs inside the retention window (the history),
this times, one connection, CALLS times each, the statements a worker runs
per maintenance interval when there is nothing to do (the steady state):

* ``job_reap`` (every worker's reaper: nothing has expired);
* ``job_prune`` (every worker's pruner: nothing is past retention);
* ``pg_try_advisory_lock`` while another session holds the lock: what each
  of the other workers would send per interval to learn that it is not the
  leader (the leader keeps its session lock and runs the same reap).

Per interval, P workers cost P x reap with "every worker", and (P - 1) x
try-lock + 1 x reap with a leader. Writes results/maintenance.json.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psycopg

from bench.common import bench_database, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from pgqueue import Settings
from pgqueue.sql import QUERIES

TRY_LOCK = "SELECT pg_try_advisory_lock(hashtext('pgqueue.maintenance'))"


def load(url: str, running: int, finished: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgqueue_jobs (task, state, attempts, started_at, finished_at,"
            " enqueued_at, run_at, result)"
            " SELECT 'noop', 'succeeded', 1, now() - interval '1 day',"
            " now() - interval '1 day', now() - interval '1 day', now() - interval '1 day',"
            " '{}' FROM generate_series(1, %s)",
            (finished,),
        )
        conn.execute(
            "INSERT INTO pgqueue_jobs (task, state, attempts, started_at, lease_token,"
            " lease_expires_at, worker)"
            " SELECT 'noop', 'running', 1, now(), i, now() + interval '1 hour', 'w'"
            " FROM generate_series(1, %s) i",
            (running,),
        )
        conn.execute("VACUUM ANALYZE pgqueue_jobs")


def time_calls(
    conn: psycopg.Connection[Any], queries: list[tuple[str, dict[str, Any]]], calls: int
) -> list[float]:
    """Milliseconds per call of the statement sequence, prepared, one connection."""
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        for query, params in queries:
            conn.execute(query, params, prepare=True).fetchall()
        out.append((time.perf_counter() - started) * 1000)
    return out


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--running", type=int, default=500)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=8, help="P, for the per-interval totals")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    s = Settings()
    reap = (QUERIES["job_reap"], {"limit": s.reap_batch, "backoff_base": 1.0, "backoff_cap": 60.0})
    prune = (
        QUERIES["job_prune"],
        {"retention_seconds": s.retention_seconds, "limit": s.prune_batch},
    )
    with bench_database("maintenance") as url:
        load(url, args.running, args.finished)
        with (
            psycopg.connect(url, autocommit=True) as conn,
            psycopg.connect(url, autocommit=True) as leader,
        ):
            assert leader.execute(TRY_LOCK).fetchone() == (True,)
            timings = {
                "reap_ms": time_calls(conn, [reap], args.calls),
                "prune_ms": time_calls(conn, [prune], args.calls),
                "try_lock_not_leader_ms": time_calls(conn, [(TRY_LOCK, {})], args.calls),
            }
            leftover = conn.execute(
                "SELECT count(*) FROM pgqueue_jobs WHERE state = 'running'"
            ).fetchone()
        server = server_info(url)
    assert leftover is not None and leftover[0] == args.running, "the reaper took live leases"
    medians = {name: summary(values) for name, values in timings.items()}
    p = args.workers
    reap_ms = medians["reap_ms"]["median"]
    lock_ms = medians["try_lock_not_leader_ms"]["median"]
    per_interval = {
        "every_worker_ms": p * reap_ms,
        "elected_leader_ms": (p - 1) * lock_ms + reap_ms,
    }
    record = ResultRecord(
        name="maintenance",
        command=command_line(__spec__, argv),
        server=server,
        parameters=vars(args),
        results={
            "statement_ms": medians,
            "per_reap_interval_for_workers": {"workers": p, **per_interval},
        },
    )
    path = write_result(record, args.out)
    print(f"{args.running} running, {args.finished:,} finished jobs; median of {args.calls} calls")
    for name, stats in medians.items():
        print(f"  {name:<26} {stats['median']:.3f} ms  ({stats['min']:.3f}-{stats['max']:.3f})")
    print(
        f"  per reap interval, {p} workers: every worker {per_interval['every_worker_ms']:.2f} ms,"
        f" elected leader {per_interval['elected_leader_ms']:.2f} ms"
    )
    print(f"-> {path}")
    return record


if __name__ == "__main__":
    main()
