"""What the archive's queue index (migration 0041) costs the moves: rows
per second moved from the hot table to the archive, with and without it,
in the same run.

    python -m bench.perf.archive_move [--rows 200000] [--repeats 3] [--out PATH]

On a fresh server on disk (fsync and synchronous_commit on): ROWS
succeeded jobs finished an hour ago are written straight into the hot
table (SQL), then VACUUM ANALYZE and a CHECKPOINT; Queue.archive() is
called until it moves nothing (job_archive, the workers' maintenance
statement, in batches of Settings.archive_batch), timed. Each round does
it with the index and without it (dropped), in turns. Writes
results/archive_move.json with each side's rows per second and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psycopg

from bench.common import bench_database, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from pgqueue import Queue, Settings

INDEX = "pgqueue_jobs_archive_queue"
LOAD = (
    "INSERT INTO pgqueue_jobs (queue, task, state, attempts, started_at, finished_at, payload)"
    " SELECT 'q', 't', 'succeeded', 1, now() - interval '2 hours', now() - interval '1 hour',"
    " jsonb_build_object('i', g) FROM generate_series(1, %s) g"
)


def moves_per_second(conn: psycopg.Connection[Any], queue: Queue, rows: int) -> float:
    conn.execute("TRUNCATE pgqueue_jobs, pgqueue_jobs_archive")
    conn.execute(LOAD, (rows,))
    conn.execute("VACUUM ANALYZE pgqueue_jobs")
    conn.execute("CHECKPOINT")
    started, moved = time.monotonic(), 0
    while moved_now := queue.archive():
        moved += moved_now
    if moved != rows:
        raise RuntimeError(f"moved {moved} of {rows} rows")
    return moved / (time.monotonic() - started)


def set_index(conn: psycopg.Connection[Any], *, present: bool) -> None:
    if present:
        conn.execute(f"CREATE INDEX IF NOT EXISTS {INDEX} ON pgqueue_jobs_archive (queue, id)")
    else:
        conn.execute(f"DROP INDEX IF EXISTS {INDEX}")


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    runs: dict[str, list[float]] = {"with_index": [], "without_index": []}
    with bench_database("archive_move") as url:
        settings = Settings(database_url=url)
        with psycopg.connect(url, autocommit=True) as conn, Queue(url, settings=settings) as queue:
            try:
                for repeat in range(args.repeats):
                    for side in runs:
                        set_index(conn, present=side == "with_index")
                        runs[side].append(moves_per_second(conn, queue, args.rows))
                        print(
                            f"round {repeat + 1} {side}: {runs[side][-1]:,.0f} rows/s", flush=True
                        )
            finally:
                set_index(conn, present=True)  # the schema as the migrations made it
        server = server_info(url)
    ratios = [a / b for a, b in zip(runs["with_index"], runs["without_index"], strict=True)]
    record = ResultRecord(
        name="archive_move",
        command=command_line(__spec__, argv),
        server=server,
        parameters={**vars(args), "archive_batch": settings.archive_batch},
        results={
            "rows_per_second": {
                side: summary(values) | {"runs": values} for side, values in runs.items()
            },
            "with_over_without": {"median": statistics.median(ratios), "rounds": ratios},
        },
    )
    path = write_result(record, args.out)
    print(f"with/without the index: {statistics.median(ratios):.2f}; written to {path}")
    return record


if __name__ == "__main__":
    main()
