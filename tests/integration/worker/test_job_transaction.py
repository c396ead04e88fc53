"""job.transaction(): a handler's writes and its job's completion commit
together, fenced by the attempt's token (docs/exactly-once.md). The torture
test with stopped worker processes: tests/acceptance/test_exactly_once.py."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest

from pgqueue import (
    AsyncQueue,
    InvalidJob,
    Job,
    JobState,
    NotInHandler,
    Queue,
    Settings,
    StaleAttempt,
)
from pgqueue.worker import AsyncWorker, TaskRegistry
from tests.support import running, take_over, until

LEDGER = "CREATE TABLE ledger (job_id bigint NOT NULL, attempt int NOT NULL)"


@pytest.fixture
def ledger(sql: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    sql.execute(LEDGER)
    return sql


def entries(sql: psycopg.Connection[Any], job_id: int) -> list[int]:
    """The attempts that wrote a ledger row for the job."""
    rows = sql.execute("SELECT attempt FROM ledger WHERE job_id = %s", (job_id,)).fetchall()
    return sorted(row[0] for row in rows)


def _registered(sql: psycopg.Connection[Any]) -> bool:
    row = sql.execute("SELECT count(*) FROM pgqueue_workers").fetchone()
    return row is not None and row[0] == 1


def sync_writer(job: Job) -> str:
    with job.transaction({"written_by": job.attempts}) as conn:
        conn.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, job.attempts))
    return "not recorded: the block completed the job"


async def async_writer(job: Job) -> str:
    async with job.transaction({"written_by": job.attempts}) as conn:
        await conn.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, job.attempts))
    return "not recorded: the block completed the job"


@pytest.mark.parametrize("handler", [sync_writer, async_writer], ids=["sync", "async"])
async def test_the_blocks_writes_and_the_jobs_success_commit_together(
    settings: Settings, aqueue: AsyncQueue, ledger: psycopg.Connection[Any], handler: Any
) -> None:
    job = await aqueue.enqueue("w")
    async with running(AsyncWorker({"w": handler}, settings=settings)) as worker:
        done = await aqueue.wait(job.id, 30)
        await until(lambda: worker.stats["succeeded"] == 1 and worker.held_count == 0)
        assert worker.stats["finishes"] == 0  # the completer wrote nothing
    assert (done.state, done.result, done.attempts) == (JobState.SUCCEEDED, {"written_by": 1}, 1)
    assert entries(ledger, job.id) == [1]
    [[succeeded]] = ledger.execute("SELECT sum(succeeded) FROM pgqueue_counters").fetchall()
    assert succeeded == 1


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_an_exception_in_the_block_rolls_it_back_and_the_job_is_retried(
    settings: Settings, aqueue: AsyncQueue, ledger: psycopg.Connection[Any], kind: str
) -> None:
    def fail_first(job: Job) -> None:
        if job.attempts == 1:
            raise RuntimeError("after the insert")

    def sync_handler(job: Job) -> None:
        with job.transaction() as conn:
            conn.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, job.attempts))
            fail_first(job)

    async def async_handler(job: Job) -> None:
        async with job.transaction() as conn:
            await conn.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, job.attempts))
            fail_first(job)

    handler = sync_handler if kind == "sync" else async_handler
    job = await aqueue.enqueue("w", max_attempts=2)
    settings = settings.replace(backoff_base_seconds=0.01, backoff_cap_seconds=0.01)
    async with running(AsyncWorker({"w": handler}, settings=settings)):
        done = await aqueue.wait(job.id, 30)
    assert (done.state, done.attempts) == (JobState.SUCCEEDED, 2)
    assert "after the insert" in (done.errors[0].error if done.errors else "")
    assert entries(ledger, job.id) == [2]


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_stale_attempt_gets_stale_attempt_and_nothing_of_its_block_commits(
    settings: Settings,
    aqueue: AsyncQueue,
    queue: Queue,
    ledger: psycopg.Connection[Any],
    kind: str,
) -> None:
    """The job is taken over (its lease expired, reaped, claimed by another
    worker) while the handler is inside its block."""
    inside, go_on = threading.Event(), threading.Event()
    raised: list[BaseException] = []

    def sync_handler(job: Job) -> None:
        try:
            with job.transaction() as conn:
                conn.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, job.attempts))
                inside.set()
                go_on.wait(30)
        except StaleAttempt as exc:
            raised.append(exc)
            raise

    async def async_handler(job: Job) -> None:
        try:
            async with job.transaction() as conn:
                await conn.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, job.attempts))
                inside.set()
                await until(go_on.is_set, 30)
        except StaleAttempt as exc:
            raised.append(exc)
            raise

    handler = sync_handler if kind == "sync" else async_handler
    # Heartbeats rarely: none finds the lease lost (which would cancel an
    # async handler) while the block waits; and the worker's own reaper
    # leaves the job to take_over.
    settings = settings.replace(
        heartbeat_seconds=60.0, lease_seconds=120.0, reap_interval_seconds=3600.0
    )
    async with running(AsyncWorker({"w": handler}, settings=settings)) as worker:
        # The job comes once the worker's first heartbeat (sent as it
        # starts, with the worker's registration) has passed: otherwise it
        # could extend the lease take_over expires, or find it taken.
        await until(lambda: _registered(ledger))
        job = await aqueue.enqueue("w")
        await until(inside.is_set, 30)
        taken = await asyncio.to_thread(take_over, queue, job.id)
        go_on.set()
        await until(lambda: bool(raised) and worker.held_count == 0)
        assert worker.stats["succeeded"] == 0
    [error] = raised
    assert isinstance(error, StaleAttempt) and error.job_id == job.id
    assert entries(ledger, job.id) == []  # the insert was rolled back
    now = queue.get(job.id)
    assert (now.state, now.lease_token, now.worker) == (
        JobState.RUNNING,
        taken.lease_token,
        "other",
    )


async def test_a_job_outside_its_handler_says_so(
    settings: Settings, aqueue: AsyncQueue, ledger: psycopg.Connection[Any]
) -> None:
    kept: list[Job] = []

    def keeps(job: Job) -> None:
        kept.append(job)

    job = await aqueue.enqueue("k")
    async with running(AsyncWorker({"k": keeps}, settings=settings)):
        await aqueue.wait(job.id, 30)
    read = await aqueue.get(job.id)
    for outside in (read, kept[0]):  # read back; and the handler's, after it returned
        with pytest.raises(NotInHandler, match="only inside the handler"):
            outside.transaction()


async def test_a_plain_with_in_an_async_handler_and_a_second_block_are_refused(
    settings: Settings, aqueue: AsyncQueue, ledger: psycopg.Connection[Any]
) -> None:
    errors: list[str] = []

    async def misuses(job: Job) -> None:
        try:
            with job.transaction():
                pass
        except TypeError as exc:
            errors.append(str(exc))
        async with job.transaction() as conn:
            await conn.execute("INSERT INTO ledger VALUES (%s, 1)", (job.id,))
        try:
            async with job.transaction():
                pass
        except RuntimeError as exc:
            errors.append(str(exc))

    job = await aqueue.enqueue("m")
    async with running(AsyncWorker({"m": misuses}, settings=settings)):
        done = await aqueue.wait(job.id, 30)
    assert done.state is JobState.SUCCEEDED
    assert entries(ledger, job.id) == [1]
    assert len(errors) == 2
    assert "async with job.transaction()" in errors[0]
    assert "can complete a job once" in errors[1]


def test_a_result_postgresql_cannot_store_is_refused_before_the_block(queue: Queue) -> None:
    job = queue.enqueue("r")
    with pytest.raises(InvalidJob, match="result"):
        job.transaction({"bad": float("nan")})


async def test_a_block_that_outlives_its_timed_out_attempt_commits_nothing(
    settings: Settings, aqueue: AsyncQueue, ledger: psycopg.Connection[Any]
) -> None:
    """A sync handler's thread runs on past its timeout (the attempt failed
    and is retried); when its block ends, it finds the attempt given up."""
    raised: list[BaseException] = []

    def slow_first(job: Job) -> None:
        try:
            with job.transaction() as conn:
                conn.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, job.attempts))
                if job.attempts == 1:
                    time.sleep(1.5)  # past the task's timeout of 0.5 s
        except StaleAttempt as exc:
            raised.append(exc)
            raise

    tasks = TaskRegistry()
    tasks.add("slow", slow_first, timeout=0.5)
    settings = settings.replace(backoff_base_seconds=0.01, backoff_cap_seconds=0.01)
    job = await aqueue.enqueue("slow")
    async with running(AsyncWorker(tasks, settings=settings)):
        done = await aqueue.wait(job.id, 30)
        await until(lambda: bool(raised))
    assert (done.state, done.attempts) == (JobState.SUCCEEDED, 2)
    assert "timed out" in done.errors[0].error
    assert entries(ledger, job.id) == [2]
