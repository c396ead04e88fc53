"""Soak: steady enqueue and drain with retention on, for minutes.

    python -m bench.faults.soak [--minutes 10] [--rate 50] [--workers 2] [--concurrency 8]
                                [--log-dir DIR] [--out PATH]

A fresh server on disk with default durability (fsync and synchronous_commit
on; or DATABASE_URL). ``--workers`` ``pgqueue worker`` processes run the
fault handlers (``harness.fault_tasks``: a delivery row, then 10-50 ms of
work); this process enqueues ``--rate`` jobs per second in small batches.
Retention is short (finished jobs are pruned after 20 s, the pruner runs
every 2 s), so the jobs table should stay the same size however long it
runs. Every 10 s a sample records: the jobs table's size
(pg_total_relation_size, with indexes and TOAST), its live rows, each
worker's RSS, and the claim latency (started_at - run_at, p50/p95) of the
jobs started in the last 10 s.

At the end: production stops, the backlog drains, the workers are stopped
with SIGTERM, and ``harness.invariants`` checks that every enqueued job was
delivered and counted as succeeded, pruned or not. The report gives the
median of each figure per minute, and compares the second minute (the first
at steady state: the first one fills the retention window) with the last.

Writes results/soak.json.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.common import bench_database
from bench.record import ResultRecord, command_line, server_info, write_result
from harness.fault_tasks import create_deliveries, scalar, spawn_worker, stop_worker, wait_for
from harness.invariants import check
from pgqueue import Queue, Settings

SAMPLE_SECONDS = 10.0
WORKER_SETTINGS: dict[str, Any] = {
    "lease_seconds": 10,
    "heartbeat_seconds": 2,
    "reap_interval_seconds": 2,
    "retention_seconds": 20,
    "prune_interval_seconds": 2,
    "poll_interval_seconds": 0.5,
}


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def sample(url: str, pids: list[int], elapsed: float) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        size, rows = conn.execute(
            "SELECT pg_total_relation_size('pgqueue_jobs'), count(*) FROM pgqueue_jobs"
        ).fetchone()  # type: ignore[misc]
        p50, p95, n = conn.execute(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s),"
            " percentile_cont(0.95) WITHIN GROUP (ORDER BY s), count(*)"
            " FROM (SELECT extract(epoch FROM started_at - run_at)::float8 AS s"
            "       FROM pgqueue_jobs WHERE started_at > now() - make_interval(secs => %s)) x",
            (SAMPLE_SECONDS,),
        ).fetchone()  # type: ignore[misc]
        queued = conn.execute(
            "SELECT count(*) FROM pgqueue_jobs WHERE state IN ('queued', 'running')"
        ).fetchone()[0]  # type: ignore[index]
    return {
        "t": round(elapsed, 1),
        "jobs_table_bytes": int(size),
        "jobs_rows": int(rows),
        "backlog": int(queued),
        "worker_rss_kib": [rss_kib(pid) for pid in pids],
        "claim_latency_p50_ms": None if p50 is None else round(p50 * 1000, 2),
        "claim_latency_p95_ms": None if p95 is None else round(p95 * 1000, 2),
        "started_in_window": int(n),
    }


def _window(samples: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float | None:
        values = [s[key] for s in samples if s[key] is not None]
        return round(statistics.median(values), 2) if values else None

    return {
        "samples": len(samples),
        "jobs_table_bytes": med("jobs_table_bytes"),
        "jobs_rows": med("jobs_rows"),
        "worker_rss_kib_total": round(
            statistics.median(sum(s["worker_rss_kib"]) for s in samples), 0
        ),
        "claim_latency_p50_ms": med("claim_latency_p50_ms"),
        "claim_latency_p95_ms": med("claim_latency_p95_ms"),
    }


def run(
    url: str,
    *,
    seconds: float,
    rate: float = 50.0,
    workers: int = 2,
    concurrency: int = 8,
    log_dir: str | None = None,
) -> dict[str, Any]:
    """Soak the database at ``url`` (migrated, empty); return the report."""
    create_deliveries(url)
    logs = []
    procs = []
    for i in range(workers):
        log = open(Path(log_dir) / f"soak-worker-{i}.log", "wb") if log_dir else None  # noqa: SIM115
        logs.append(log)
        procs.append(
            spawn_worker(
                url,
                concurrency=concurrency,
                log=log or subprocess.DEVNULL,
                **WORKER_SETTINGS,
            )
        )
    pids = [p.pid for p in procs]
    enqueued: list[int] = []
    samples: list[dict[str, Any]] = []
    batch = max(1, round(rate / 10))  # ten batches a second
    settings = Settings(database_url=url)
    started = time.monotonic()
    try:
        with Queue(url, settings=settings) as q:
            next_batch = started
            next_sample = started + SAMPLE_SECONDS
            while (now := time.monotonic()) - started < seconds:
                if now >= next_batch:
                    results = q.enqueue_many(
                        [
                            {"task": "work", "payload": {"n": len(enqueued) + i}}
                            for i in range(batch)
                        ]
                    )
                    enqueued.extend(r.id for r in results)
                    next_batch += batch / rate
                if now >= next_sample:
                    samples.append(sample(url, pids, now - started))
                    next_sample += SAMPLE_SECONDS
                    dead = [p.pid for p in procs if p.poll() is not None]
                    if dead:
                        raise RuntimeError(f"worker processes exited early: {dead}")
                time.sleep(max(0.0, min(next_batch, next_sample) - time.monotonic()))
        produced_for = time.monotonic() - started
        if not samples:  # a run shorter than one sample interval still reports one
            samples.append(sample(url, pids, produced_for))
        total = len(enqueued)
        # Drain: every enqueued job succeeded (counters survive pruning).
        wait_for(
            lambda: (
                scalar(url, "SELECT coalesce(sum(succeeded), 0) FROM pgqueue_counters") >= total
            ),
            timeout=120,
            interval=0.5,
        )
        drained_after = time.monotonic() - started - produced_for
    finally:
        codes = [stop_worker(p) for p in procs]
        for log in logs:
            if log:
                log.close()
    report = check(url, enqueued_ids=enqueued, pruned=True)
    delivered = scalar(url, "SELECT count(DISTINCT job_id) FROM fault_deliveries")
    per_minute = max(1, round(60 / SAMPLE_SECONDS))
    minutes = [samples[i : i + per_minute] for i in range(0, len(samples), per_minute)]
    # The first minute includes filling the retention window; the second is
    # the first at steady state, when there is one.
    first = minutes[1] if len(minutes) > 2 else minutes[0]
    last = minutes[-1]
    return {
        "parameters": {
            "seconds": seconds,
            "rate_per_second": rate,
            "worker_processes": workers,
            "concurrency": concurrency,
            "worker_settings": WORKER_SETTINGS,
            "sample_seconds": SAMPLE_SECONDS,
        },
        "jobs_enqueued": total,
        "jobs_succeeded_counter": report.counters["succeeded"],
        "jobs_delivered": delivered,
        "jobs_lost": total - delivered,
        "jobs_pruned": total - report.jobs,
        "jobs_left_in_table": report.jobs,
        "drain_seconds_after_production": round(drained_after, 2),
        "worker_exit_codes": codes,
        "start": _window(first),
        "start_is_minute": 2 if len(minutes) > 2 else 1,
        "end": _window(last),
        "per_minute": [_window(m) for m in minutes],
        "samples": samples,
        "invariants": report.as_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=50.0, help="jobs enqueued per second")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--log-dir", default=None, help="keep each worker's log here")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    with bench_database("soak") as url:
        server = server_info(url)
        result = run(
            url,
            seconds=args.minutes * 60,
            rate=args.rate,
            workers=args.workers,
            concurrency=args.concurrency,
            log_dir=args.log_dir,
        )
    record = ResultRecord.from_report("soak", command_line(__spec__, argv), server, result)
    path = write_result(record, args.out)
    s, e = result["start"], result["end"]
    print(
        f"soak {args.minutes:g} min: {result['jobs_enqueued']} jobs, lost {result['jobs_lost']}, "
        f"table {s['jobs_table_bytes']} -> {e['jobs_table_bytes']} bytes, "
        f"RSS {s['worker_rss_kib_total']} -> {e['worker_rss_kib_total']} KiB, "
        f"claim p50 {s['claim_latency_p50_ms']} -> {e['claim_latency_p50_ms']} ms, "
        f"invariants {'ok' if result['invariants']['ok'] else 'BROKEN'} -> {path}"
    )
    return 0 if result["invariants"]["ok"] and result["jobs_lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
