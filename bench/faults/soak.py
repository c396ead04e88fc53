"""Soak: steady open-loop enqueue and drain with retention on, for an hour.

    python -m bench.faults.soak [--minutes 60] [--load 0.5 | --rate R] [--workers 2]
                                [--concurrency 8] [--capacity-jobs 2000]
                                [--row-seconds 60] [--log-dir DIR] [--out PATH]

A fresh server on disk with default durability (fsync and synchronous_commit
on; or DATABASE_URL). ``--workers`` ``pgqueue worker`` processes run the
fault handlers (``harness.fault_tasks``: a delivery row, then 10-50 ms of
work). Retention is short (finished jobs are pruned after 20 s, the pruner
runs every 2 s), so the jobs table should stay the same size however long it
runs.

1. Capacity: ``--capacity-jobs`` jobs enqueued at once and drained by those
   same workers; rate = jobs / (last finish - first start), database clock.
2. Load: this process enqueues ``--load`` x capacity jobs per second (or
   ``--rate``), ten batches a second on a fixed schedule (open loop: a slow
   batch does not delay the next one; how far the producer fell behind is
   reported).
3. Every 10 s the start latencies (started_at - run_at, database clock) of
   the jobs claimed since the last look are collected (before retention can
   prune them); every ``--row-seconds`` (a minute) a row records: completion
   throughput (the succeeded counter's increase over the database clock),
   latency p50/p99/max, the jobs table's size and its indexes' size, live and
   dead tuples (pg_stat_user_tables), the backlog, each worker's RSS, the
   machine's load average (the machine is shared), and the p50/p99/max of a
   one-row commit made every 0.1 s on a connection of its own (the disk's
   commit latency, beside the queue's).
4. Flatness: for each series, the median of the last quarter of the rows
   against the median of the first quarter (the first row, which fills the
   retention window, left out), within the tolerance of FLAT.

At the end production stops, the backlog drains, the workers get SIGTERM,
and ``harness.invariants`` checks that every enqueued job was delivered and
counted as succeeded, pruned or not.

Writes results/soak.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench import common
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import wait_connected
from harness.fault_tasks import create_deliveries, scalar, spawn_worker, stop_worker, wait_for
from harness.invariants import check
from pgqueue import Queue, Settings

SAMPLE_SECONDS = 10.0
# Jobs claimed this long before a look may still be uncommitted; the look
# collects only older claims, so none is missed or counted twice.
CLAIM_SETTLE_SECONDS = 1.0
BATCHES_PER_SECOND = 10
WORKER_SETTINGS: dict[str, Any] = {
    "lease_seconds": 10,
    "heartbeat_seconds": 2,
    "reap_interval_seconds": 2,
    "retention_seconds": 20,
    "prune_interval_seconds": 2,
    "poll_interval_seconds": 0.5,
}


@dataclass(frozen=True)
class Bound:
    """How far a series may move, last quarter against first: by ``relative``
    of the first quarter's median plus ``slack`` (for series that sit near
    zero); ``drop``: a fall counts as well as a rise."""

    relative: float
    slack: float = 0.0
    drop: bool = False

    def holds(self, first: float, last: float) -> bool:
        margin = abs(first) * self.relative + self.slack
        return last <= first + margin and (not self.drop or last >= first - margin)


FLAT: dict[str, Bound] = {
    "throughput_per_second": Bound(0.10, drop=True),
    # A shared machine's neighbours move the tail; a leak or bloat moves it more.
    "latency_p99_ms": Bound(0.50, slack=5.0),
    "jobs_table_bytes": Bound(0.25, slack=256 * 1024),
    "jobs_index_bytes": Bound(0.25, slack=256 * 1024),
    # Autovacuum resets dead tuples in steps; its threshold is 1,000 + 1 %.
    "dead_tuples": Bound(1.0, slack=2000),
    "worker_rss_kib": Bound(0.10, slack=2048),
}


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _percentile(ordered: list[float], fraction: float) -> float | None:
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 2)


TABLE_QUERY = """
SELECT pg_table_size('pgqueue_jobs'), pg_indexes_size('pgqueue_jobs'),
       n_live_tup, n_dead_tup,
       (SELECT count(*) FROM pgqueue_jobs),
       (SELECT count(*) FROM pgqueue_jobs WHERE state IN ('queued', 'running')),
       (SELECT coalesce(sum(succeeded), 0)::bigint FROM pgqueue_counters),
       extract(epoch FROM now())::float8
FROM pg_stat_user_tables WHERE relname = 'pgqueue_jobs'
"""
TABLE_KEYS = (
    "jobs_table_bytes",
    "jobs_index_bytes",
    "live_tuples",
    "dead_tuples",
    "jobs_rows",
    "backlog",
    "succeeded",
    "db_time",
)
# Each index of the jobs table, by name: which one grows, if the sum does.
INDEX_QUERY = """
SELECT coalesce(jsonb_object_agg(indexrelid::regclass::text, pg_relation_size(indexrelid)), '{}')
FROM pg_index WHERE indrelid = 'pgqueue_jobs'::regclass
"""
LATENCY_QUERY = """
SELECT extract(epoch FROM started_at - run_at)::float8 * 1000
FROM pgqueue_jobs
WHERE started_at > to_timestamp(%(since)s) AND started_at <= to_timestamp(%(until)s)
"""


# The machine's own commit latency, beside the queue: a one-row update
# committed on a connection of its own every PROBE_SECONDS. A minute whose
# start latencies jump while these commits stall was slowed by the disk, not
# by the queue.
PROBE_SECONDS = 0.1
PROBE_DDL = """
CREATE TABLE IF NOT EXISTS soak_probe (id integer PRIMARY KEY, at timestamptz);
INSERT INTO soak_probe VALUES (1, now()) ON CONFLICT (id) DO NOTHING
"""


class CommitProbe:
    """Time a small commit every PROBE_SECONDS on a thread; ``take()`` hands
    over the durations (ms) measured since the last take."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(PROBE_DDL)
        self._durations: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="commit-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(PROBE_SECONDS):
                began = time.perf_counter()
                self.conn.execute("UPDATE soak_probe SET at = now() WHERE id = 1")
                with self._lock:
                    self._durations.append((time.perf_counter() - began) * 1000)
        except BaseException as exc:  # raised again by take(), on the main thread
            self._error = exc

    def take(self) -> list[float]:
        self._raise_failure()
        with self._lock:
            taken, self._durations = self._durations, []
        return taken

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.conn.close()
        self._raise_failure()  # a failure after the last row's take

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise RuntimeError("the commit probe failed") from self._error


class Recorder:
    """The per-minute rows, read from the database (one connection) and
    /proc: latencies are gathered every SAMPLE_SECONDS, a row is closed
    every ``row_seconds``."""

    def __init__(self, url: str, pids: list[int], probe: CommitProbe) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.pids = pids
        self.probe = probe
        self.rows: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.latencies: list[float] = []
        self.enqueued = 0
        self.row_samples = 0  # the samples taken before the current row began
        # Every claim so far (the capacity run's) is committed and left out.
        self.row_began = self._table()
        self.since = self.row_began["db_time"]

    def close(self) -> None:
        self.conn.close()

    def _table(self) -> dict[str, Any]:
        row = self.conn.execute(TABLE_QUERY).fetchone()
        assert row is not None
        return dict(zip(TABLE_KEYS, row, strict=True))

    def sample(self, elapsed: float) -> dict[str, Any]:
        """Gather the latencies of the claims since the last look."""
        table = self._table()
        until = table["db_time"] - CLAIM_SETTLE_SECONDS
        rows = self.conn.execute(LATENCY_QUERY, {"since": self.since, "until": until})
        self.latencies += [r[0] for r in rows.fetchall()]
        self.since = until
        taken = {
            "t": round(elapsed, 1),
            "jobs_rows": int(table["jobs_rows"]),
            "backlog": int(table["backlog"]),
            "worker_rss_kib": [rss_kib(pid) for pid in self.pids],
        }
        self.samples.append(taken)
        return table

    def row(self, elapsed: float, producer_behind: float) -> dict[str, Any]:
        """Close the current row (after a last sample)."""
        table = self.sample(elapsed)
        began = self.row_began
        seconds = table["db_time"] - began["db_time"]
        ordered = sorted(self.latencies)
        commits = sorted(self.probe.take())
        row = {
            "minute": len(self.rows) + 1,
            "t": round(elapsed, 1),
            "jobs_enqueued": self.enqueued,
            "throughput_per_second": round((table["succeeded"] - began["succeeded"]) / seconds, 2),
            "jobs_started": len(ordered),
            "latency_p50_ms": _percentile(ordered, 0.50),
            "latency_p99_ms": _percentile(ordered, 0.99),
            "latency_max_ms": round(ordered[-1], 2) if ordered else None,
            **{k: int(v) for k, v in table.items() if k not in ("succeeded", "db_time")},
            "index_bytes": self._index_sizes(),
            "backlog_max": max(taken["backlog"] for taken in self.samples[self.row_samples :]),
            "worker_rss_kib": sum(self.samples[-1]["worker_rss_kib"]),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "producer_behind_max_seconds": round(producer_behind, 3),
            "probe_commit_p50_ms": _percentile(commits, 0.50),
            "probe_commit_p99_ms": _percentile(commits, 0.99),
            "probe_commit_max_ms": round(commits[-1], 2) if commits else None,
        }
        self.rows.append(row)
        self.row_began, self.latencies, self.enqueued = table, [], 0
        self.row_samples = len(self.samples)
        return row

    def _index_sizes(self) -> dict[str, int]:
        sizes = self.conn.execute(INDEX_QUERY).fetchone()
        assert sizes is not None
        return dict(sizes[0])


def flatness(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each FLAT series: first-quarter median, last-quarter median, and
    whether the change is within its bound. The first row (filling the
    retention window) is left out when there are at least five."""
    steady = rows[1:] if len(rows) >= 5 else rows
    quarter = max(1, len(steady) // 4)
    series: dict[str, Any] = {}
    for key, bound in FLAT.items():
        values = [r[key] for r in steady if r[key] is not None]
        if not values:
            continue
        first = statistics.median(values[:quarter])
        last = statistics.median(values[-quarter:])
        series[key] = {
            "first_quarter_median": first,
            "last_quarter_median": last,
            "ratio": round(last / first, 3) if first else None,
            "tolerance": f"+{bound.relative:.0%}" if not bound.drop else f"±{bound.relative:.0%}",
            "slack": bound.slack,
            "flat": bound.holds(first, last),
        }
    return {
        "rows_compared": quarter,
        "rows_compared_of": len(steady),
        "series": series,
        "flat": all(s["flat"] for s in series.values()),
    }


def _succeeded(url: str) -> int:
    return int(scalar(url, "SELECT coalesce(sum(succeeded), 0) FROM pgqueue_counters"))


def _jobs(first: int, count: int) -> list[dict[str, Any]]:
    return [{"task": "work", "payload": {"n": first + i}} for i in range(count)]


def measure_capacity(url: str, q: Queue, jobs: int, enqueued: list[int]) -> float:
    """Jobs/s of the running workers on ``jobs`` jobs enqueued at once."""
    before = _succeeded(url)
    ids = [r.id for r in q.enqueue_many(_jobs(len(enqueued), jobs))]
    enqueued += ids
    wait_for(lambda: _succeeded(url) >= before + jobs, timeout=600, interval=0.1)
    # Before retention (20 s) can prune any of them.
    return common.rate(url, jobs, after_id=min(ids) - 1)


def produce(
    q: Queue, recorder: Recorder, per_second: float, seconds: float, row_seconds: float
) -> tuple[list[int], float]:
    """Enqueue ``per_second`` on a fixed schedule for ``seconds``, recording
    as it goes; returns the ids and how far behind the schedule the producer
    fell at worst (seconds)."""
    ids: list[int] = []
    batch = max(1, round(per_second / BATCHES_PER_SECOND))
    started = time.monotonic()
    next_batch, behind, row_behind = started, 0.0, 0.0
    next_sample = started + SAMPLE_SECONDS
    next_row = started + row_seconds
    while (now := time.monotonic()) - started < seconds:
        if now >= next_batch:
            row_behind = max(row_behind, now - next_batch)
            ids += [r.id for r in q.enqueue_many(_jobs(len(ids), batch))]
            recorder.enqueued += batch
            next_batch += batch / per_second
        if now >= next_row:
            row = recorder.row(now - started, row_behind)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
            behind, row_behind = max(behind, row_behind), 0.0
            next_row += row_seconds
            next_sample = now + SAMPLE_SECONDS
        elif now >= next_sample:
            recorder.sample(now - started)
            next_sample += SAMPLE_SECONDS
        if recorder.samples and any(rss == 0 for rss in recorder.samples[-1]["worker_rss_kib"]):
            raise RuntimeError("a worker process exited early")
        time.sleep(max(0.0, min(next_batch, next_sample, next_row) - time.monotonic()))
    # The row the end of production falls on (a run shorter than one row
    # still reports one); a stub of less than half a row is left out.
    if not recorder.rows or time.monotonic() - (next_row - row_seconds) >= row_seconds / 2:
        recorder.row(time.monotonic() - started, row_behind)
    return ids, max(behind, row_behind)


def start_workers(
    url: str,
    workers: int,
    concurrency: int,
    logs: ExitStack,
    log_dir: str | None,
    settings: dict[str, Any],
) -> list[subprocess.Popen[bytes]]:
    """``pgqueue worker`` processes on the fault handlers with ``settings``
    (each one's log in ``log_dir``, when given, closed by ``logs``)."""
    procs = []
    for i in range(workers):
        log: Any = subprocess.DEVNULL
        if log_dir:
            log = logs.enter_context((Path(log_dir) / f"soak-worker-{i}.log").open("wb"))
        procs.append(spawn_worker(url, concurrency=concurrency, log=log, **settings))
    return procs


def run(
    url: str,
    *,
    seconds: float,
    rate: float | None = None,
    load: float = 0.5,
    workers: int = 2,
    concurrency: int = 8,
    capacity_jobs: int = 2000,
    row_seconds: float = 60.0,
    log_dir: str | None = None,
    worker_settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Soak the database at ``url`` (migrated, empty) at ``rate`` jobs/s, or
    at ``load`` x the measured capacity; return the report. The workers run
    with WORKER_SETTINGS, overridden by ``worker_settings`` (a short run
    shortens retention, so that it spans several retention windows)."""
    settings = {**WORKER_SETTINGS, **(worker_settings or {})}
    create_deliveries(url)
    enqueued: list[int] = []
    capacity = None
    with ExitStack() as logs:
        procs = start_workers(url, workers, concurrency, logs, log_dir, settings)
        try:
            wait_connected(url, workers)
            with Queue(url, settings=Settings(database_url=url)) as q:
                if rate is None:
                    capacity = measure_capacity(url, q, capacity_jobs, enqueued)
                    rate = load * capacity
                with (
                    closing(CommitProbe(url)) as probe,
                    closing(Recorder(url, [p.pid for p in procs], probe)) as recorder,
                ):
                    ids, behind = produce(q, recorder, rate, seconds, row_seconds)
            enqueued += ids
            began = time.monotonic()
            # Drain: every enqueued job succeeded (counters survive pruning).
            wait_for(lambda: _succeeded(url) >= len(enqueued), timeout=300, interval=0.5)
            drained_after = time.monotonic() - began
        finally:
            codes = [stop_worker(p) for p in procs]
    report = check(url, enqueued_ids=enqueued, pruned=True)
    delivered = scalar(url, "SELECT count(DISTINCT job_id) FROM fault_deliveries")
    rows = recorder.rows
    flat = flatness(rows)
    steady, quarter = len(rows) - flat["rows_compared_of"], flat["rows_compared"]
    return {
        "parameters": {
            "seconds": seconds,
            "rate_per_second": round(rate, 2),
            "load": load if capacity is not None else None,
            "worker_processes": workers,
            "concurrency": concurrency,
            "capacity_jobs": capacity_jobs if capacity is not None else None,
            "worker_settings": settings,
            "sample_seconds": SAMPLE_SECONDS,
            "row_seconds": row_seconds,
        },
        "capacity_jobs_per_second": capacity,
        "producer_behind_max_seconds": round(behind, 3),
        "jobs_enqueued": len(enqueued),
        "jobs_succeeded_counter": report.counters["succeeded"],
        "jobs_delivered": delivered,
        "jobs_lost": len(enqueued) - delivered,
        "jobs_pruned": len(enqueued) - report.jobs,
        "jobs_left_in_table": report.jobs,
        "drain_seconds_after_production": round(drained_after, 2),
        "worker_exit_codes": codes,
        "start": _window(rows, steady, quarter),
        "end": _window(rows, len(rows) - quarter, quarter),
        "per_minute": rows,
        "flatness": flat,
        "samples": recorder.samples,
        "invariants": report.as_dict(),
    }


def _window(rows: list[dict[str, Any]], first: int, count: int) -> dict[str, Any]:
    """Medians of ``count`` rows from index ``first``."""
    span = rows[first : first + count]
    medians = {
        key: statistics.median(v) if (v := [r[key] for r in span if r[key] is not None]) else None
        for key in FLAT
    }
    return {"minutes": [r["minute"] for r in span], **medians}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--load", type=float, default=0.5, help="fraction of measured capacity")
    parser.add_argument("--rate", type=float, default=None, help="jobs/s (skips the capacity)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--capacity-jobs", type=int, default=2000)
    parser.add_argument("--row-seconds", type=float, default=60.0)
    parser.add_argument("--log-dir", default=None, help="keep each worker's log here")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    with common.bench_database("soak") as url:
        server = server_info(url)
        result = run(
            url,
            seconds=args.minutes * 60,
            rate=args.rate,
            load=args.load,
            workers=args.workers,
            concurrency=args.concurrency,
            capacity_jobs=args.capacity_jobs,
            row_seconds=args.row_seconds,
            log_dir=args.log_dir,
        )
    record = ResultRecord.from_report("soak", command_line(__spec__, argv), server, result)
    path = write_result(record, args.out)
    s, e, flat = result["start"], result["end"], result["flatness"]
    print(
        f"soak {args.minutes:g} min at {result['parameters']['rate_per_second']} jobs/s "
        f"(capacity {result['capacity_jobs_per_second']}): {result['jobs_enqueued']} jobs, "
        f"lost {result['jobs_lost']}, p99 {s['latency_p99_ms']} -> {e['latency_p99_ms']} ms, "
        f"table {s['jobs_table_bytes']} -> {e['jobs_table_bytes']} bytes, "
        f"RSS {s['worker_rss_kib']} -> {e['worker_rss_kib']} KiB, "
        f"{'flat' if flat['flat'] else 'NOT flat'}, "
        f"invariants {'ok' if result['invariants']['ok'] else 'BROKEN'} -> {path}"
    )
    return 0 if result["invariants"]["ok"] and result["jobs_lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
