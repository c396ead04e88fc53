"""A task that declares psycopg.OperationalError as retried without an
attempt survives PostgreSQL restarts that kill its handler's own connection,
however few attempts it has; the same outage ends a task that does not
declare it as dead. This test restarts the session's shared server
(``pg_server.restart("fast")``, which ends every session) three times, and
waits until it is back each time."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, DatabaseUnavailable, Job, JobState, Settings
from pgqueue.db.embedded import EmbeddedPostgres, wait_until_ready
from pgqueue.worker import AsyncWorker, TaskRegistry
from tests.support import running

RESTARTS = 3


@pytest.mark.timeout(120)
async def test_a_task_retried_without_attempt_survives_three_restarts_with_two_attempts(
    pg_server: EmbeddedPostgres, settings: Settings, aqueue: AsyncQueue
) -> None:
    url = settings.database_url
    in_query = {"declared": asyncio.Event(), "plain": asyncio.Event()}
    restarted = asyncio.Event()

    async def query(job: Job) -> dict[str, Any]:
        """Its own connection, busy in a query when the server restarts."""
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            if restarted.is_set():
                return {"snoozes": job.snoozes}
            in_query[job.task].set()
            await conn.execute("SELECT pg_sleep(60)")
        raise AssertionError("the sleep is cut short by the restart")

    tasks = TaskRegistry()
    tasks.add("declared", query, retry_without_attempt=psycopg.OperationalError)
    tasks.add("plain", query)
    fast = settings.replace(
        backoff_base_seconds=0.05, backoff_cap_seconds=0.2, poll_interval_seconds=0.1
    )
    declared = await aqueue.enqueue("declared", max_attempts=2)
    plain = await aqueue.enqueue("plain", max_attempts=2)
    async with running(AsyncWorker(tasks, settings=fast)):
        for restart in range(RESTARTS):
            waiting = [in_query["declared"]] + ([in_query["plain"]] if restart == 0 else [])
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in waiting)), 60)
            await asyncio.sleep(0.2)  # the query has reached the server
            for event in in_query.values():
                event.clear()
            await asyncio.to_thread(pg_server.restart, "fast")
            await asyncio.to_thread(wait_until_ready, pg_server.url)
        restarted.set()
        done = await _ended(aqueue, declared.id)
    assert done.state is JobState.SUCCEEDED, done.last_error
    # Three outages (and any failed connect while the server came back), no attempt counted.
    assert done.attempts == 1 and done.snoozes >= RESTARTS
    assert done.result == {"snoozes": done.snoozes}
    assert done.last_error is not None
    assert done.last_error.startswith("retried without counting an attempt (snooze ")
    assert "OperationalError" in done.last_error or "AdminShutdown" in done.last_error
    lost = await _ended(aqueue, plain.id)
    assert lost.state is JobState.DEAD and lost.attempts == 2 and lost.snoozes == 0


async def _ended(aqueue: AsyncQueue, job_id: int) -> Job:
    for _ in range(600):
        try:
            job = await aqueue.get(job_id)
        except DatabaseUnavailable:  # the pool reconnecting after the restarts
            job = None
        if job is not None and job.state in (JobState.SUCCEEDED, JobState.DEAD):
            return job
        await asyncio.sleep(0.1)
    raise AssertionError(f"job {job_id} did not end")
