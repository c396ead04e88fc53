"""GET /metrics latency as finished jobs pile up: it must stay flat.

    python -m bench.perf.metrics_history [--sizes 0,100000,1000000] [--scrapes 300] [--out PATH]

One uvicorn process (``pgqueue api``) on loopback, in front of a fresh
embedded PostgreSQL with fsync and synchronous_commit on. The same live load
is present at every size (1,000 queued, 200 scheduled and 50 running jobs
over 4 queues, and a start-latency histogram); only the history grows:
finished jobs are added with INSERT ... SELECT generate_series, with their
counters, as if workers had run them. After each load, VACUUM ANALYZE (what
autovacuum does soon after, with the table's settings), then sequential
scrapes from one client, each followed by a GET /healthz (one trivial
query) as a control for how busy the shared machine was at that moment.
The medians are the figures; buffers read by the snapshot's statements
(from EXPLAIN) are recorded too, as a measure that machine load cannot move.

For contrast, the same table aggregated the way the reference system does at
every scrape (count by queue and state over the whole table) is timed too.

Writes results/metrics_history.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from bench.common import bench_database, summary
from bench.perf.api_enqueue import TOKEN, api_server
from bench.record import ResultRecord, command_line, server_info, write_result
from harness.history import LIVE_LOAD, add_live_load
from pgqueue.sql import QUERIES

QUEUES = ("q0", "q1", "q2", "q3")
NAIVE_AGGREGATE = "SELECT queue, state, count(*) FROM pgqueue_jobs GROUP BY queue, state"


def add_history(conn: psycopg.Connection[Any], count: int) -> None:
    """``count`` more finished jobs (90% succeeded, the rest dead or cancelled),
    and the counters the transitions would have written for them."""
    if count <= 0:
        return
    conn.execute(
        "INSERT INTO pgqueue_jobs (queue, task, payload, state, attempts, run_at, enqueued_at, "
        "started_at, finished_at, result) "
        "SELECT 'q' || (i %% 4), 'noop', jsonb_build_object('i', i), "
        "CASE WHEN i %% 10 = 0 THEN 'dead' WHEN i %% 10 = 1 THEN 'cancelled' ELSE 'succeeded' END, "
        "1, now() - interval '1 day', now() - interval '1 day', now() - interval '1 day', "
        "now() - interval '1 day' + (i %% 1000) * interval '1 ms', '{\"ok\": true}' "
        "FROM generate_series(1, %(count)s) i",
        {"count": count},
    )
    conn.execute(
        "INSERT INTO pgqueue_counters AS c (queue, shard, succeeded, failed, dead, cancelled) "
        "SELECT 'q' || q, 0, sum(ok), sum(dead), sum(dead), sum(cancelled) FROM ("
        "  SELECT i %% 4 AS q, (i %% 10 > 1)::int AS ok, (i %% 10 = 0)::int AS dead, "
        "         (i %% 10 = 1)::int AS cancelled FROM generate_series(1, %(count)s) i) t "
        "GROUP BY q "
        "ON CONFLICT (queue, shard) DO UPDATE SET succeeded = c.succeeded + excluded.succeeded, "
        "failed = c.failed + excluded.failed, dead = c.dead + excluded.dead, "
        "cancelled = c.cancelled + excluded.cancelled",
        {"count": count},
    )


def scrape_latencies(
    base: str, scrapes: int, path: str = "/metrics"
) -> tuple[list[float], list[float], str]:
    """Milliseconds of each GET of ``path``, and of a /healthz (one trivial
    query) right after it: the control for how busy the shared machine was."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        for _ in range(20):  # warm up the connection and the server's pool
            client.get(path).raise_for_status()
        scrape: list[float] = []
        control: list[float] = []
        for _ in range(scrapes):
            for each, times in ((path, scrape), ("/healthz", control)):
                started = time.perf_counter()
                response = client.get(each)
                times.append((time.perf_counter() - started) * 1000)
                response.raise_for_status()
        return scrape, control, client.get(path).text


def table_mb(conn: psycopg.Connection[Any]) -> float:
    """The jobs table's size with its indexes and TOAST, in MB."""
    row = conn.execute("SELECT pg_total_relation_size('pgqueue_jobs') / 1048576.0").fetchone()
    assert row is not None
    return round(float(row[0]), 1)


def check_exposition(text: str, finished: int) -> None:
    """The scrape is well-formed and its counters account for every finished job."""
    completed = sum(
        s.value
        for family in text_string_to_metric_families(text)
        if family.name == "pgqueue_jobs_completed"
        for s in family.samples
        if s.name == "pgqueue_jobs_completed_total"
    )
    assert completed == finished, (completed, finished)


def snapshot_plans(conn: psycopg.Connection[Any]) -> dict[str, dict[str, float]]:
    """Server-side cost of each read behind a scrape: execution time and
    buffers touched. The buffer count does not depend on how busy the
    machine is, so it shows flatness without the noise of the timings."""
    out = {}
    for name in ("queue_stats", "counters_totals", "start_latency_histogram"):
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES[name]).fetchone()[
            0
        ][0]  # type: ignore[index]
        top = plan["Plan"]
        out[name] = {
            "execution_ms": plan["Execution Time"],
            "buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
        }
    return out


def naive_aggregate_ms(conn: psycopg.Connection[Any]) -> float:
    times = []
    for _ in range(5):
        started = time.perf_counter()
        conn.execute(NAIVE_AGGREGATE).fetchall()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0,100000,1000000", help="finished jobs, ascending")
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    rows = []
    with bench_database("metrics-history") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            add_live_load(conn)
        with api_server(url) as base, psycopg.connect(url, autocommit=True) as conn:
            loaded = 0
            for size in sizes:
                started = time.perf_counter()
                add_history(conn, size - loaded)
                loaded = size
                conn.execute("VACUUM ANALYZE pgqueue_jobs")
                load_seconds = time.perf_counter() - started
                times, control, text = scrape_latencies(base, args.scrapes)
                check_exposition(text, size)
                row: dict[str, Any] = {
                    "finished_jobs": size,
                    "table_mb": table_mb(conn),
                    "load_seconds": round(load_seconds, 1),
                    "scrape_ms": summary(times),
                    "scrape_ms_p90": statistics.quantiles(times, n=10)[-1],
                    "healthz_ms": summary(control),
                    "scrape_minus_healthz_ms": statistics.median(times)
                    - statistics.median(control),
                    "snapshot_queries": snapshot_plans(conn),
                    "naive_full_table_aggregate_ms": naive_aggregate_ms(conn),
                    "exposition_bytes": len(text.encode()),
                }
                rows.append(row)
                buffers = sum(q["buffers"] for q in row["snapshot_queries"].values())
                print(
                    f"{size:>9} finished: scrape median {row['scrape_ms']['median']:.2f} ms "
                    f"(p90 {row['scrape_ms_p90']:.2f}; "
                    f"/healthz {row['healthz_ms']['median']:.2f}), "
                    f"{buffers:.0f} buffers read; "
                    f"full-table aggregate {row['naive_full_table_aggregate_ms']:.1f} ms"
                )
        info = server_info(url)
    flat = rows[-1]["scrape_ms"]["median"] / rows[0]["scrape_ms"]["median"]
    extra = [round(r["scrape_minus_healthz_ms"], 2) for r in rows]
    record = ResultRecord(
        name="metrics_history",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "sizes": sizes,
            "scrapes_per_size": args.scrapes,
            "live_jobs": LIVE_LOAD,
            "client": "one httpx.Client, sequential scrapes, keep-alive",
            "load_average_at_end": os.getloadavg(),
        },
        results={
            "sizes": rows,
            "median_ratio_largest_to_empty": flat,
            "scrape_minus_healthz_ms_by_size": extra,
        },
    )
    path = write_result(record, args.out)
    print(f"median scrape, largest history / none: {flat:.2f}; over /healthz (ms): {extra}")
    print(f"written to {path}")
    return record


if __name__ == "__main__":
    main()
