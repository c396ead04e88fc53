"""One procrastinate drain, run by bench.compare.compare in its own virtualenv.

    python bench/compare/_procrastinate.py URL JOBS CONCURRENCY [--install]

Pre-loads JOBS no-op jobs with ``Task.batch_defer_async`` (procrastinate's
bulk defer: one statement), then runs one worker in this process with
``run_worker_async(wait=False)`` (it returns once the queue is empty) and the
given concurrency, its connection pool sized to match. Prints one JSON line:
the rate from procrastinate's own event log (first 'started' event to the last
'succeeded' event, database clock), and the wall-clock times.

Self-contained on purpose: pgqueue is not installed in this virtualenv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from importlib import metadata

import psycopg
from procrastinate import App, PsycopgConnector


async def main(url: str, jobs: int, concurrency: int, install: bool) -> dict[str, object]:
    # One connection per concurrent job, one for LISTEN, one spare (heartbeats).
    connector = PsycopgConnector(conninfo=url, min_size=1, max_size=concurrency + 2)
    app = App(connector=connector)

    @app.task(name="noop", queue="bench")  # type: ignore[untyped-decorator]
    async def noop() -> None:
        return None

    async with app.open_async():
        if install:
            await app.schema_manager.apply_schema_async()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers CASCADE"
            )
            conn.execute("VACUUM ANALYZE procrastinate_jobs")
        started = time.perf_counter()
        await noop.batch_defer_async(*({} for _ in range(jobs)))
        enqueue_seconds = time.perf_counter() - started
        started = time.perf_counter()
        await app.run_worker_async(
            queues=["bench"],
            concurrency=concurrency,
            wait=False,
            listen_notify=True,
            install_signal_handlers=False,
            delete_jobs="never",
        )
        drain_seconds = time.perf_counter() - started
        row = await connector.execute_query_one_async(
            "SELECT count(*) FILTER (WHERE type = 'succeeded') AS done, "
            "extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded') "
            "- min(at) FILTER (WHERE type = 'started'))::float8 AS seconds "
            "FROM procrastinate_events"
        )
    done, seconds = row["done"], row["seconds"]
    if done != jobs:
        raise SystemExit(f"only {done} of {jobs} procrastinate jobs succeeded")
    return {
        "system": "procrastinate",
        "version": metadata.version("procrastinate"),
        "jobs": jobs,
        "rate_db": jobs / seconds,
        "rate_wall": jobs / drain_seconds,
        "enqueue_per_second": jobs / enqueue_seconds,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("jobs", type=int)
    parser.add_argument("concurrency", type=int)
    parser.add_argument("--install", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(asyncio.run(main(args.url, args.jobs, args.concurrency, args.install))))
