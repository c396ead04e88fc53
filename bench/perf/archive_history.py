"""Does a large archive slow the queue down? Claim+ack throughput, GET
/metrics, the dashboard's main reads and GET /jobs/{id} of an archived job,
with an empty history and then with N succeeded jobs in pgqueue_jobs_archive
(migration 0034), in the same run; then the time of one retention drop.

    python -m bench.perf.archive_history [--rows 1000000] [--jobs 10000]
                                         [--repeats 3] [--reads 200] [--out PATH]

One fresh server on disk (fsync and synchronous_commit on), the API in front
of it, and the same live load throughout (harness.history.add_live_load:
1,000 queued, 200 scheduled and 50 running jobs over 4 queues). The history
is generated with SQL straight into the archive (generate_series, in chunks
of CHUNK rows): ROWS succeeded jobs finished over the last DAYS days, so
about DAYS + 1 day partitions, with ids below every later job's (as a real
history's), then VACUUM ANALYZE. At each size:
  * claim_ack_batch_100: JOBS jobs in their own queue, drained on one
    connection by claim(100) + finish (bench/perf/history.py's loop);
  * worker_1_process: JOBS jobs drained by one AsyncWorker process (forked,
    concurrency 100, that queue only, retention longer than the history so
    that its maintenance drops nothing), rate from started_at/finished_at;
  * metrics_ms: sequential GET /metrics, each followed by a GET /healthz
    (bench/perf/metrics_history.py's scrape_latencies);
  * reads_ms: the dashboard's main reads (READS: the queues, the job list,
    unfiltered and of succeeded jobs, a page deep in the history, the
    workers, the dead letters, the workflows), each READS times;
  * get_job_ms: GET /jobs/{id} of a live job, and with a history of an
    archived one in the middle of it.
Each throughput run is paired with the same run on a second database of
the same server that never gets a history (the control, with the same live
load), the pair's order alternating: the ratio of the pair cancels most of
the drift of a shared machine (bench/perf/history.py does the same). The
load is followed by a CHECKPOINT and a sync, so that the measurements do
not queue behind the write-back of the history just written.
Then retention_drop: the oldest day partition dropped by
Queue.drop_archived() (retention set just short of its end), timed.
Flatness = median with the history / median without.
Writes results/archive_history.json (results/archive_history_<rows>.json
with --out).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from bench.common import bench_database, rate, summary
from bench.perf.api_enqueue import api_server
from bench.perf.history import claim_ack_rate
from bench.perf.metrics_history import scrape_latencies, table_mb
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import async_workers, wait_drained
from harness.history import LIVE_LOAD, add_live_load
from pgqueue import Queue, Settings, migrate

QUEUE = "drain"
DAYS = 30
CHUNK = 1_000_000
# Longer than the history: the benchmark's worker drops none of it.
RETENTION_SECONDS = (DAYS + 5) * 86400.0
READS = {
    "queues": "/queues",
    "jobs": "/jobs?limit=50",
    "jobs_succeeded": "/jobs?state=succeeded&limit=50",
    "jobs_succeeded_deep": "/jobs?state=succeeded&limit=50&before_id={deep}",
    "jobs_queued": "/jobs?state=queued&limit=50",
    "workers": "/workers",
    "dead_letters": "/dead-letters",
    "workflows": "/workflows",
}
GENERATE = """
INSERT INTO pgqueue_jobs_archive (id, queue, task, payload, priority, state, run_at, attempts,
                                  max_attempts, worker, enqueued_at, started_at, finished_at,
                                  snoozes, has_dependents)
SELECT %(base)s::bigint + g, 'q' || (g %% 4), 'noop', jsonb_build_object('n', g), 0, 'succeeded',
       at - interval '2 s', 1, 5, 'bench', at - interval '2 s', at - interval '1 s', at, 0, false
FROM (SELECT g, now() - make_interval(days => %(days)s::int)
                + (g::float8 / %(rows)s::float8)
                  * (make_interval(days => %(days)s::int) - interval '10 min') AS at
      FROM generate_series(%(low)s::bigint, %(high)s::bigint) g) s
"""
ARCHIVE_MB = (
    "SELECT pg_total_relation_size(inhrelid) FROM pg_inherits WHERE inhparent = %s::regclass"
)


def archive_bytes(conn: psycopg.Connection[Any]) -> int:
    return sum(int(r[0]) for r in conn.execute(ARCHIVE_MB, ("pgqueue_jobs_archive",)))


def generate(conn: psycopg.Connection[Any], rows: int) -> dict[str, Any]:
    """ROWS succeeded jobs straight into the archive, ids below every later
    job's; the sequence moved past them."""
    began = time.perf_counter()
    [(base,)] = conn.execute("SELECT coalesce(max(id), 0) FROM pgqueue_jobs").fetchall()
    conn.execute(
        "SELECT pgqueue_archive_partitions(now() - make_interval(days => %s), now())", (DAYS,)
    )
    for low in range(1, rows + 1, CHUNK):
        high = min(rows, low + CHUNK - 1)
        conn.execute(GENERATE, {"base": base, "days": DAYS, "rows": rows, "low": low, "high": high})
        print(f"  {high:,} of {rows:,} rows [{time.perf_counter() - began:,.0f} s]", flush=True)
    conn.execute("SELECT setval('pgqueue_jobs_id_seq', %s)", (base + rows + 1,))
    conn.execute("VACUUM ANALYZE pgqueue_jobs_archive")
    conn.execute("CHECKPOINT")
    # And the kernel's write-back of what the load wrote, before measuring:
    # a first run of 100M measured the commits' fsyncs queueing behind it
    # (the first of each pair slower than its control, by up to half).
    os.sync()
    size = archive_bytes(conn)
    [(partitions,)] = conn.execute(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'pgqueue_jobs_archive'::regclass"
    ).fetchall()
    return {
        "rows": rows,
        "first_id": base + 1,
        "seconds": round(time.perf_counter() - began, 1),
        "archive_mb": round(size / 1048576, 1),
        "bytes_per_row": round(size / rows, 1) if rows else None,
        "partitions": partitions,
    }


def worker_rate(url: str, queue: Queue, conn: psycopg.Connection[Any], jobs: int) -> float:
    settings = Settings(database_url=url, retention_seconds=RETENTION_SECONDS)
    with async_workers(1, settings, name="archive", queues=[QUEUE]) as procs:
        [(first,)] = conn.execute("SELECT coalesce(max(id), 0) FROM pgqueue_jobs").fetchall()
        queue.enqueue_many([{"task": "noop", "queue": QUEUE}] * jobs)
        wait_drained(url, jobs, procs, after_id=first)
    drained = rate(url, jobs, queue=QUEUE, after_id=first)
    conn.execute("DELETE FROM pgqueue_jobs WHERE id > %s AND queue = %s", (first, QUEUE))
    conn.execute("VACUUM ANALYZE pgqueue_jobs")
    return drained


def latencies(base: str, path: str, n: int) -> dict[str, Any]:
    times, control, _ = scrape_latencies(base, n, path)
    return summary(times) | {
        "p90": statistics.quantiles(times, n=10)[-1] if len(times) > 1 else times[0],
        "healthz_median": statistics.median(control),
    }


def control_database(url: str) -> str:
    """A second migrated database on the same server that never gets a history."""
    name = "archive_control"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    control = urlunsplit(urlsplit(url)._replace(path=f"/{name}"))
    migrate(control)
    return control


Pair = tuple[str, Queue, psycopg.Connection[Any]]


def measure(base: str, pair: Pair, control: Pair, args: Any, deep: int) -> dict[str, Any]:
    url, queue, conn = pair
    runs: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        for key, rate_of in (
            ("claim_ack_batch_100", claim_ack_rate),
            ("worker_1_process", worker_rate),
        ):
            # Which of the pair goes first alternates: a drift of the
            # machine within a pair favours neither.
            if repeat % 2:
                same_moment = rate_of(*control, args.jobs)
                value = rate_of(url, queue, conn, args.jobs)
            else:
                value = rate_of(url, queue, conn, args.jobs)
                same_moment = rate_of(*control, args.jobs)
            runs.setdefault(key, []).append(value)
            runs.setdefault(f"{key}_control", []).append(same_moment)
            runs.setdefault(f"{key}_vs_control", []).append(value / same_moment)
    row: dict[str, Any] = {k: summary(v) | {"runs": v} for k, v in runs.items()}
    row["hot_table_mb"] = table_mb(conn)
    row["metrics_ms"] = latencies(base, "/metrics", args.reads)
    row["reads_ms"] = {
        name: latencies(base, path.format(deep=deep), args.reads) for name, path in READS.items()
    }
    [(live,)] = conn.execute("SELECT min(id) FROM pgqueue_jobs WHERE state = 'queued'").fetchall()
    row["get_job_ms"] = {"live": latencies(base, f"/jobs/{live}", args.reads)}
    return row


def retention_drop(url: str, conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Drop the oldest day partition: retention set to end just after it."""
    [(oldest, now)] = conn.execute(
        "SELECT min(inhrelid::regclass::text), now() FROM pg_inherits"
        " WHERE inhparent = 'pgqueue_jobs_archive'::regclass"
    ).fetchall()
    day = datetime.strptime(oldest[-8:], "%Y%m%d").replace(tzinfo=UTC)
    retention = (now - (day + timedelta(days=1))).total_seconds() - 1
    settings = Settings(database_url=url, retention_seconds=retention)
    with Queue(url, settings=settings) as queue:
        began = time.perf_counter()
        dropped = queue.drop_archived()
        seconds = time.perf_counter() - began
    return {
        "partitions": [d.partition for d in dropped],
        "estimated_rows": sum(d.estimated_rows for d in dropped),
        "ms": round(seconds * 1000, 2),
    }


def _print(size: int, row: dict[str, Any]) -> None:
    reads = ", ".join(f"{k} {v['median']:.1f}" for k, v in row["reads_ms"].items())
    gets = ", ".join(f"{k} {v['median']:.1f}" for k, v in row["get_job_ms"].items())
    print(
        f"{size:>12,} archived: claim+ack b100 {row['claim_ack_batch_100']['median']:,.0f}/s "
        f"(x{row['claim_ack_batch_100_vs_control']['median']:.2f} of control), "
        f"worker {row['worker_1_process']['median']:,.0f}/s "
        f"(x{row['worker_1_process_vs_control']['median']:.2f}), hot {row['hot_table_mb']} MB, "
        f"/metrics {row['metrics_ms']['median']:.1f} ms; reads ms: {reads}; "
        f"GET /jobs/id ms: {gets}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="archived jobs")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    started = time.monotonic()
    with bench_database("archive_history") as url:
        info = server_info(url)
        control_url = control_database(url)
        for each in (url, control_url):
            with psycopg.connect(each, autocommit=True) as conn:
                add_live_load(conn)
                conn.execute("VACUUM ANALYZE pgqueue_jobs")
        settings = Settings(database_url=url, pool_max_size=2)
        with (
            api_server(url) as base,
            psycopg.connect(url, autocommit=True) as conn,
            Queue(url, settings=settings) as queue,
            psycopg.connect(control_url, autocommit=True) as cconn,
            Queue(control_url, settings=settings.replace(database_url=control_url)) as cqueue,
        ):
            pair, control = (url, queue, conn), (control_url, cqueue, cconn)
            empty = measure(base, pair, control, args, deep=1)
            _print(0, empty)
            history = generate(conn, args.rows)
            middle = history["first_id"] + args.rows // 2
            full = measure(base, pair, control, args, deep=middle)
            full["get_job_ms"]["archived"] = latencies(base, f"/jobs/{middle}", args.reads)
            _print(args.rows, full)
            drop = retention_drop(url, conn)
            print(f"retention drop: {drop}", flush=True)
    flatness = {
        key: full[key]["median"] / empty[key]["median"]
        for key in (
            "claim_ack_batch_100",
            "claim_ack_batch_100_vs_control",
            "worker_1_process",
            "worker_1_process_vs_control",
            "metrics_ms",
        )
    } | {
        f"reads_ms.{k}": full["reads_ms"][k]["median"] / empty["reads_ms"][k]["median"]
        for k in READS
    }
    record = ResultRecord(
        name="archive_history",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "rows": args.rows,
            "days": DAYS,
            "jobs": args.jobs,
            "repeats": args.repeats,
            "reads": args.reads,
            "read_paths": READS,
            "live_load": LIVE_LOAD,
            "history": "generated with SQL straight into pgqueue_jobs_archive (GENERATE)",
        },
        results={
            "elapsed_seconds": round(time.monotonic() - started, 1),
            "generated": history,
            "empty": empty,
            "with_history": full,
            "retention_drop": drop,
            "ratio_with_history_to_empty": flatness,
        },
    )
    path = write_result(record, args.out)
    print("with history / empty: " + ", ".join(f"{k} {v:.2f}" for k, v in flatness.items()))
    print(f"written to {path}")
    return record


if __name__ == "__main__":
    main()
