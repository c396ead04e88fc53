"""wait() shares one LISTEN connection per queue object: a thousand
concurrent waits fit in a server of 100 connections, and a job's ending
wakes only its own waiters."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from pgqueue import AsyncQueue, JobState, Queue, Settings, migrate
from pgqueue.core import reads
from pgqueue.db.embedded import EmbeddedPostgres
from pgqueue.worker import AsyncWorker
from tests.support import running, until


@pytest.fixture(scope="module")
def small_server() -> Iterator[str]:
    """A server of its own with max_connections = 100."""
    server = EmbeddedPostgres(
        f"/dev/shm/pgqueue-small-{uuid.uuid4().hex[:8]}", options={"max_connections": "100"}
    )
    url = server.ensure_running()
    migrate(url)
    yield url
    server.destroy()


def _listeners(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgqueue-wait'"
        ).fetchone()
        return int(row[0]) if row else 0


async def test_a_thousand_concurrent_waits_on_a_server_of_100_connections_all_return(
    small_server: str,
) -> None:
    settings = Settings(database_url=small_server, poll_interval_seconds=0.2)
    async with AsyncQueue(small_server, settings=settings) as q:
        ids = [r.id for r in await q.enqueue_many([{"task": "noop"} for _ in range(1000)])]
        waits = [asyncio.create_task(q.wait(job_id, 60)) for job_id in ids]
        # (The waits start listening as they get their turn on the loop.)
        await until(lambda: _listeners(small_server) > 0)
        await asyncio.sleep(0.5)  # every wait has started by now, on the same listener
        assert _listeners(small_server) == 1
        worker = AsyncWorker({"noop": lambda job: None}, settings=settings, concurrency=50)
        async with running(worker):
            done = await asyncio.gather(*waits)
    assert [job.id for job in done] == ids
    assert {job.state for job in done} == {JobState.SUCCEEDED}


def test_hundreds_of_waiting_threads_share_one_queues_listener(small_server: str) -> None:
    settings = Settings(database_url=small_server)
    with Queue(small_server, settings=settings) as q:
        ids = [r.id for r in q.enqueue_many([{"task": "noop"} for _ in range(320)])]
        with ThreadPoolExecutor(320) as pool:
            waits = [pool.submit(q.wait, job_id, 60) for job_id in ids]
            assert _listeners(small_server) == 1
            worker = AsyncWorker({"noop": lambda job: None}, settings=settings, concurrency=50)

            async def work_until_done() -> None:
                async with running(worker):
                    await until(lambda: all(w.done() for w in waits), 60)

            asyncio.run(work_until_done())
            states = {w.result().state for w in waits}
    assert states == {JobState.SUCCEEDED}


def test_a_jobs_ending_wakes_only_its_own_waiters(queue: Queue) -> None:
    first, second = queue.enqueue("t"), queue.enqueue("t")
    with (
        queue._waiters.waiting(first.id) as first_ended,
        queue._waiters.waiting(second.id) as second_ended,
    ):
        for job in (first, second):  # as wait() does as it first reads the job
            queue.run(reads.watch(job.id, 30))
        first_ended.clear()  # set once when the listener started: look once
        second_ended.clear()
        queue.cancel(first.id)
        assert first_ended.wait(5)
        assert not second_ended.wait(0.5)
    assert queue.get(second.id).state is JobState.QUEUED
