"""Recovery time: from the SIGKILL of a busy worker to its jobs running again
on an idle one.

    python -m bench.faults.recovery [--runs 10] [--jobs 10] [--lease-only] [--out PATH]

A fresh server on disk with default durability (or DATABASE_URL). Each run,
on emptied tables: worker process A (``pgqueue worker`` on the fault
handlers, concurrency JOBS, the default settings) claims JOBS jobs of a
minute each and starts them all; worker B starts and registers, idle; A
gets SIGKILL. The run ends when every job runs again on B. Its recovery
time is the last new attempt's ``started_at`` minus the database's
``now()`` read just after the kill: both from the database's clock.
``--lease-only`` runs the same with ``session_death_detection`` off, so
that only the leases (30 s) find the dead worker: the time before
migration 0008.

Writes results/recovery.json (``--lease-only``: results/recovery_lease.json):
each run's seconds, their median and maximum.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import statistics
import subprocess
from collections.abc import Iterator
from typing import Any

import psycopg

from bench.common import bench_database
from bench.record import ResultRecord, command_line, server_info, write_result
from harness.fault_tasks import create_deliveries, spawn_worker, stop_worker, wait_for
from pgqueue import Queue, Settings

# Long enough that the killed worker's jobs are still running when the
# rescuer takes them, and that the rescuer is still running them when all
# have started again.
JOB_MS = 60_000


def worker_name(conn: psycopg.Connection[Any], pid: int) -> str | None:
    """The registered name of the worker process ``pid`` (None: not yet)."""
    row = conn.execute("SELECT name FROM pgqueue_workers WHERE pid = %s", (pid,)).fetchone()
    return row[0] if row else None


def holding(conn: psycopg.Connection[Any], name: str, pid: int) -> int:
    """Jobs running under ``name`` whose current attempt its handler (in
    process ``pid``) has started: held, and busy."""
    row = conn.execute(
        "SELECT count(*) FROM pgqueue_jobs j JOIN fault_deliveries d"
        " ON d.job_id = j.id AND d.token = j.lease_token"
        " WHERE j.state = 'running' AND j.worker = %s AND d.worker_pid = %s",
        (name, pid),
    ).fetchone()
    return int(row[0]) if row else 0


def start_worker(
    url: str, conn: psycopg.Connection[Any], concurrency: int, **settings: Any
) -> tuple[subprocess.Popen[bytes], str]:
    """A worker process on the fault handlers, once it has registered."""
    proc = spawn_worker(url, concurrency=concurrency, **settings)
    try:
        name = wait_for(lambda: worker_name(conn, proc.pid), 60)
    except TimeoutError:
        proc.kill()
        raise
    return proc, name


@contextlib.contextmanager
def killed_worker(
    url: str, *, jobs: int = 10, ms: int = JOB_MS, **settings: Any
) -> Iterator[dict[str, Any]]:
    """One run (see the module's docstring): yields, once every job runs
    again on the rescuer, what happened. Afterwards the rescuer is stopped
    (killed if it still runs jobs)."""
    create_deliveries(url)
    procs: list[subprocess.Popen[bytes]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            victim, victim_name = start_worker(url, conn, jobs, **settings)
            procs.append(victim)
            with Queue(url, settings=Settings(database_url=url)) as q:
                enqueued = q.enqueue_many([{"task": "work", "payload": {"ms": ms}}] * jobs)
            ids = [job.id for job in enqueued]
            wait_for(lambda: holding(conn, victim_name, victim.pid) == jobs, 60)
            rescuer, rescuer_name = start_worker(url, conn, jobs, **settings)
            procs.append(rescuer)
            held_at_kill = holding(conn, victim_name, victim.pid)
            idle_at_kill = holding(conn, rescuer_name, rescuer.pid) == 0
            victim.send_signal(signal.SIGKILL)
            [killed_at] = conn.execute("SELECT now()").fetchone()  # type: ignore[misc]
            victim.wait()
            wait_for(lambda: holding(conn, rescuer_name, rescuer.pid) == jobs, 120)
            rows = conn.execute(
                "SELECT attempts, extract(epoch FROM started_at - %s)::float, last_error"
                " FROM pgqueue_jobs WHERE id = ANY(%s)",
                (killed_at, ids),
            ).fetchall()
            victim_row = conn.execute(
                "SELECT expires_at <= now(), session_pid FROM pgqueue_workers WHERE name = %s",
                (victim_name,),
            ).fetchone()
            yield {
                "ids": ids,
                "victim": victim_name,
                "rescuer": (rescuer_name, rescuer.pid),
                "held_at_kill": held_at_kill,
                "rescuer_idle_at_kill": idle_at_kill,
                "recovery_seconds": max(r[1] for r in rows),
                "attempts": {r[0] for r in rows},
                "last_errors": {r[2] for r in rows},
                "victim_marked_dead": victim_row == (True, None),
            }
        finally:
            for proc in procs:
                if proc.poll() is None and holding(
                    conn, worker_name(conn, proc.pid) or "", proc.pid
                ):
                    proc.kill()
                stop_worker(proc)


def _empty(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE pgqueue_jobs, pgqueue_workers")
        conn.execute("DROP TABLE IF EXISTS fault_deliveries")


def run(url: str, *, runs: int = 10, jobs: int = 10, lease_only: bool = False) -> dict[str, Any]:
    """``runs`` runs on the database at ``url`` (migrated; emptied each run)."""
    settings = {"session_death_detection": False} if lease_only else {}
    seconds = []
    for _ in range(runs):
        _empty(url)
        with killed_worker(url, jobs=jobs, **settings) as facts:
            assert facts["held_at_kill"] == jobs and facts["rescuer_idle_at_kill"], facts
            assert facts["attempts"] == {2}, facts
            seconds.append(round(facts["recovery_seconds"], 3))
        print(f"  run {len(seconds)}: {seconds[-1]:.2f} s", flush=True)
    return {
        "parameters": {"runs": runs, "jobs": jobs, "job_ms": JOB_MS, "worker_settings": settings},
        "recovery_seconds": {
            "median": statistics.median(seconds),
            "max": max(seconds),
            "min": min(seconds),
            "runs": seconds,
        },
    }


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--lease-only", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    name = "recovery_lease" if args.lease_only else "recovery"
    with bench_database(name) as url:
        server = server_info(url)
        result = run(url, runs=args.runs, jobs=args.jobs, lease_only=args.lease_only)
    record = ResultRecord.from_report(name, command_line(__spec__, argv), server, result)
    path = write_result(record, args.out)
    stats = result["recovery_seconds"]
    print(f"{name}: median {stats['median']:.2f} s, max {stats['max']:.2f} s -> {path}")
    return record


if __name__ == "__main__":
    main()
