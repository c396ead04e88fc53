"""The ends of jobs nobody waits for notify nobody (migration 0015).

A NOTIFY makes its transaction's commit wait for every other notifying
commit of the database, so the statements that end jobs notify
``pgqueue_finished`` only with the ids of the jobs a wait() registered for
(``job_watch``); the notification takes the registration away."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from pgqueue import AsyncQueue, Job, JobState, Queue, Settings
from pgqueue.core import reads
from pgqueue.db.worker_connection import Connection
from pgqueue.worker import AsyncWorker
from pgqueue.worker.maintenance import Maintenance
from pgqueue.worker.supervision import EventLog
from tests.support import running, until


def registrations(sql: psycopg.Connection[Any]) -> list[int]:
    return [row[0] for row in sql.execute("SELECT job_id FROM pgqueue_waits ORDER BY 1")]


def heard(listener: psycopg.Connection[Any]) -> list[int]:
    """The job ids of the pgqueue_finished notifications received so far."""
    return sorted(
        int(part)
        for note in listener.notifies(timeout=0.5, stop_after=100)
        for part in note.payload.split(",")
    )


async def noop(job: Job) -> None:
    return None


async def test_an_ack_notifies_the_jobs_somebody_waits_for_and_no_other(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    waited, unwatched = [(await aqueue.enqueue("noop")).id for _ in range(2)]
    with psycopg.connect(settings.database_url, autocommit=True) as listener:
        listener.execute("LISTEN pgqueue_finished")
        waiting = asyncio.create_task(aqueue.wait(waited, 30))
        await until(lambda: registrations(sql) == [waited])
        async with running(AsyncWorker({"noop": noop}, settings=settings)):
            assert (await waiting).state is JobState.SUCCEEDED
            await until(lambda: state(sql, unwatched) == "succeeded")
        assert heard(listener) == [waited]
    assert registrations(sql) == []  # the notification took it


def state(sql: psycopg.Connection[Any], job_id: int) -> str:
    row = sql.execute("SELECT state FROM pgqueue_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def test_a_cancel_notifies_its_waiter(settings: Settings, queue: Queue) -> None:
    job = queue.enqueue("noop")
    with psycopg.connect(settings.database_url, autocommit=True) as listener:
        listener.execute("LISTEN pgqueue_finished")
        with queue._waiters.waiting(job.id):
            queue.run(reads.watch(job.id, 30))
            queue.cancel(job.id)
        assert heard(listener) == [job.id]


def test_waiting_for_a_job_that_has_ended_registers_nothing(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    job = queue.enqueue("noop")
    queue.cancel(job.id)
    assert queue.wait(job.id, 5).state is JobState.CANCELLED
    assert registrations(sql) == []


async def test_maintenance_forgets_the_registrations_of_waiters_that_gave_up(
    settings: Settings, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    job = queue.enqueue("noop")
    kept = queue.enqueue("noop")
    with queue._waiters.waiting(job.id):
        queue.run(reads.watch(job.id, 0.01))
    with queue._waiters.waiting(kept.id):
        queue.run(reads.watch(kept.id, 60))
    await asyncio.sleep(0.05)
    conn = Connection(settings.database_url)
    try:
        await Maintenance(conn, settings, EventLog("test"), "test").prune()
    finally:
        await conn.close()
    assert registrations(sql) == [kept.id]
