"""What the reaper and the pruner cost when every worker runs them, against
an elected leader. The worker issue asks for whichever measures cheaper.

    python -m bench.perf.maintenance [--running 500] [--finished 1000000] [--calls 2000]
                                     [--workers 8] [--registered 100] [--backends 100]
                                     [--out PATH]

On a server with fsync on, a table holding RUNNING jobs with live leases (the
workers' slots) and FINISHED jobs inside the retention window (the history),
this times, one connection, CALLS times each, the statements a worker runs
per maintenance interval when there is nothing to do (the steady state):

* ``job_reap`` (every worker's reaper: nothing has expired);
* ``job_prune`` (every worker's pruner: nothing is past retention);
* ``pg_try_advisory_lock`` while another session holds the lock: what each
  of the other workers would send per interval to learn that it is not the
  leader (the leader keeps its session lock and runs the same reap);
* ``worker_reap_dead`` (every worker's death check, every
  ``death_check_interval_seconds``) with REGISTERED rows in the workers
  registry, each naming a live session, none dead, while BACKENDS idle
  sessions are open (the check reads every backend once: a fleet of 25
  workers has about 100). Then, once, the same statement finding one dead worker that holds a
  fifth of the running jobs (what a death costs, on top of the reap that
  follows), and the plans of both (EXPLAIN ANALYZE).

Per interval, P workers cost P x reap with "every worker", and (P - 1) x
try-lock + 1 x reap with a leader; per second, P x death check / its
interval more. Writes results/maintenance.json.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any

import psycopg

from bench.common import bench_database, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from pgqueue import Settings
from pgqueue.sql import QUERIES

TRY_LOCK = "SELECT pg_try_advisory_lock(hashtext('pgqueue.maintenance'))"
DEATH_CHECK = QUERIES["worker_reap_dead"]


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


def register(
    conn: psycopg.Connection[Any], registered: int, session: psycopg.Connection[Any]
) -> None:
    """``registered`` registry rows, each naming ``session`` (alive)."""
    conn.execute(
        "INSERT INTO pgqueue_workers (name, host, pid, version, concurrency, expires_at,"
        " session_pid, session_start, server_start)"
        " SELECT 'w' || i, 'h', i, 'v', 100, now() + interval '1 hour', a.pid,"
        " a.backend_start, pg_postmaster_start_time()"
        " FROM generate_series(1, %s) i, pg_stat_activity a WHERE a.pid = %s",
        (registered, session.info.backend_pid),
    )
    conn.execute("VACUUM ANALYZE pgqueue_workers")


def one_death(conn: psycopg.Connection[Any], running: int) -> dict[str, Any]:
    """A worker whose session no backend has, holding a fifth of the running
    jobs: the death check's time and plan when it finds it."""
    held = max(1, running // 5)
    conn.execute(
        "INSERT INTO pgqueue_workers (name, host, pid, version, concurrency, expires_at,"
        " session_pid, session_start, server_start)"
        " VALUES ('dead', 'h', 1, 'v', 100, now() + interval '1 hour', 2147483647, now(),"
        " pg_postmaster_start_time())"
    )
    conn.execute(
        "UPDATE pgqueue_jobs SET worker = 'dead'"
        " WHERE id IN (SELECT id FROM pgqueue_jobs WHERE state = 'running' LIMIT %s)",
        (held,),
    )
    with conn.transaction(force_rollback=True):
        plan = explain(conn, DEATH_CHECK, {"worker": "bench"})
    started = time.perf_counter()
    found = conn.execute(DEATH_CHECK, {"worker": "bench"}).fetchall()
    ms = (time.perf_counter() - started) * 1000
    assert found == [("dead", held)], found
    return {"held_jobs": held, "ms": ms, "plan": plan}


def explain(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> list[str]:
    rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + query, params).fetchall()
    return [row[0] for row in rows]


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
    parser.add_argument("--registered", type=int, default=100, help="rows in the workers registry")
    parser.add_argument("--backends", type=int, default=100, help="idle sessions open meanwhile")
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
            contextlib.ExitStack() as idle,
        ):
            for _ in range(args.backends):
                idle.enter_context(psycopg.connect(url, autocommit=True))
            assert leader.execute(TRY_LOCK).fetchone() == (True,)
            register(conn, args.registered, leader)
            check = (DEATH_CHECK, {"worker": "bench"})
            timings = {
                "reap_ms": time_calls(conn, [reap], args.calls),
                "prune_ms": time_calls(conn, [prune], args.calls),
                "try_lock_not_leader_ms": time_calls(conn, [(TRY_LOCK, {})], args.calls),
                "death_check_ms": time_calls(conn, [check], args.calls),
            }
            leftover = conn.execute(
                "SELECT count(*) FROM pgqueue_jobs WHERE state = 'running'"
                " AND lease_expires_at > now()"
            ).fetchone()
            idle_plan = explain(conn, *check)
            death = one_death(conn, args.running)
        server = server_info(url)
    assert leftover is not None and leftover[0] == args.running, "a live lease was taken"
    medians = {name: summary(values) for name, values in timings.items()}
    p = args.workers
    reap_ms = medians["reap_ms"]["median"]
    lock_ms = medians["try_lock_not_leader_ms"]["median"]
    per_interval = {
        "every_worker_ms": p * reap_ms,
        "elected_leader_ms": (p - 1) * lock_ms + reap_ms,
    }
    s_check = s.death_check_interval_seconds
    per_second = {
        "workers": p,
        "reap_and_death_check_ms": p
        * (reap_ms / s.reap_interval_seconds + medians["death_check_ms"]["median"] / s_check),
        "reap_only_ms": p * reap_ms / s.reap_interval_seconds,
    }
    record = ResultRecord(
        name="maintenance",
        command=command_line(__spec__, argv),
        server=server,
        parameters=vars(args),
        results={
            "statement_ms": medians,
            "per_reap_interval_for_workers": {"workers": p, **per_interval},
            "per_second_for_workers": per_second,
            "death_check_idle_plan": idle_plan,
            "death_check_finding_one": death,
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
    both = per_second["reap_and_death_check_ms"]
    print(
        f"  per second, {p} workers: reap and death check {both:.2f}"
        f" ms (reap alone {per_second['reap_only_ms']:.2f} ms); finding a dead worker holding"
        f" {death['held_jobs']} jobs: {death['ms']:.2f} ms"
    )
    print(f"-> {path}")
    return record


if __name__ == "__main__":
    main()
