"""Does history slow the queue down? Claim+ack throughput, GET /metrics
latency, and the per-minute history's costs (GET /queues/{name}/history, the
snapshot) with 0, 100k and 1M finished jobs in the table.

    python -m bench.perf.history [--sizes 0,100000,1000000] [--jobs 10000]
                                 [--repeats 3] [--scrapes 300] [--page-cost N]
                                 [--out PATH]

One fresh server on disk (fsync and synchronous_commit on), the API in front
of it, and the same live load at every size (harness.history.add_live_load:
1,000 queued, 200 scheduled and 50 running jobs over 4 queues). Only the
history grows, added the way production adds it
(harness.history.add_finished_jobs: jobs enqueued, claimed and acked; a bulk
INSERT of finished rows leaves pages unlike a real history's, see
bench.perf.fillfactor), then VACUUM ANALYZE.
At each size:
  * claim_ack_batch_100: JOBS jobs in their own queue, drained on one
    connection by claim(100, queues=[...]) + finish(...) (bench/perf/core.py's
    loop, with a queue filter so the live load stays untouched);
  * worker_1_process: JOBS jobs drained by one AsyncWorker process (forked,
    concurrency 100, that queue only); rate from started_at/finished_at;
  * metrics: sequential GET /metrics scrapes, each followed by a GET /healthz
    (one trivial query) as a control for how busy the machine was
    (bench/perf/metrics_history.py's scrape_latencies);
  * the per-minute history (pgqueue.history): sequential GET
    /queues/q0/history?minutes=1440 (a day of points, over a day of
    snapshots written beforehand: SNAPSHOT_DAY), each followed by a GET
    /healthz; and the snapshot flow a worker's maintenance runs (fold, then
    history_snapshot), SNAPSHOTS calls taking a new minute each (the copy of
    every queue's totals) and as many for a minute already taken (what the
    other offers of a minute cost).
Each throughput run is paired with the same run on a second database of the
same server that never gets any history (the control, with the same live
load): the ratio of the pair cancels most of the drift of a shared machine.
The drained jobs are deleted after each run, so the history stays at the
stated size. Flatness = median at the largest size / median at 0.
Writes results/history.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from bench.common import (
    add_page_cost_option,
    bench_database,
    page_cost_options,
    rate,
    summary,
)
from bench.perf.api_enqueue import api_server
from bench.perf.metrics_history import check_exposition, scrape_latencies, table_mb
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import async_workers, wait_drained
from harness.history import LIVE_LOAD, add_finished_jobs, add_live_load
from pgqueue import Outcome, Queue, Settings, migrate
from pgqueue.core.history import snapshot

QUEUE = "drain"
RUN_KEYS = (
    "claim_ack_batch_100",
    "claim_ack_batch_100_control",
    "claim_ack_batch_100_vs_control",
    "worker_1_process",
    "worker_1_process_control",
    "worker_1_process_vs_control",
)
FLATNESS_KEYS = (
    "claim_ack_batch_100",
    "claim_ack_batch_100_vs_control",
    "worker_1_process",
    "worker_1_process_vs_control",
    "metrics_scrape_ms",
    "history_scrape_ms",
    "history_scrape_vs_healthz",
    "snapshot_new_minute_ms",
    "snapshot_taken_minute_ms",
)
HISTORY_PATH = "/queues/q0/history?minutes=1440"
SNAPSHOTS = 200
# A day of snapshots of the live load's queues, their totals growing every
# minute, as a day of maintenance leaves them.
SNAPSHOT_DAY = """
WITH minutes AS (
    SELECT date_trunc('minute', now()) - make_interval(mins => i) AS minute, 1440 - i AS n
    FROM generate_series(1, 1440) i
), marked AS (
    INSERT INTO pgqueue_history_snapshots (minute) SELECT minute FROM minutes
)
INSERT INTO pgqueue_queue_minutes (queue, minute, enqueued, succeeded, failed, dead, latency)
SELECT 'q' || q, minute, 100 * n, 95 * n, 5 * n, n,
       jsonb_build_object('3', 60 * n, '5', 30 * n, '9', 10 * n)
FROM minutes, generate_series(0, 3) q
"""


def _control_database(url: str) -> str:
    """A second migrated database on the same server that never gets history."""
    name = "history_control"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    control = urlunsplit(urlsplit(url)._replace(path=f"/{name}"))
    migrate(control)
    return control


def _load(queue: Queue, conn: psycopg.Connection[Any], jobs: int) -> int:
    """Enqueue ``jobs`` in the drain queue; the id below all of them."""
    row = conn.execute("SELECT coalesce(max(id), 0) FROM pgqueue_jobs").fetchone()
    assert row is not None
    queue.enqueue_many([{"task": "noop", "queue": QUEUE}] * jobs)
    return int(row[0])


def _forget(conn: psycopg.Connection[Any], first_id: int) -> None:
    conn.execute("DELETE FROM pgqueue_jobs WHERE id > %s AND queue = %s", (first_id, QUEUE))
    conn.execute("VACUUM ANALYZE pgqueue_jobs")


def claim_ack_rate(url: str, queue: Queue, conn: psycopg.Connection[Any], jobs: int) -> float:
    first = _load(queue, conn, jobs)
    while claimed := queue.claim(100, worker="history", queues=[QUEUE]):
        queue.finish([Outcome.success(job, None) for job in claimed])
    drained = rate(url, jobs, queue=QUEUE, after_id=first)
    _forget(conn, first)
    return drained


def worker_rate(url: str, queue: Queue, conn: psycopg.Connection[Any], jobs: int) -> float:
    settings = Settings(database_url=url)
    with async_workers(1, settings, name="history", queues=[QUEUE]) as procs:
        first = _load(queue, conn, jobs)
        wait_drained(url, jobs, procs, after_id=first)
    drained = rate(url, jobs, queue=QUEUE, after_id=first)
    _forget(conn, first)
    return drained


def _measure(
    runs: dict[str, list[float]], pairs: list[tuple[str, Queue, psycopg.Connection[Any]]], jobs: int
) -> None:
    """Each measurement next to the same one on the empty control database of
    the same server: their ratio cancels the drift of the shared machine."""
    (url, queue, conn), (control_url, cqueue, cconn) = pairs
    for key, measure in (
        ("claim_ack_batch_100", claim_ack_rate),
        ("worker_1_process", worker_rate),
    ):
        value = measure(url, queue, conn, jobs)
        control = measure(control_url, cqueue, cconn, jobs)
        runs[key].append(value)
        runs[f"{key}_control"].append(control)
        runs[f"{key}_vs_control"].append(value / control)


def snapshot_costs(queue: Queue, conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Milliseconds of the snapshot flow: for new minutes (a week ahead, so
    that they are not among the minutes read; deleted afterwards), then again
    for the same minutes, already taken."""
    [(now,)] = conn.execute("SELECT date_trunc('minute', now())").fetchall()
    ahead = [now + timedelta(days=7, minutes=i) for i in range(SNAPSHOTS)]
    costs: dict[str, Any] = {}
    for key in ("snapshot_new_minute_ms", "snapshot_taken_minute_ms"):
        times = []
        for minute in ahead:
            started = time.perf_counter()
            queue.run(snapshot(minute))
            times.append((time.perf_counter() - started) * 1000)
        costs[key] = summary(times)
    conn.execute("DELETE FROM pgqueue_queue_minutes WHERE minute > now() + interval '1 day'")
    conn.execute("DELETE FROM pgqueue_history_snapshots WHERE minute > now() + interval '1 day'")
    return costs


def _row(size: int, load_seconds: float, runs: dict[str, list[float]], mb: float) -> dict[str, Any]:
    return {
        "finished_jobs": size,
        "table_mb": mb,
        "load_seconds": round(load_seconds, 1),
        **{k: summary(v) | {"runs": v} for k, v in runs.items()},
    }


def _print_progress(row: dict[str, Any], elapsed: float) -> None:
    print(
        f"{row['finished_jobs']:>9,} finished ({row['table_mb']} MB): "
        f"claim+ack batch 100 {row['claim_ack_batch_100']['median']:>8,.0f} jobs/s "
        f"(x{row['claim_ack_batch_100_vs_control']['median']:.2f} of control); "
        f"worker {row['worker_1_process']['median']:>8,.0f} jobs/s "
        f"(x{row['worker_1_process_vs_control']['median']:.2f}); "
        f"GET /metrics {row['metrics_scrape_ms']['median']:.2f} ms; "
        f"GET history {row['history_scrape_ms']['median']:.2f} ms; "
        f"snapshot {row['snapshot_new_minute_ms']['median']:.2f} ms "
        f"(taken {row['snapshot_taken_minute_ms']['median']:.2f} ms) [{elapsed:,.0f} s]",
        flush=True,
    )


def _print_rows(rows: list[dict[str, Any]], flatness: dict[str, float]) -> None:
    print("\nmedians (min-max); x = ratio to the empty control database, same moments")
    print(
        f"{'finished':>10}  {'claim+ack b100 jobs/s':>24} {'x':>5}  {'worker jobs/s':>24} "
        f"{'x':>5}  {'GET /metrics ms':>20}"
    )
    for row in rows:
        cells = []
        for key, fmt in (
            ("claim_ack_batch_100", ",.0f"),
            ("worker_1_process", ",.0f"),
            ("metrics_scrape_ms", ".2f"),
        ):
            s = row[key]
            cells.append(
                f"{format(s['median'], fmt)} ({format(s['min'], fmt)}-{format(s['max'], fmt)})"
            )
        xb = row["claim_ack_batch_100_vs_control"]["median"]
        xw = row["worker_1_process_vs_control"]["median"]
        print(
            f"{row['finished_jobs']:>10,}  {cells[0]:>24} {xb:>5.2f}  {cells[1]:>24} "
            f"{xw:>5.2f}  {cells[2]:>20}"
        )
    print("largest / none: " + ", ".join(f"{k} {v:.2f}" for k, v in flatness.items()))


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0,100000,1000000", help="finished jobs, ascending")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scrapes", type=int, default=300)
    add_page_cost_option(parser)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    options = page_cost_options(args.page_cost) or None

    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with bench_database("history", options) as url:
        info = server_info(url)
        control_url = _control_database(url)
        for u in (url, control_url):
            with psycopg.connect(u, autocommit=True) as conn:
                add_live_load(conn)
                conn.execute("VACUUM ANALYZE pgqueue_jobs")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(SNAPSHOT_DAY)
        settings = Settings(database_url=url, pool_max_size=2)
        with (
            api_server(url) as base,
            psycopg.connect(url, autocommit=True) as conn,
            Queue(url, settings=settings) as queue,
            psycopg.connect(control_url, autocommit=True) as cconn,
            Queue(control_url, settings=settings.replace(database_url=control_url)) as cqueue,
        ):
            loaded = drained = 0
            for size in sizes:
                began = time.perf_counter()
                add_finished_jobs(queue, size - loaded)
                loaded = size
                conn.execute("VACUUM ANALYZE pgqueue_jobs")
                conn.execute("CHECKPOINT")
                load_seconds = time.perf_counter() - began
                runs: dict[str, list[float]] = {k: [] for k in RUN_KEYS}
                for _ in range(args.repeats):
                    _measure(runs, [(url, queue, conn), (control_url, cqueue, cconn)], args.jobs)
                    drained += 2 * args.jobs
                row = _row(size, load_seconds, runs, table_mb(conn))
                times, control, text = scrape_latencies(base, args.scrapes)
                # The counters are monotonic: they include the drained (deleted) jobs.
                check_exposition(text, size + drained)
                row["metrics_scrape_ms"] = summary(times) | {
                    "p90": statistics.quantiles(times, n=10)[-1]
                }
                # GET /healthz right after each scrape: how busy the machine was.
                row["healthz_control_ms"] = summary(control)
                times, control, text = scrape_latencies(base, args.scrapes, HISTORY_PATH)
                assert len(json.loads(text)["points"]) == 1440
                row["history_scrape_ms"] = summary(times) | {
                    "p90": statistics.quantiles(times, n=10)[-1]
                }
                row["history_healthz_control_ms"] = summary(control)
                # Each scrape over the /healthz right after it: what the
                # history's read costs beyond a trivial request, at that moment.
                row["history_scrape_vs_healthz"] = summary(
                    [t / c for t, c in zip(times, control, strict=True)]
                )
                row |= snapshot_costs(queue, conn)
                rows.append(row)
                _print_progress(row, time.monotonic() - started)
    first, last = rows[0], rows[-1]
    flatness = {key: last[key]["median"] / first[key]["median"] for key in FLATNESS_KEYS}
    record = ResultRecord(
        name="history",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "sizes": sizes,
            "jobs": args.jobs,
            "repeats": args.repeats,
            "scrapes": args.scrapes,
            "live_load": LIVE_LOAD,
            "history_path": HISTORY_PATH,
            "snapshot_day": "1,440 minutes of snapshots of q0-q3 (SNAPSHOT_DAY)",
            "snapshots": SNAPSHOTS,
            "history": "enqueued, claimed and acked (harness.history.add_finished_jobs)",
            "server_options": options,
        },
        results={
            "elapsed_seconds": time.monotonic() - started,
            "sizes": rows,
            "ratio_largest_to_empty": flatness,
        },
    )
    path = write_result(record, args.out)
    _print_rows(rows, flatness)
    print(f"written to {path}")
    return record


if __name__ == "__main__":
    main()
