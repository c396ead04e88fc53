"""Concurrency and rate limits under 8 worker processes (real PostgreSQL).

The running jobs are sampled every 2 ms through each run, and checked again
afterwards, exactly, from the jobs' own start and finish times; the rate
limit is checked over every window of its period that begins at a start.
Each check also asserts that the limit was reached, so that a run too slow
to meet it cannot pass by luck.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg

from bench.workers import stop
from pgqueue import Job, Queue, Settings
from pgqueue.worker import AsyncWorker

PROCESSES = 8
DRAIN_TIMEOUT = 120.0
Row = tuple[Any, ...]


async def work(job: Job) -> None:
    await asyncio.sleep(job.payload.get("seconds", 0))


def _worker_process(url: str, concurrency: int, done: Any) -> None:
    settings = Settings(database_url=url, concurrency=concurrency, poll_interval_seconds=0.5)

    async def main() -> None:
        worker = AsyncWorker({"work": work}, settings=settings)
        runner = asyncio.create_task(worker.run())
        await asyncio.to_thread(done.wait, DRAIN_TIMEOUT)
        await worker.stop()
        await runner

    asyncio.run(main())


@contextlib.contextmanager
def worker_processes(url: str, concurrency: int = 10) -> Iterator[list[Any]]:
    """PROCESSES workers of every queue, each its own process (spawned, so
    that none inherits this process's threads and connections)."""
    ctx = mp.get_context("spawn")
    done = ctx.Event()
    procs = [
        ctx.Process(target=_worker_process, args=(url, concurrency, done), daemon=True)
        for _ in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    try:
        yield procs
    finally:
        stop(procs, done, timeout=30)


class Sampler:
    """Counts the queue's running jobs per key every 2 ms, on a thread of
    its own, until stopped; keeps the highest count of each key and of all."""

    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue = url, queue
        self.peak: Counter[str | None] = Counter()
        self.peak_total = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        query = (
            "SELECT concurrency_key, count(*) FROM pgqueue_jobs "
            "WHERE queue = %s AND state = 'running' GROUP BY 1"
        )
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(query, (self.queue,)).fetchall()
                for key, count in rows:
                    self.peak[key] = max(self.peak[key], count)
                self.peak_total = max(self.peak_total, sum(count for _, count in rows))
                self.samples += 1
                time.sleep(0.002)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def drain(url: str, queue: str, jobs: list[dict[str, Any]]) -> tuple[list[Row], Sampler]:
    """Enqueue ``jobs`` (task work, in ``queue``) while PROCESSES workers
    run, sampled; once all succeeded, return (key, started_at, finished_at,
    attempts) of each, and the sampler."""
    with Queue(url, settings=Settings(database_url=url)) as q:
        with worker_processes(url) as procs, Sampler(url, queue) as sampler:
            time.sleep(1.0)  # the workers start (and find nothing)
            q.enqueue_many([{"task": "work", "queue": queue, **job} for job in jobs])
            deadline = time.monotonic() + DRAIN_TIMEOUT
            while _succeeded(url, queue) < len(jobs):
                assert time.monotonic() < deadline and all(p.is_alive() for p in procs)
                time.sleep(0.05)
        assert sampler.samples > 100
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT concurrency_key, started_at, finished_at, attempts FROM pgqueue_jobs "
            "WHERE queue = %s ORDER BY started_at",
            (queue,),
        ).fetchall()
    return rows, sampler


def _succeeded(url: str, queue: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pgqueue_jobs WHERE queue = %s AND state = 'succeeded'", (queue,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals [start, end) that overlap at any moment."""
    edges = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    running = peak = 0
    for _, step in edges:  # an end sorts before a start at the same moment
        running += step
        peak = max(peak, running)
    return peak


def most_in_a_window(starts: list[datetime], period: timedelta) -> int:
    """The most starts within any [t, t + period) that begins at a start."""
    starts = sorted(starts)
    return max(sum(1 for s in starts[i:] if s < t + period) for i, t in enumerate(starts))


def test_the_concurrency_limit_holds_across_8_worker_processes(db_url: str) -> None:
    limit = 4
    with Queue(db_url, settings=Settings(database_url=db_url)) as q:
        q.set_limits("limited", concurrency_limit=limit)
    jobs = [{"payload": {"seconds": 0.01 + i % 7 / 200}} for i in range(300)]
    rows, sampler = drain(db_url, "limited", jobs)
    assert sampler.peak_total == limit  # reached, never passed
    assert most_at_once([(start, end) for _, start, end, _ in rows]) == limit
    assert {attempts for *_, attempts in rows} == {1}  # waiting for a slot is no attempt


def test_the_per_key_limit_holds_across_8_worker_processes(db_url: str) -> None:
    per_key = 2
    keys = ["tenant-a", "tenant-b", "tenant-c"]
    with Queue(db_url, settings=Settings(database_url=db_url)) as q:
        q.set_limits("tenants", concurrency_limit_per_key=per_key)
    jobs = [
        {"concurrency_key": keys[i % 3], "payload": {"seconds": 0.01 + i % 5 / 200}}
        for i in range(300)
    ]
    rows, sampler = drain(db_url, "tenants", jobs)
    assert {key: sampler.peak[key] for key in keys} == dict.fromkeys(keys, per_key)
    for key in keys:
        intervals = [(start, end) for k, start, end, _ in rows if k == key]
        assert most_at_once(intervals) == per_key


def test_the_rate_limit_holds_over_every_window_across_8_worker_processes(db_url: str) -> None:
    rate, period = 10, timedelta(seconds=0.5)
    with Queue(db_url, settings=Settings(database_url=db_url)) as q:
        q.set_limits("metered", rate_limit=rate, rate_period_seconds=period.total_seconds())
    rows, _ = drain(db_url, "metered", [{}] * 60)
    starts = [start for _, start, _, _ in rows]
    assert most_in_a_window(starts, period) == rate


def test_the_per_key_rate_limit_holds_over_every_window(db_url: str) -> None:
    rate, period = 4, timedelta(seconds=0.5)
    with Queue(db_url, settings=Settings(database_url=db_url)) as q:
        q.set_limits("metered", rate_limit_per_key=rate, rate_period_seconds=0.5)
    rows, _ = drain(db_url, "metered", [{"concurrency_key": k} for k in ("a", "b") * 20])
    for key in ("a", "b"):
        starts = [start for k, start, _, _ in rows if k == key]
        assert most_in_a_window(starts, period) == rate
