"""The worker runtime against a real PostgreSQL: handlers, batching, fencing,
leases, timeouts, wake-ups and graceful stop. Each test runs AsyncWorker on
the test's own event loop."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from datetime import UTC
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, Job, JobState, Queue, Settings
from pgqueue.worker import AsyncWorker, TaskRegistry
from tests.support import running, take_over, until


def delay_of(sql: psycopg.Connection[Any], job_id: int) -> float:
    """Seconds from run_at to started_at, database clock."""
    row = sql.execute(
        "SELECT extract(epoch FROM started_at - run_at)::float8 FROM pgqueue_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return float(row[0])


async def test_async_and_sync_handlers_record_results(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    threads: set[str] = set()

    async def echo(job: Job) -> Any:
        return job.payload

    def add(job: Job) -> int:
        threads.add(threading.current_thread().name)
        return sum(job.payload["numbers"])

    # Quotes, backslashes, braces and non-ASCII survive the batched arrays.
    tricky = {"x": [1, "two"], "q": 'a"b\\c\\', "u": "é✓", "b": "{NULL,}", "n": None}
    a = await aqueue.enqueue("echo", tricky)
    b = await aqueue.enqueue("add", {"numbers": [1, 2, 3]})
    async with running(AsyncWorker({"echo": echo, "add": add}, settings=settings)):
        done_a = await aqueue.wait(a.id, 10)
        done_b = await aqueue.wait(b.id, 10)
    assert (done_a.state, done_a.result) == (JobState.SUCCEEDED, tricky)
    assert (done_b.state, done_b.result) == (JobState.SUCCEEDED, 6)
    assert threads and threading.main_thread().name not in threads  # sync ran off-loop


async def test_registry_decorator_and_task_timeout(settings: Settings, aqueue: AsyncQueue) -> None:
    registry = TaskRegistry()

    @registry.task(timeout=0.2)
    async def slow(job: Job) -> None:
        await asyncio.sleep(5)

    job = await aqueue.enqueue("slow", max_attempts=1)
    async with running(AsyncWorker(registry, settings=settings)):
        done = await aqueue.wait(job.id, 10)
    assert done.state is JobState.DEAD
    assert "timed out after 0.2 s" in (done.last_error or "")


@pytest.mark.parametrize("prefetch", [0, 3])
async def test_batch_claims_never_exceed_free_slots(
    settings: Settings, aqueue: AsyncQueue, caplog: pytest.LogCaptureFixture, prefetch: int
) -> None:
    """Claims never exceed the free slots, plus the jobs a worker may claim
    ahead of them (``prefetch``); handlers never exceed ``concurrency``."""
    concurrency = 4
    active = 0
    peak = 0

    async def work(job: Job) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01 * (job.id % 3))
        active -= 1

    await aqueue.enqueue_many([{"task": "work"}] * 60)
    worker = AsyncWorker(
        {"work": work}, settings=settings.replace(prefetch=prefetch), concurrency=concurrency
    )
    # Record each claim's size next to the free slots it was allowed.
    claims: list[tuple[int, int]] = []
    original = worker.runners.start

    def spy(jobs: list[Job]) -> None:
        claims.append((len(jobs), concurrency - worker.running_count))
        original(jobs)

    worker.runners.start = spy  # type: ignore[method-assign]
    async with running(worker):
        await until(lambda: worker.stats["succeeded"] == 60)
    assert peak == concurrency  # the limit was reached, and never passed
    assert all(size <= free + prefetch for size, free in claims), claims
    assert len(claims) < 60  # batched: fewer claims than jobs


async def test_two_workers_run_each_job_exactly_once(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    runs: list[int] = []

    async def record(job: Job) -> None:
        runs.append(job.id)
        await asyncio.sleep(0)

    def sync_record(job: Job) -> None:
        runs.append(job.id)

    handlers = {"a": record, "s": sync_record}
    await aqueue.enqueue_many([{"task": "a" if i % 2 else "s"} for i in range(600)])
    w1 = AsyncWorker(handlers, settings=settings, concurrency=16)
    w2 = AsyncWorker(handlers, settings=settings, concurrency=16)
    async with running(w1), running(w2):
        await until(lambda: w1.stats["succeeded"] + w2.stats["succeeded"] == 600, 30)
    assert sorted(runs) == sorted(set(runs)) and len(runs) == 600
    assert w1.stats["succeeded"] > 0 and w2.stats["succeeded"] > 0
    row = sql.execute(
        "SELECT count(*) FROM pgqueue_jobs WHERE state = 'succeeded' AND attempts = 1"
    ).fetchone()
    assert row == (600,)


async def test_acks_are_fenced_by_token(
    settings: Settings, queue: Queue, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    """The worker's lease expires and another worker takes the job over while
    the handler still runs: the late result must not overwrite anything."""
    started = threading.Event()
    release = threading.Event()

    def slow(job: Job) -> str:
        started.set()
        release.wait(10)
        return "late"

    job = await aqueue.enqueue("slow")
    s = settings.replace(heartbeat_seconds=29.0)  # no heartbeat during the test
    worker = AsyncWorker({"slow": slow}, settings=s, concurrency=1)
    async with running(worker):
        await asyncio.to_thread(started.wait, 10)
        taken = take_over(queue, job.id, worker="other")
        release.set()
        await until(lambda: worker.held_count == 0)
    now = queue.get(job.id)
    assert (now.state, now.worker, now.result) == (JobState.RUNNING, "other", None)
    assert now.lease_token == taken.lease_token
    assert worker.stats["lost"] == 1 and worker.stats["succeeded"] == 0


async def test_lost_lease_cancels_async_handler(settings: Settings, aqueue: AsyncQueue) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def forever(job: Job) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    s = settings.replace(heartbeat_seconds=0.1, lease_seconds=5.0)
    job = await aqueue.enqueue("forever")
    worker = AsyncWorker({"forever": forever}, settings=s)
    async with running(worker):
        await asyncio.wait_for(started.wait(), 10)
        await aqueue.cancel(job.id)  # revokes the lease
        await asyncio.wait_for(cancelled.wait(), 5)
        await until(lambda: worker.held_count == 0)
    assert (await aqueue.get(job.id)).state is JobState.CANCELLED
    assert worker.stats["lost"] == 1


async def test_long_job_that_heartbeats_is_not_reaped(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    """Lease 1 s, job 2.5 s: heartbeats keep it, reapers run meanwhile."""

    async def long(job: Job) -> str:
        await asyncio.sleep(2.5)
        return "done"

    s = settings.replace(lease_seconds=1.0, heartbeat_seconds=0.3, reap_interval_seconds=0.2)
    job = await aqueue.enqueue("long")
    async with running(AsyncWorker({"long": long}, settings=s)):
        done = await aqueue.wait(job.id, 10)
    assert (done.state, done.result, done.attempts) == (JobState.SUCCEEDED, "done", 1)


async def test_timeout_fails_async_attempt_and_cancels_it(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    cancelled = asyncio.Event()

    async def hang(job: Job) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job = await aqueue.enqueue("hang", timeout=0.3, max_attempts=2)
    worker = AsyncWorker({"hang": hang}, settings=settings)
    async with running(worker):
        await until(lambda: worker.stats["failed"] >= 1)
        first = await aqueue.get(job.id)
    assert cancelled.is_set()
    assert first.state is JobState.QUEUED and first.attempts == 1
    assert "timed out after 0.3 s" in (first.last_error or "")


async def test_timeout_fails_sync_attempt_and_discards_late_result(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    finished = threading.Event()

    def hang(job: Job) -> str:
        time.sleep(0.8)
        finished.set()
        return "too late"

    job = await aqueue.enqueue("hang", timeout=0.2, max_attempts=1)
    worker = AsyncWorker({"hang": hang}, settings=settings)
    async with running(worker):
        done = await aqueue.wait(job.id, 10)
        assert done.state is JobState.DEAD
        await asyncio.to_thread(finished.wait, 5)
        await asyncio.sleep(0.1)  # the late result reaches the loop, and is dropped
    later = await aqueue.get(job.id)
    assert (later.state, later.result) == (JobState.DEAD, None)
    assert "timed out after 0.2 s" in (later.last_error or "")


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ("raises", "ValueError: bad input"),
        ("nan", "cannot store"),
        ("not_json", "cannot store"),
        ("sync_raises", "KeyError"),
        ("surrogate", "cannot store"),
        ("no_such_task", "unknown task 'no_such_task'"),
    ],
)
async def test_bad_handlers_are_failed_attempts(
    settings: Settings, aqueue: AsyncQueue, task: str, expected: str
) -> None:
    async def raises(job: Job) -> None:
        raise ValueError("bad input")

    async def nan(job: Job) -> float:
        return math.nan

    async def not_json(job: Job) -> object:
        return object()

    def sync_raises(job: Job) -> None:
        raise KeyError("missing")

    async def surrogate(job: Job) -> str:
        return "\ud800"  # valid JSON for Python, not for PostgreSQL

    handlers = {
        "raises": raises,
        "nan": nan,
        "not_json": not_json,
        "sync_raises": sync_raises,
        "surrogate": surrogate,
    }
    job = await aqueue.enqueue(task, max_attempts=1)
    async with running(AsyncWorker(handlers, settings=settings)) as worker:
        done = await aqueue.wait(job.id, 10)
        await until(lambda: worker.stats["failed"] == 1)
    assert done.state is JobState.DEAD and done.result is None
    assert expected in (done.last_error or "")


async def test_notify_wakes_idle_worker_before_poll(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    async def noop(job: Job) -> None:
        return None

    s = settings.replace(poll_interval_seconds=5.0)
    async with running(AsyncWorker({"noop": noop}, settings=s)) as worker:
        await until(lambda: worker.stats["claims"] >= 1)  # first look: nothing
        await asyncio.sleep(0.3)  # idle, sleeping on the poll interval
        job = await aqueue.enqueue("noop")
        await aqueue.wait(job.id, 10)
    assert delay_of(sql, job.id) < 1.0


async def test_poll_is_the_backstop_without_listen(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    async def noop(job: Job) -> None:
        return None

    s = settings.replace(poll_interval_seconds=0.5)
    async with running(AsyncWorker({"noop": noop}, settings=s, listen=False)) as worker:
        await until(lambda: worker.stats["claims"] >= 1)
        job = await aqueue.enqueue("noop")
        done = await aqueue.wait(job.id, 5)
    assert done.state is JobState.SUCCEEDED
    assert delay_of(sql, job.id) < 0.5 + 0.3


async def test_listener_reconnects_after_its_connection_is_killed(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    async def noop(job: Job) -> None:
        return None

    s = settings.replace(poll_interval_seconds=30.0)
    async with running(AsyncWorker({"noop": noop}, settings=s)) as worker:
        await until(lambda: worker.stats["claims"] >= 1)
        sql.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN%%'"
        )
        await asyncio.sleep(0.5)  # reconnected (backoff starts at 50 ms)
        job = await aqueue.enqueue("noop")
        await aqueue.wait(job.id, 10)
    assert delay_of(sql, job.id) < 1.0


async def test_delayed_job_runs_at_its_time(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    async def noop(job: Job) -> None:
        return None

    job = await aqueue.enqueue("noop", delay=1.0)
    s = settings.replace(poll_interval_seconds=5.0)
    async with running(AsyncWorker({"noop": noop}, settings=s)):
        await aqueue.wait(job.id, 10)
    late = delay_of(sql, job.id)
    assert 0.0 <= late < 0.5


async def test_handlers_get_times_in_utc_whatever_the_database_time_zone(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    """The worker's sessions read times in UTC (a zone psycopg converts to
    for free); the instants are the database's own."""
    sql.execute(f"ALTER DATABASE {sql.info.dbname} SET timezone = 'America/New_York'")
    with psycopg.connect(settings.database_url) as fresh:
        assert fresh.execute("SHOW timezone").fetchone() == ("America/New_York",)
    seen: list[Job] = []

    async def grab(job: Job) -> None:
        seen.append(job)

    job = await aqueue.enqueue("grab")
    async with running(AsyncWorker({"grab": grab}, settings=settings)):
        await aqueue.wait(job.id, 10)
    (got,) = seen
    row = sql.execute(
        "SELECT run_at, enqueued_at, started_at, lease_expires_at FROM pgqueue_jobs WHERE id = %s",
        (job.id,),
    ).fetchone()
    times = (got.run_at, got.enqueued_at, got.started_at, got.lease_expires_at)
    assert all(t is not None and t.tzinfo is UTC for t in times)
    assert times[:3] == row[:3]


async def test_stop_finishes_running_jobs_and_acks_them(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    started = asyncio.Event()

    async def slow(job: Job) -> str:
        started.set()
        await asyncio.sleep(0.5)
        return "finished"

    job = await aqueue.enqueue("slow")
    worker = AsyncWorker({"slow": slow}, settings=settings)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 10)
    await worker.stop()
    await task
    done = await aqueue.get(job.id)
    assert (done.state, done.result) == (JobState.SUCCEEDED, "finished")


async def test_stop_past_shutdown_timeout_fails_the_attempt(
    settings: Settings, aqueue: AsyncQueue, caplog: pytest.LogCaptureFixture
) -> None:
    started = asyncio.Event()

    async def stuck(job: Job) -> None:
        started.set()
        await asyncio.sleep(60)

    job = await aqueue.enqueue("stuck")
    s = settings.replace(shutdown_timeout_seconds=0.3)
    worker = AsyncWorker({"stuck": stuck}, settings=s)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 10)
    caplog.set_level(logging.INFO, logger="pgqueue.worker")
    await worker.stop()
    await task
    done = await aqueue.get(job.id)
    assert done.state is JobState.QUEUED and "interrupted" in (done.last_error or "")
    actions = {getattr(r, "action", None) for r in caplog.records}
    assert {"shutdown", "stopped"} <= actions
