"""Why the jobs table has fillfactor 70: WAL per job and drain rate, with and
without a history of finished jobs, at fillfactor 70 and at PostgreSQL's
default of 100.

    python -m bench.perf.fillfactor [--history 300000] [--jobs 10000] [--repeats 3] [--out PATH]

For each fillfactor, three tables: empty; with HISTORY finished jobs that
went through the real path (enqueue_many, then claim + finish, as in
production); and with HISTORY finished rows bulk-inserted in one INSERT ...
SELECT (never updated), which is how bench.perf.metrics_history makes its
history quickly. In each, JOBS jobs are
enqueued, a CHECKPOINT is taken (so that every page's first change writes a
full-page image to WAL, as in production between checkpoints), and the jobs
are drained by a claim(100) + finish loop on one connection; then they are
deleted and the table vacuumed, as retention would. Reported per cell:
jobs/s, WAL bytes per job, and how many heap pages the drained jobs ended
on. Writes results/fillfactor.json.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psycopg

from bench.common import bench_database, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from harness.history import add_finished_jobs
from pgqueue import Outcome, Queue, Settings

HISTORY_SQL = (
    "INSERT INTO pgqueue_jobs (queue, task, state, attempts, enqueued_at, run_at, started_at,"
    " finished_at, result) SELECT 'history', 'noop', 'succeeded', 1, now() - interval '1 day',"
    " now() - interval '1 day', now() - interval '1 day', now() - interval '1 day',"
    " '{\"ok\": true}' FROM generate_series(1, %s)"
)


def drain_once(queue: Queue, admin: psycopg.Connection[Any], jobs: int) -> dict[str, float]:
    queue.enqueue_many([{"task": "noop", "queue": "bench"} for _ in range(jobs)])
    admin.execute("CHECKPOINT")
    start_lsn = admin.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
    started = time.perf_counter()
    while claimed := queue.claim(100, worker="bench", queues=["bench"]):
        queue.finish([Outcome.success(job, None) for job in claimed])
    elapsed = time.perf_counter() - started
    wal = admin.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (start_lsn,)).fetchone()[0]  # type: ignore[index]
    pages = admin.execute(
        "SELECT count(DISTINCT (ctid::text::point)[0]) FROM pgqueue_jobs WHERE queue = 'bench'"
    ).fetchone()[0]  # type: ignore[index]
    admin.execute("DELETE FROM pgqueue_jobs WHERE queue = 'bench'")
    admin.execute("VACUUM pgqueue_jobs")
    return {
        "jobs_per_second": jobs / elapsed,
        "wal_bytes_per_job": int(wal) / jobs,
        "heap_pages": float(pages),
    }


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=300_000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    cells: dict[str, dict[str, dict[str, float]]] = {}
    with bench_database("fillfactor") as url:
        settings = Settings(database_url=url)
        with Queue(url, settings=settings) as queue, psycopg.connect(url, autocommit=True) as admin:
            for fillfactor in (70, 100):
                for history in ("none", "real", "bulk_insert"):
                    admin.execute("TRUNCATE pgqueue_jobs")
                    admin.execute(f"ALTER TABLE pgqueue_jobs SET (fillfactor = {fillfactor})")
                    if history == "real":
                        add_finished_jobs(queue, args.history)
                    elif history == "bulk_insert":
                        admin.execute(HISTORY_SQL, (args.history,))
                    admin.execute("VACUUM ANALYZE pgqueue_jobs")
                    runs = [drain_once(queue, admin, args.jobs) for _ in range(args.repeats)]
                    name = f"fillfactor_{fillfactor}_history_{history}"
                    cells[name] = {
                        metric: summary([run[metric] for run in runs]) for metric in runs[0]
                    }
                    row = cells[name]
                    print(
                        f"fillfactor {fillfactor:>3}, history {history:<11}: "
                        f"{row['jobs_per_second']['median']:>8,.0f} jobs/s, "
                        f"{row['wal_bytes_per_job']['median']:>6,.0f} WAL bytes/job, "
                        f"{row['heap_pages']['median']:>5,.0f} heap pages",
                        flush=True,
                    )
            admin.execute("ALTER TABLE pgqueue_jobs SET (fillfactor = 70)")
        server = server_info(url)
    record = ResultRecord(
        name="fillfactor",
        command=command_line(__spec__, argv),
        server=server,
        parameters=vars(args),
        results={"cells": cells},
    )
    path = write_result(record, args.out)
    print(f"-> {path}")
    return record


if __name__ == "__main__":
    main()
