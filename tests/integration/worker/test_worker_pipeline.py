"""The pipelined worker against a real PostgreSQL: prefetched jobs (claimed
ahead of the free slots) go back to the queue the moment the worker stops,
not when their leases expire; and a concurrency limit counts them as running,
so that it is never exceeded with prefetch on, sampled while workers drain."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from pgqueue import AsyncQueue, Job, JobState, Settings
from pgqueue.worker import AsyncWorker
from pgqueue.worker.held import Stage
from tests.support import running, until


def state_of(sql: psycopg.Connection[Any], job_id: int) -> tuple[str, int, object]:
    row = sql.execute(
        "SELECT state, attempts, lease_expires_at FROM pgqueue_jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


async def test_a_stopping_worker_gives_back_its_prefetched_jobs_at_once(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    release = asyncio.Event()

    async def hold(job: Job) -> None:
        await release.wait()

    jobs = await aqueue.enqueue_many([{"task": "hold"}] * 10)
    worker = AsyncWorker({"hold": hold}, settings=settings.replace(prefetch=3), concurrency=2)
    async with running(worker):
        await until(lambda: worker.running_count == 2)
        worker.held.ahead = 3  # as the pace of a busy worker sets it
        worker.held.slot_freed.set()
        await until(lambda: worker.held.prefetched == 3)
        waiting = [h.job.id for h in worker.held if h.stage is Stage.PREFETCHED]
        assert all(state_of(sql, i)[0] == "running" for i in waiting)  # claimed: leased
        worker.request_stop()
        # Back in the queue while the two handlers still run, leases of 30 s or not.
        await until(lambda: all(state_of(sql, i)[0] == "queued" for i in waiting))
        assert worker.running_count == 2
        assert {state_of(sql, i)[1:] for i in waiting} == {(0, None)}  # no attempt spent
        release.set()
    ran = [j.id for j in jobs if state_of(sql, j.id)[0] == "succeeded"]
    assert len(ran) == 2 and not set(ran) & set(waiting)
    # Another worker takes them at once, as first attempts.
    async with running(AsyncWorker({"hold": hold}, settings=settings)):
        for job_id in waiting:
            done = await aqueue.wait(job_id, 10)
            assert (done.state, done.attempts) == (JobState.SUCCEEDED, 1)


async def test_a_concurrency_limit_counts_prefetched_jobs_and_is_never_exceeded(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    limit = 8  # more than the workers' 6 slots: only prefetched jobs can reach it
    await aqueue.set_limits("q", concurrency_limit=limit)
    jobs = await aqueue.enqueue_many([{"task": "work", "queue": "q"}] * 400)
    started: set[int] = set()  # the jobs whose handlers run now
    most_handlers = 0

    async def work(job: Job) -> None:
        nonlocal most_handlers
        started.add(job.id)
        most_handlers = max(most_handlers, len(started))
        await asyncio.sleep(0.005)
        started.discard(job.id)

    prefetching = settings.replace(prefetch=10)
    workers = [
        AsyncWorker({"work": work}, settings=prefetching, concurrency=3, queues=["q"])
        for _ in range(2)
    ]
    samples: list[int] = []
    most_waiting = 0
    async with running(workers[0]), running(workers[1]), asyncio.timeout(60):
        while True:
            row = sql.execute(
                "SELECT count(*) FILTER (WHERE state = 'running'), "
                "count(*) FILTER (WHERE state = 'succeeded') FROM pgqueue_jobs WHERE queue = 'q'"
            ).fetchone()
            assert row is not None
            samples.append(row[0])
            most_waiting = max(most_waiting, *(w.held.prefetched for w in workers))
            if row[1] == len(jobs):
                break
            await asyncio.sleep(0.002)
    assert max(samples) <= limit and most_handlers <= 6
    assert most_waiting > 0  # prefetch was on, and its jobs counted against the limit
