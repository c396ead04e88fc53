"""pgqueue's worker as the benchmarks run it: no-op handlers, and forked
``AsyncWorker`` processes released together by a barrier once each is built,
so that process start-up is not part of any figure."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import time
from collections.abc import Iterator, Sequence
from multiprocessing.context import ForkProcess
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Barrier, Event

import psycopg

from pgqueue import Queue, Settings
from pgqueue.worker import AsyncWorker

from .common import clear, has_live_jobs, rate
from .handlers import HANDLERS

__all__ = ["HANDLERS", "async_workers", "drain", "stop", "wait_connected", "wait_drained"]

BARRIER_TIMEOUT = 120.0
DRAIN_TIMEOUT = 1800.0


def _async_worker(
    settings: Settings,
    barrier: Barrier,
    done: Event,
    name: str,
    queues: Sequence[str] | None,
    listen: bool,
    task: str,
) -> None:
    """A forked child: an AsyncWorker on the handler HANDLERS[task], working
    from the barrier's release until ``done`` is set."""

    async def main() -> None:
        worker = AsyncWorker(
            {task: HANDLERS[task]}, settings=settings, queues=queues, name=name, listen=listen
        )
        barrier.wait(BARRIER_TIMEOUT)
        runner = asyncio.create_task(worker.run())
        await asyncio.to_thread(done.wait, DRAIN_TIMEOUT)
        await worker.stop()
        await runner

    try:
        asyncio.run(main())
    except BaseException:
        barrier.abort()  # the parent must not wait for a child that died
        raise


@contextlib.contextmanager
def async_workers(
    count: int,
    settings: Settings,
    *,
    name: str,
    queues: Sequence[str] | None = None,
    listen: bool = True,
    task: str = "noop",
) -> Iterator[list[ForkProcess]]:
    """``count`` forked AsyncWorker processes (named NAME-i) on the handler
    HANDLERS[task], released together as the block starts; stopped when it
    ends (killed after 60 s)."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(count + 1)
    done = ctx.Event()
    procs = [
        ctx.Process(
            target=_async_worker,
            args=(settings, barrier, done, f"{name}-{i}", queues, listen, task),
            daemon=True,
        )
        for i in range(count)
    ]
    for proc in procs:
        proc.start()
    try:
        barrier.wait(BARRIER_TIMEOUT)
        yield procs
    finally:
        stop(procs, done)


def stop(procs: Sequence[BaseProcess], done: Event, timeout: float = 60.0) -> None:
    """Tell worker processes to stop (``done``), wait for each, and kill
    whatever is still running after ``timeout`` seconds."""
    done.set()
    for proc in procs:
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()


def wait_connected(url: str, workers: int, *, listen: bool = True, timeout: float = 60.0) -> None:
    """Until ``workers`` worker processes have their claim connections open
    (and LISTEN, unless ``listen`` is off); then half a second more, for
    their first (empty) claims to settle."""
    query = (
        "SELECT count(*) FILTER (WHERE application_name = 'pgqueue-worker'), "
        "count(*) FILTER (WHERE query ILIKE 'LISTEN%%') "
        "FROM pg_stat_activity WHERE datname = current_database()"
    )
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(query).fetchone()
            assert row is not None
            if row[0] >= workers and (not listen or row[1] >= workers):
                time.sleep(0.5)
                return
            time.sleep(0.05)
    raise RuntimeError("the workers did not connect")


def wait_drained(url: str, jobs: int, procs: Sequence[ForkProcess], *, after_id: int = 0) -> None:
    """Until ``jobs`` jobs with ids above ``after_id`` have succeeded; raises
    if every worker died or DRAIN_TIMEOUT passed first."""
    deadline = time.monotonic() + DRAIN_TIMEOUT
    query = "SELECT count(*) FROM pgqueue_jobs WHERE state = 'succeeded' AND id > %s"
    with psycopg.connect(url, autocommit=True) as conn:

        def unfinished() -> bool:
            # The count reads every row. When every job in the table is the
            # drain's (after_id 0), it waits until none is left to run.
            if not after_id and has_live_jobs(conn):
                return True
            row = conn.execute(query, (after_id,)).fetchone()
            return row is None or row[0] < jobs

        while unfinished():
            if time.monotonic() > deadline or not any(p.is_alive() for p in procs):
                raise RuntimeError("the workers did not finish the jobs")
            time.sleep(0.05)


def drain(
    url: str,
    jobs: int,
    *,
    workers: int = 1,
    concurrency: int = 100,
    timings: dict[str, float] | None = None,
    task: str = "noop",
) -> float:
    """Pre-load ``jobs`` jobs of ``task`` (a HANDLERS name), release
    ``workers`` AsyncWorker processes together, return jobs/s (first start
    to last finish, database clock). ``timings`` gets the enqueue_many time."""
    clear(url)
    with Queue(url, settings=Settings(database_url=url, pool_min_size=0, pool_max_size=1)) as q:
        began = time.perf_counter()
        q.enqueue_many([{"task": task}] * jobs)
        if timings is not None:
            timings["enqueue_seconds"] = time.perf_counter() - began
    settings = Settings(database_url=url, concurrency=concurrency)
    with async_workers(workers, settings, name="bench", task=task) as procs:
        wait_drained(url, jobs, procs)
    codes = [p.exitcode for p in procs]
    if any(codes):
        raise RuntimeError(f"workers exited with {codes}")
    return rate(url, jobs)
