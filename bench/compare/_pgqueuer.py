"""One PgQueuer drain, run by bench.compare.compare in PgQueuer's own virtualenv.

    python bench/compare/_pgqueuer.py URL JOBS CONSUMERS BATCH_SIZE [--install]

PgQueuer's own benchmark (tools/benchmark.py, "drain" strategy) is the model:
the asyncpg driver, uvloop, CONSUMERS QueueManagers in one process (each on
its own connection), ``run(batch_size=BATCH_SIZE, mode=drain)`` (returns once
the queue is empty), jobs pre-loaded with one list-form ``Queries.enqueue``
call (its bulk enqueue). Prints one JSON line: the rate from PgQueuer's own
log table (first 'picked' row to the last 'successful' row, database clock)
and the wall-clock times.

``--phase load`` only loads (and analyzes) the jobs and ``--phase consume``
only drains them, so that bench.perf.outside_harness can clock worker
processes from their spawn, as an outside harness does. ``--keep``: the load
leaves PgQueuer's tables as they are (no TRUNCATE), for drains one after
another (bench.perf.long_transaction).

Self-contained on purpose: pgqueue is not installed in this virtualenv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from importlib import metadata

import asyncpg
import uvloop
from pgqueuer import AsyncpgDriver, PgQueuer, Queries
from pgqueuer.models import Job
from pgqueuer.types import QueueExecutionMode


async def load(url: str, jobs: int, install: bool, analyze: bool, keep: bool = False) -> float:
    """Empty PgQueuer's tables (unless ``keep``) and enqueue ``jobs`` no-op
    jobs; their rate."""
    admin = await asyncpg.connect(url)
    queries = Queries(AsyncpgDriver(admin))
    if install:
        await queries.install()
    if not keep:
        await admin.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
        await admin.execute("VACUUM ANALYZE pgqueuer")
    started = time.perf_counter()
    await queries.enqueue(["noop"] * jobs, [None] * jobs, [0] * jobs)
    enqueue_seconds = time.perf_counter() - started
    if analyze:
        await admin.execute("VACUUM ANALYZE pgqueuer")
    await admin.close()
    return jobs / enqueue_seconds


async def consume(url: str, consumers: int, batch_size: int) -> float:
    """Drain the queue with ``consumers`` QueueManagers; the seconds it took."""
    managers = []
    for _ in range(consumers):
        pgq = PgQueuer(AsyncpgDriver(await asyncpg.connect(url)))

        @pgq.entrypoint("noop")  # type: ignore[untyped-decorator]
        async def noop(job: Job) -> None:
            return None

        managers.append(pgq)
    started = time.perf_counter()
    await asyncio.gather(
        *(m.run(batch_size=batch_size, mode=QueueExecutionMode.drain) for m in managers)
    )
    return time.perf_counter() - started


async def main(
    url: str, jobs: int, consumers: int, batch_size: int, install: bool
) -> dict[str, object]:
    enqueue_per_second = await load(url, jobs, install, analyze=False)
    drain_seconds = await consume(url, consumers, batch_size)
    admin = await asyncpg.connect(url)
    row = await admin.fetchrow(
        "SELECT count(*) FILTER (WHERE status = 'successful') AS done, "
        "extract(epoch FROM max(created) FILTER (WHERE status = 'successful') "
        "- min(created) FILTER (WHERE status = 'picked'))::float8 AS seconds "
        "FROM pgqueuer_log"
    )
    await admin.close()
    done, seconds = row["done"], row["seconds"]
    if done != jobs:
        raise SystemExit(f"only {done} of {jobs} PgQueuer jobs succeeded")
    return {
        "system": "pgqueuer",
        "version": metadata.version("pgqueuer"),
        "jobs": jobs,
        "rate_db": jobs / seconds,
        "rate_wall": jobs / drain_seconds,
        "enqueue_per_second": enqueue_per_second,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("jobs", type=int)
    parser.add_argument("consumers", type=int)
    parser.add_argument("batch_size", type=int)
    parser.add_argument("--install", action="store_true")
    parser.add_argument("--phase", choices=("all", "load", "consume"), default="all")
    parser.add_argument("--keep", action="store_true", help="load without emptying the tables")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.phase == "load":
        rate = uvloop.run(load(args.url, args.jobs, args.install, analyze=True, keep=args.keep))
        print(json.dumps({"enqueue_per_second": rate}))
    elif args.phase == "consume":
        seconds = uvloop.run(consume(args.url, args.consumers, args.batch_size))
        print(json.dumps({"drain_seconds": seconds}))
    else:
        result = uvloop.run(
            main(args.url, args.jobs, args.consumers, args.batch_size, args.install)
        )
        print(json.dumps(result))
