"""What every benchmark shares: where results go and what they record."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg

RESULTS = Path(__file__).resolve().parent.parent / "results"


def machine() -> dict[str, Any]:
    """The machine and software a figure was measured on."""
    mem_kb = 0
    try:
        with open("/proc/meminfo") as f:
            mem_kb = int(f.readline().split()[1])
    except OSError:
        pass
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), ""
            )
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "psycopg": metadata.version("psycopg"),
        "pgqueue_commit": _git_commit(),
    }


def server_info(url: str) -> dict[str, Any]:
    """PostgreSQL version and the settings that decide commit cost."""
    names = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "shared_buffers")
    with psycopg.connect(url) as conn:
        return {n: conn.execute(f"SHOW {n}").fetchone()[0] for n in names}  # type: ignore[index]


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def summary(values: list[float]) -> dict[str, float]:
    """Median with min and max: the machines are shared and noisy."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def write_result(name: str, payload: dict[str, Any], out: str | None = None) -> Path:
    """Write results/NAME.json with the machine description and a timestamp."""
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        **payload,
    }
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


@contextlib.contextmanager
def bench_database(name: str = "bench") -> Iterator[str]:
    """A fresh, migrated database on a server with PostgreSQL's default
    durability (fsync and synchronous_commit on), on disk, for one run.

    DATABASE_URL, when set, is used instead (the database must be empty or
    disposable: its pgqueue tables are truncated)."""
    from pgqueue import migrate
    from pgqueue.embedded import EmbeddedPostgres

    if os.environ.get("DATABASE_URL"):
        url = os.environ["DATABASE_URL"]
        migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("TRUNCATE pgqueue_jobs, pgqueue_counters, pgqueue_start_latency")
        yield url
        return
    folder = tempfile.mkdtemp(
        prefix=f"pgqueue-{name}-", dir=os.environ.get("BENCH_DIR", "/var/tmp")
    )
    server = EmbeddedPostgres(folder)
    try:
        url = server.ensure_running()
        migrate(url)
        yield url
    finally:
        server.destroy()


def add_finished_jobs(queue: Any, count: int, queue_name: str = "history") -> None:
    """``count`` finished jobs made the way production makes them (enqueued,
    claimed, acked), so that the table's pages look like a real history's. A
    bulk INSERT of finished rows is faster but leaves different pages (see
    bench.fillfactor)."""
    from pgqueue import Outcome

    for start in range(0, count, 50_000):
        size = min(50_000, count - start)
        queue.enqueue_many([{"task": "noop", "queue": queue_name} for _ in range(size)])
        while claimed := queue.claim(100, worker="history", queues=[queue_name]):
            queue.finish([Outcome.success(job, None) for job in claimed])


def start_latency_percentiles(url: str, jobs: int) -> dict[str, float]:
    """Enqueue-to-start latency of the succeeded jobs (started_at - run_at,
    the database clock), in ms: p50, p95, p99, max and mean. Raises if fewer
    than ``jobs`` ran."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM started_at - run_at)::float8 * 1000 "
            "FROM pgqueue_jobs WHERE state = 'succeeded' ORDER BY 1"
        ).fetchall()
    ms = [r[0] for r in rows]
    if len(ms) != jobs:
        raise RuntimeError(f"only {len(ms)} of {jobs} jobs ran")
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {
        "p50_ms": q[49],
        "p95_ms": q[94],
        "p99_ms": q[98],
        "max_ms": ms[-1],
        "mean_ms": statistics.fmean(ms),
    }
