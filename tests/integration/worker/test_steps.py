"""Durable steps and checkpoints: job.step() / step_async() store each
completed step's result, fenced by the attempt's token, so that a later
attempt gets it back without running the step again; job.checkpoint() /
checkpoint_async() store a cursor that the next attempt reads as
job.last_checkpoint. (The crash proof, a worker process SIGKILLed in the
middle of a step: tests/acceptance/test_steps_crash.py.)"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
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
from pgqueue.core.steps import MAX_CHECKPOINT_BYTES, MAX_STEP_NAME
from pgqueue.sql import QUERIES
from pgqueue.worker import AsyncWorker
from tests.support import past_first_heartbeat, running, take_over, until

STEPS = ["one", "two", "three", "four", "five"]


@pytest.fixture
def quick(settings: Settings) -> Settings:
    """A failed attempt is retried at once."""
    return settings.replace(backoff_base_seconds=0.01, backoff_cap_seconds=0.01)


def stored(sql: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    rows = sql.execute(
        "SELECT name, result FROM pgqueue_job_steps WHERE job_id = %s", (job_id,)
    ).fetchall()
    return {row[0]: row[1] for row in rows}


def failing_after_three(calls: Counter[str]) -> dict[str, Any]:
    """Handlers of five steps (each returns [its name, the attempt] as a
    tuple, and counts its calls) that fail after the third step on their
    first attempt."""

    def work(name: str, attempt: int) -> tuple[str, int]:
        calls[name] += 1
        return (name, attempt)

    async def work_async(name: str, attempt: int) -> tuple[str, int]:
        return work(name, attempt)

    def sync_handler(job: Job) -> list[Any]:
        results = []
        for name in STEPS:
            results.append(job.step(name, work, name, job.attempts))
            if name == "three" and job.attempts == 1:
                raise RuntimeError("crash after step three")
        return results

    async def async_handler(job: Job) -> list[Any]:
        results = []
        for name in STEPS:
            # A coroutine function and a plain one alike.
            fn = work_async if name in ("one", "four") else work
            results.append(await job.step_async(name, fn, name, job.attempts))
            if name == "three" and job.attempts == 1:
                raise RuntimeError("crash after step three")
        return results

    return {"sync": sync_handler, "async": async_handler}


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_retry_gets_the_completed_steps_from_storage_without_running_them(
    quick: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any], kind: str
) -> None:
    calls: Counter[str] = Counter()
    job = await aqueue.enqueue("s")
    async with running(AsyncWorker({"s": failing_after_three(calls)[kind]}, settings=quick)):
        done = await aqueue.wait(job.id, 30)
    assert (done.state, done.attempts) == (JobState.SUCCEEDED, 2)
    assert "crash after step three" in done.errors[0].error
    assert calls == Counter(dict.fromkeys(STEPS, 1))  # no step ran twice
    # Steps one to three come from the first attempt, four and five from the
    # second; the tuples come back as lists on both attempts (JSON).
    assert done.result == [[name, 1 if name in STEPS[:3] else 2] for name in STEPS]
    assert stored(sql, job.id) == {name: [name, 1 if name in STEPS[:3] else 2] for name in STEPS}


async def test_an_operators_retry_keeps_the_completed_steps(
    quick: Settings, queue: Queue, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    """A dead job retried by an operator resumes: its completed steps (whose
    effects happened) are not run again."""
    calls: Counter[str] = Counter()
    broken = threading.Event()
    broken.set()

    def charge(job: Job) -> str:
        calls["charge"] += 1
        return "charged"

    def handler(job: Job) -> str:
        charged = job.step("charge", charge, job)
        if broken.is_set():
            raise RuntimeError("the mail server is down")
        return str(charged)

    job = await aqueue.enqueue("r", max_attempts=1)
    async with running(AsyncWorker({"r": handler}, settings=quick)):
        assert (await aqueue.wait(job.id, 30)).state is JobState.DEAD
        broken.clear()
        queue.retry(job.id)
        done = await aqueue.wait(job.id, 30)
    assert (done.state, done.result, calls["charge"]) == (JobState.SUCCEEDED, "charged", 1)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_retry_resumes_from_the_last_checkpoint(
    quick: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any], kind: str
) -> None:
    """Ten items, a checkpoint after each; the first attempt fails at item
    5: the second starts from the checkpoint (5), and each item is done
    once."""
    done_items: list[int] = []
    starts: list[Any] = []

    def item(job: Job, i: int) -> None:
        if i == 5 and job.attempts == 1:
            raise RuntimeError("failed at item 5")
        done_items.append(i)

    def sync_handler(job: Job) -> int:
        starts.append(job.last_checkpoint)
        for i in range(job.last_checkpoint or 0, 10):
            item(job, i)
            job.checkpoint(i + 1)
        return len(done_items)

    async def async_handler(job: Job) -> int:
        starts.append(job.last_checkpoint)
        for i in range(job.last_checkpoint or 0, 10):
            item(job, i)
            await job.checkpoint_async(i + 1)
        return len(done_items)

    handler = sync_handler if kind == "sync" else async_handler
    job = await aqueue.enqueue("c")
    async with running(AsyncWorker({"c": handler}, settings=quick)):
        done = await aqueue.wait(job.id, 30)
    assert (done.state, done.attempts, done.result) == (JobState.SUCCEEDED, 2, 10)
    assert starts == [None, 5]
    assert done_items == list(range(10))
    assert done.last_checkpoint == 10


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_stale_attempt_stores_no_step_and_no_checkpoint(
    settings: Settings,
    queue: Queue,
    aqueue: AsyncQueue,
    sql: psycopg.Connection[Any],
    kind: str,
) -> None:
    """The job is taken over while its handler waits between steps: its
    next step and checkpoint raise StaleAttempt and store nothing."""
    inside, go_on = threading.Event(), threading.Event()
    raised: list[BaseException] = []

    def sync_handler(job: Job) -> None:
        job.step("a", lambda: "a")
        inside.set()
        go_on.wait(30)
        for attempt in (lambda: job.checkpoint(1), lambda: job.step("b", lambda: "b")):
            try:
                attempt()
            except StaleAttempt as exc:
                raised.append(exc)

    async def async_handler(job: Job) -> None:
        await job.step_async("a", lambda: "a")
        inside.set()
        await until(go_on.is_set, 30)
        for attempt in (
            lambda: job.checkpoint_async(1),
            lambda: job.step_async("b", lambda: "b"),
        ):
            try:
                await attempt()
            except StaleAttempt as exc:
                raised.append(exc)

    handler = sync_handler if kind == "sync" else async_handler
    # Heartbeats rarely and no reaper: the worker does not learn of the
    # take-over; only the fence in the statements finds it.
    settings = settings.replace(
        heartbeat_seconds=60.0, lease_seconds=120.0, reap_interval_seconds=3600.0
    )
    async with running(AsyncWorker({"w": handler}, settings=settings)) as worker:
        await past_first_heartbeat(worker, sql)
        job = await aqueue.enqueue("w")
        await until(inside.is_set, 30)
        taken = await asyncio.to_thread(take_over, queue, job.id)
        go_on.set()
        await until(lambda: len(raised) == 2, 30)
    assert all(isinstance(e, StaleAttempt) and e.job_id == job.id for e in raised)
    assert "nothing was stored" in str(raised[0])
    assert stored(sql, job.id) == {"a": "a"}
    now = queue.get(job.id)
    assert (now.lease_token, now.last_checkpoint) == (taken.lease_token, None)


async def test_bad_names_results_and_checkpoints_are_refused_and_nothing_is_stored(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    refused: list[str] = []

    def refuses(job: Job) -> None:
        bad_calls = [
            lambda: job.step("", str),
            lambda: job.step("x" * (MAX_STEP_NAME + 1), str),
            lambda: job.step(5, str),  # type: ignore[arg-type]
            lambda: job.step("a\nb", str),
            lambda: job.step("not json", object),
            lambda: job.step("nan", float, "nan"),
            lambda: job.checkpoint({"cursor": object()}),
            lambda: job.checkpoint("x" * MAX_CHECKPOINT_BYTES),
        ]
        for call in bad_calls:
            with pytest.raises(InvalidJob) as info:
                call()
            refused.append(str(info.value))
        job.step("ok", str, "fine")
        with pytest.raises(InvalidJob, match="already completed a step of that name"):
            job.step("ok", str, "again")

    job = await aqueue.enqueue("b")
    async with running(AsyncWorker({"b": refuses}, settings=settings)):
        done = await aqueue.wait(job.id, 30)
    assert done.state is JobState.SUCCEEDED, done.last_error
    assert len(refused) == 8
    assert "printable characters" in refused[0] and "not json" in refused[4]
    assert stored(sql, job.id) == {"ok": "fine"}
    assert done.last_checkpoint is None


async def test_the_sync_calls_are_refused_in_an_async_handler_and_outside_a_handler(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    errors: list[BaseException] = []

    async def blocking(job: Job) -> None:
        for call in (lambda: job.step("a", str), lambda: job.checkpoint(1)):
            try:
                call()
            except TypeError as exc:
                errors.append(exc)

    job = await aqueue.enqueue("a")
    async with running(AsyncWorker({"a": blocking}, settings=settings)):
        await aqueue.wait(job.id, 30)
    assert [str(e).split(" in an")[0] for e in errors] == ["job.step()", "job.checkpoint()"]
    assert "await job.step_async" in str(errors[0])
    read = await aqueue.get(job.id)
    with pytest.raises(NotInHandler, match=r"job\.step\(\)"):
        read.step("a", str)
    with pytest.raises(NotInHandler, match=r"job\.checkpoint_async\(\)"):
        await read.checkpoint_async(1)
    assert stored(sql, job.id) == {}


async def test_deleting_a_job_deletes_its_steps(
    settings: Settings, queue: Queue, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    def two_steps(job: Job) -> None:
        job.step("a", str, "a")
        job.step("b", str, "b")

    jobs = [await aqueue.enqueue("d") for _ in range(2)]
    async with running(AsyncWorker({"d": two_steps}, settings=settings)):
        for job in jobs:
            await aqueue.wait(job.id, 30)
    assert all(len(stored(sql, job.id)) == 2 for job in jobs)
    sql.execute(
        "UPDATE pgqueue_jobs SET finished_at = now() - interval '30 days' WHERE id = %s",
        (jobs[0].id,),
    )
    assert queue.prune() == 1
    assert stored(sql, jobs[0].id) == {}
    assert queue.bulk_delete(state="succeeded", ids=[jobs[1].id]) == 1
    assert stored(sql, jobs[1].id) == {}


def test_a_step_and_a_checkpoint_commit_without_waiting_for_the_flush(
    queue: Queue, db_url: str
) -> None:
    """Their statements turn synchronous_commit off for their own
    transaction only (a step is at least once: a server crash may lose the
    last fraction of a second of them, which then run again)."""
    queue.enqueue("t")
    [job] = queue.claim(1, worker="w")
    fence = {"id": job.id, "token": job.lease_token}
    statements = {
        "job_step_record": {**fence, "name": "s", "result": "1"},
        "job_checkpoint": {**fence, "value": "1"},
    }
    with psycopg.connect(db_url) as conn:
        for name, params in statements.items():
            assert conn.execute(QUERIES[name], params).fetchall() == [(job.id,)], name
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",), name
            conn.commit()
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",), name
            conn.rollback()
