"""How soon a cancel stops a running handler: from the cancel's commit to
the handler's cancellation, both on the database clock.

    python -m bench.perf.cancel_latency [--jobs 200] [--pause 0.02] [--out PATH]

On a fresh server on disk (fsync and synchronous_commit on, and
``track_commit_timestamp`` on: a DATABASE_URL server needs it too), one worker process (forked, an
``AsyncWorker`` with LISTEN on, as by default) holds JOBS running jobs, each
an async handler waiting for ever. Its heartbeat is a minute apart, so that
only the cancel's notice can stop a handler within the run. Then, from
another connection, each job is cancelled with ``Queue.cancel``, one at a
time, PAUSE seconds apart (the worker idle in between); the next waits
until the handler said it was cancelled. The handler's ``CancelledError``
path writes ``clock_timestamp()`` for its job; latency = that time minus the
commit timestamp of the cancel's transaction (the row's xmin: nothing writes
the row after the cancel). So it counts the commit's WAL flush, the
notification's delivery, the worker's reading it, the task's cancellation,
and the handler's own INSERT reaching the server. Writes
results/cancel_latency.json.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import time
from multiprocessing.synchronize import Event
from typing import Any

import psycopg

from bench.common import bench_database, percentiles_ms
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import stop, wait_connected
from pgqueue import Job, Queue, Settings
from pgqueue.worker import AsyncWorker

TASK = "wait_for_cancel"
CHANNEL = "bench_cancel_observed"
SETUP = "CREATE TABLE bench_cancel_observed (job_id bigint PRIMARY KEY, at timestamptz)"
# The handler's record, and a word to the bench that it is there.
OBSERVED = (
    "WITH seen AS (INSERT INTO bench_cancel_observed VALUES (%s, clock_timestamp()) "
    "RETURNING job_id) SELECT pg_notify('bench_cancel_observed', job_id::text) FROM seen"
)
LATENCIES = (
    "SELECT extract(epoch FROM o.at - pg_xact_commit_timestamp(j.xmin))::float8 * 1000 "
    "FROM bench_cancel_observed o JOIN pgqueue_jobs j ON j.id = o.job_id ORDER BY 1"
)
HEARTBEAT_SECONDS = 60.0
# How long one cancel may take before the run is called failed.
CANCEL_TIMEOUT = 30.0


async def _hold(url: str, jobs: int, done: Event) -> None:
    """The worker process's body: a worker whose handlers wait until
    cancelled, then record when (one connection of their own)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        one_at_a_time = asyncio.Lock()

        async def wait_for_cancel(job: Job) -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                async with one_at_a_time:
                    await conn.execute(OBSERVED, (job.id,))
                raise

        settings = Settings(
            database_url=url,
            concurrency=jobs,
            heartbeat_seconds=HEARTBEAT_SECONDS,
            lease_seconds=5 * HEARTBEAT_SECONDS,
        )
        worker = AsyncWorker({TASK: wait_for_cancel}, settings=settings, name="cancel-latency")
        running = asyncio.create_task(worker.run())
        await asyncio.to_thread(done.wait)
        await worker.stop()
        await running


def _worker(url: str, jobs: int, done: Event) -> None:
    asyncio.run(_hold(url, jobs, done))


def _wait_running(conn: psycopg.Connection[Any], jobs: int) -> None:
    deadline = time.monotonic() + 60
    query = "SELECT count(*) FROM pgqueue_jobs WHERE state = 'running'"
    while (row := conn.execute(query).fetchone()) is None or row[0] < jobs:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {row and row[0]} of {jobs} jobs started")
        time.sleep(0.05)


def measure(url: str, jobs: int, pause: float) -> dict[str, float]:
    """Cancel ``jobs`` running jobs one by one; the latencies' summary in ms."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW track_commit_timestamp").fetchone()
        if row != ("on",):
            raise RuntimeError(
                "the server needs track_commit_timestamp on (unset DATABASE_URL: the bench "
                "starts a server of its own with it)"
            )
        conn.execute(SETUP)
    # Forked before this process opens the connections below, which the
    # child must not share.
    ctx = mp.get_context("fork")
    done = ctx.Event()
    proc = ctx.Process(target=_worker, args=(url, jobs, done), daemon=True)
    proc.start()
    try:
        wait_connected(url, 1)
        with (
            psycopg.connect(url, autocommit=True) as conn,
            Queue(url, settings=Settings(database_url=url, pool_max_size=1)) as q,
        ):
            conn.execute(f"LISTEN {CHANNEL}")
            ids = [e.id for e in q.enqueue_many([{"task": TASK}] * jobs)]
            _wait_running(conn, jobs)
            time.sleep(1.0)  # every handler started; the worker idle
            for job_id in ids:
                q.cancel(job_id)
                _observed(conn, job_id)
                time.sleep(pause)
    finally:
        stop([proc], done)
    with psycopg.connect(url, autocommit=True) as conn:
        ms = [row[0] for row in conn.execute(LATENCIES).fetchall()]
    if len(ms) != jobs:
        raise RuntimeError(f"{len(ms)} of {jobs} cancellations observed")
    return percentiles_ms(ms)


def _observed(conn: psycopg.Connection[Any], job_id: int) -> None:
    """Until the handler of ``job_id`` has recorded its cancellation."""
    for note in conn.notifies(timeout=CANCEL_TIMEOUT):
        if note.payload == str(job_id):
            return
    raise RuntimeError(f"job {job_id}: its handler was not cancelled in {CANCEL_TIMEOUT} s")


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--pause", type=float, default=0.02)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    started = time.monotonic()
    with bench_database("cancel_latency", {"track_commit_timestamp": "on"}) as url:
        info = server_info(url)
        results = measure(url, args.jobs, args.pause)
    elapsed = time.monotonic() - started
    record = ResultRecord(
        name="cancel_latency",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "jobs": args.jobs,
            "pause_seconds": args.pause,
            "worker": f"1 AsyncWorker process, LISTEN on, concurrency {args.jobs}, "
            f"heartbeat every {HEARTBEAT_SECONDS:g} s (no heartbeat falls in the run)",
            "latency": "the handler's clock_timestamp() in its CancelledError path minus "
            "pg_xact_commit_timestamp of the cancel (database clock)",
            "machine_state": "shared, not idle: other agents' builds, tests and benchmarks "
            "ran on the same cores during the run (load averages below)",
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
        },
        results={"elapsed_seconds": elapsed, "latency_ms": results},
    )
    path = write_result(record, args.out)
    print(
        f"cancel to handler cancelled, {args.jobs} jobs: p50 {results['p50_ms']:.2f}  "
        f"p95 {results['p95_ms']:.2f}  p99 {results['p99_ms']:.2f}  "
        f"max {results['max_ms']:.2f} ms (load {load_before[0]:.1f})\n"
        f"{elapsed:,.0f} s; written to {path}"
    )
    return record


if __name__ == "__main__":
    main()
