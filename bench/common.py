"""What the benchmarks share: a database to run on, and the rate and latency
figures read back from it (the database clock, not the client's)."""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
from collections.abc import Iterator
from typing import Any

import psycopg

from pgqueue import migrate
from pgqueue.db.embedded import EmbeddedPostgres

__all__ = [
    "STATEMENT_HEADS",
    "add_page_cost_option",
    "bench_database",
    "bench_server",
    "clear",
    "has_live_jobs",
    "page_cost_options",
    "rate",
    "reset_database",
    "start_latency_percentiles",
    "summary",
    "warm_wal",
]

# The worker's statements in pg_stat_statements, by the start of their text
# (constants are normalised; the claim's text changed over time, its role
# did not).
STATEMENT_HEADS = {
    "claim": ("WITH wanted AS", "WITH in_one_queue AS"),
    "finish": ("WITH outcome AS",),
}

TRUNCATE = (
    "TRUNCATE pgqueue_jobs, pgqueue_counters, pgqueue_start_latency, pgqueue_enqueued,"
    " pgqueue_history_snapshots, pgqueue_queue_minutes, pgqueue_job_deps, pgqueue_workflows,"
    " pgqueue_job_steps, pgqueue_job_signals, pgqueue_jobs_archive"
)


def summary(values: list[float]) -> dict[str, float]:
    """Median with min and max: the machines are shared and noisy."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


WAL_SEGMENTS_QUERY = (
    "SELECT ceil(pg_size_bytes(current_setting('max_wal_size'))"
    " / pg_size_bytes(current_setting('wal_segment_size')))::int"
)


def warm_wal(url: str) -> int:
    """Have a fresh server make the WAL segments that a server under steady
    load has, then check-point so that it recycles them; returns how many.

    A server creates each 16 MB segment the first time its WAL reaches it,
    zero-filled and fsynced, while the commits behind it wait (30 to 60 ms
    each on this machine); one that has run a while renames old segments
    instead, and one busy enough to check-point by WAL volume cycles through
    max_wal_size of them. A switch after each small write makes one segment
    at a time; the check-point after them sees max_wal_size of WAL since
    the last, so it keeps them all for reuse."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(WAL_SEGMENTS_QUERY).fetchone()
        segments = int(row[0]) if row else 0
        conn.execute("CREATE TABLE bench_wal_warm_up (n int)")
        for n in range(segments):
            conn.execute("INSERT INTO bench_wal_warm_up VALUES (%s)", [n])
            conn.execute("SELECT pg_switch_wal()")
        conn.execute("DROP TABLE bench_wal_warm_up")
        conn.execute("CHECKPOINT")
    return segments


def reset_database(url: str) -> None:
    """Migrate the database at ``url`` and empty it: pgqueue's tables, and
    the delivery rows of an earlier fault run (harness.fault_tasks)."""
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TRUNCATE)
        conn.execute("DROP TABLE IF EXISTS fault_deliveries")


@contextlib.contextmanager
def bench_server(name: str, options: dict[str, str] | None = None) -> Iterator[EmbeddedPostgres]:
    """A fresh embedded server with PostgreSQL's default durability (fsync
    and synchronous_commit on), on disk (BENCH_DIR, default /var/tmp), for
    one run; destroyed after it. ``options``: server settings (-c) besides."""
    folder = tempfile.mkdtemp(
        prefix=f"pgqueue-{name}-", dir=os.environ.get("BENCH_DIR", "/var/tmp")
    )
    server = EmbeddedPostgres(folder, options)
    try:
        server.ensure_running()
        yield server
    finally:
        server.destroy()


@contextlib.contextmanager
def bench_database(
    name: str = "bench", options: dict[str, str] | None = None, *, required: bool = True
) -> Iterator[str]:
    """A migrated database on a fresh bench_server (with ``options``), for one run.

    DATABASE_URL, when set, is used instead (the database must be empty or
    disposable: reset_database empties it); its server must already run with
    ``options``, or the run stops saying which differ (``required`` False:
    the benchmark makes do without them, and the server is taken as it is)."""
    if os.environ.get("DATABASE_URL"):
        url = os.environ["DATABASE_URL"]
        if required and (differ := options_not_in_effect(url, options or {})):
            raise SystemExit(
                f"DATABASE_URL's server does not run with {differ}, which this benchmark "
                "needs: set them on that server, or unset DATABASE_URL to run on a server "
                "of its own"
            )
        reset_database(url)
        yield url
        return
    with bench_server(name, options) as server:
        migrate(server.url)
        yield server.url


def options_not_in_effect(url: str, options: dict[str, str]) -> str:
    """Of the server settings ``options``, those the server at ``url`` runs
    otherwise ("name = wanted (has: value)"), or ""."""
    differ = []
    with psycopg.connect(url) as conn:
        for name, wanted in options.items():
            has = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0]  # type: ignore[index]
            try:
                # The server's own spelling of the wanted value (units, on/true).
                with conn.transaction(force_rollback=True):
                    conn.execute("SELECT set_config(%s, %s, true)", (name, wanted))
                    wanted_as_shown = conn.execute(
                        "SELECT current_setting(%s)", (name,)
                    ).fetchone()[0]  # type: ignore[index]
            except psycopg.Error:  # set at the server's start only: compared as written
                wanted_as_shown = wanted
            if str(wanted_as_shown).lower() != str(has).lower():
                differ.append(f"{name} = {wanted} (has: {has})")
    return ", ".join(differ)


def clear(url: str, *, checkpoint: bool = True) -> None:
    """Empty the tables between two measurements, and VACUUM ANALYZE so that
    the planner sees them empty. ``checkpoint``: also flush, so that each
    measurement starts with the same full-page writes ahead of it."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TRUNCATE)
        conn.execute("VACUUM ANALYZE pgqueue_jobs")
        if checkpoint:
            conn.execute("CHECKPOINT")


# Whether any job is still to run or running: each branch stops at the first
# entry of a partial index. A drain's watcher polls this, not queue_stats or a
# count, which read every row left and took a third of a core from the
# workers being measured (17 ms a poll at 60,000 jobs).
LIVE_JOBS = (
    "SELECT EXISTS (SELECT 1 FROM pgqueue_jobs WHERE state = 'queued')"
    " OR EXISTS (SELECT 1 FROM pgqueue_jobs WHERE state = 'running')"
    " OR EXISTS (SELECT 1 FROM pgqueue_jobs WHERE state = 'waiting')"
)


def has_live_jobs(conn: psycopg.Connection[Any]) -> bool:
    """True while a job is queued (runnable or not), running or waiting."""
    row = conn.execute(LIVE_JOBS).fetchone()
    return bool(row and row[0])


def rate(url: str, jobs: int, *, queue: str | None = None, after_id: int = 0) -> float:
    """Jobs per second from the first start to the last finish (database
    clock), over the succeeded jobs (of ``queue``, with ids above
    ``after_id``); raises unless all ``jobs`` succeeded."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))::float8 "
            "FROM pgqueue_jobs WHERE state = 'succeeded' AND id > %s "
            "AND (%s::text IS NULL OR queue = %s)",
            (after_id, queue, queue),
        ).fetchone()
    assert row is not None
    done, seconds = row
    if done != jobs:
        raise RuntimeError(f"only {done} of {jobs} jobs succeeded")
    return float(done / seconds)


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
    return percentiles_ms(ms)


def percentiles_ms(ms: list[float]) -> dict[str, float]:
    """p50, p95, p99, min, max and mean of latencies in ms, sorted ascending."""
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {
        "p50_ms": q[49],
        "p95_ms": q[94],
        "p99_ms": q[98],
        "min_ms": ms[0],
        "max_ms": ms[-1],
        "mean_ms": statistics.fmean(ms),
    }


def postmaster_pid(conn: psycopg.Connection[Any]) -> int:
    """The server's main process (a server on this host): the parent of
    ``conn``'s backend, read while ``conn`` holds it (a closed connection's
    backend may be gone already)."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(proc_stat(row[0])[1])


def child_pids(pid: int) -> list[int]:
    """The living children of process ``pid`` (Linux), e.g. a server's
    backends."""
    with open(f"/proc/{pid}/task/{pid}/children") as listing:
        return [int(child) for child in listing.read().split()]


TICKS = os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (field 3 on)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def server_cpu_seconds(postmaster: int) -> float:
    """CPU (user + system) of a server on this host so far: the postmaster,
    its ended children (cutime + cstime, collected when it reaps them) and
    its living ones."""
    ticks = sum(int(v) for v in proc_stat(postmaster)[11:15])
    for child in child_pids(postmaster):
        try:
            fields = proc_stat(child)
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended while we looked: the postmaster's cutime has it
        ticks += int(fields[11]) + int(fields[12])
    return ticks / TICKS


def add_page_cost_option(parser: argparse.ArgumentParser) -> None:
    """``--page-cost N``: the bench server's random_page_cost (4 is
    PostgreSQL's default, what a server of the user's own likely has; the
    embedded server's is 1.1). See page_cost_options."""
    parser.add_argument(
        "--page-cost",
        default=None,
        help="the server's random_page_cost (4: PostgreSQL's default; the embedded server's: 1.1)",
    )


def page_cost_options(page_cost: str | None) -> dict[str, str]:
    """The server options for ``--page-cost`` (none without it)."""
    return {"random_page_cost": page_cost} if page_cost else {}
