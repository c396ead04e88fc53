"""Per-attempt history: every failed attempt's error is kept on the job (the
last 20), written by the statement that records the failure, and shown by
the library, the HTTP API and ``pgqueue jobs show``."""

from __future__ import annotations

import asyncio
import random
from datetime import datetime
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import AsyncQueue, Job, JobState, Queue, Settings
from pgqueue.cli import app
from pgqueue.core.jobs import MAX_ATTEMPT_ERRORS
from pgqueue.worker import AsyncWorker
from tests.support import api_client, running

# Failed attempts come back at once.
FAST_RETRY = {"backoff_base_seconds": 1e-6, "backoff_cap_seconds": 1e-6}


def fast_queue(settings: Settings) -> Queue:
    return Queue(settings.database_url, settings=settings.replace(**FAST_RETRY))


def fail_once(queue: Queue, error: str, worker: str = "w1") -> Job:
    [job] = queue.claim(1, worker=worker)
    queue.fail(job, error)
    return queue.get(job.id)


def test_every_failed_attempt_is_kept_oldest_first(settings: Settings) -> None:
    with fast_queue(settings) as queue:
        job = queue.enqueue("t", max_attempts=3)
        for n in (1, 2, 3):
            failed = fail_once(queue, f"ValueError: boom {n}\nTraceback line {n}", f"w{n}")
        assert failed.state is JobState.DEAD
        assert [(e.attempt, e.error, e.worker) for e in failed.errors] == [
            (n, f"ValueError: boom {n}\nTraceback line {n}", f"w{n}") for n in (1, 2, 3)
        ]
        times = [e.at for e in failed.errors]
        assert times == sorted(times) and failed.finished_at is not None
        assert times[-1] <= failed.finished_at
        assert failed.last_error == failed.errors[-1].error
        assert queue.get(job.id).to_dict()["errors"][0] == {
            "attempt": 1,
            "error": "ValueError: boom 1\nTraceback line 1",
            "worker": "w1",
            "at": times[0].isoformat(),
        }


def test_a_job_that_never_failed_stores_no_errors(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    job = queue.enqueue("t")
    [claimed] = queue.claim(1, worker="w")
    queue.ack(claimed, {"ok": True})
    assert queue.get(job.id).errors == ()
    assert sql.execute("SELECT errors FROM pgqueue_jobs WHERE id = %s", (job.id,)).fetchone() == (
        None,
    )


def test_a_success_after_failures_keeps_them(settings: Settings) -> None:
    with fast_queue(settings) as queue:
        job = queue.enqueue("t")
        fail_once(queue, "first")
        [claimed] = queue.claim(1, worker="w2")
        queue.ack(claimed)
        done = queue.get(job.id)
    assert done.state is JobState.SUCCEEDED
    assert [(e.attempt, e.error) for e in done.errors] == [(1, "first")]


def test_an_expired_lease_is_a_failed_attempt_in_the_history(
    settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    with fast_queue(settings) as queue:
        job = queue.enqueue("t", max_attempts=2)
        queue.claim(1, worker="lost-worker")
        sql.execute(
            "UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
            (job.id,),
        )
        assert queue.reap() == {job.id: JobState.QUEUED}
        failed = fail_once(queue, "second attempt failed", "w2")
    assert failed.state is JobState.DEAD
    assert [(e.attempt, e.worker) for e in failed.errors] == [(1, "lost-worker"), (2, "w2")]
    assert failed.errors[0].error == "lease expired (worker lost-worker, attempt 1)"


def test_only_the_last_20_are_kept(settings: Settings) -> None:
    attempts = MAX_ATTEMPT_ERRORS + 5
    with fast_queue(settings) as queue:
        job = queue.enqueue("t", max_attempts=attempts)
        for n in range(1, attempts + 1):
            fail_once(queue, f"failure {n}")
        dead = queue.get(job.id)
    assert dead.state is JobState.DEAD and dead.attempts == attempts
    assert len(dead.errors) == MAX_ATTEMPT_ERRORS == 20
    assert [e.attempt for e in dead.errors] == list(range(6, attempts + 1))
    assert [e.error for e in dead.errors][-1] == f"failure {attempts}"


def test_each_error_keeps_its_first_2000_characters(settings: Settings) -> None:
    with fast_queue(settings) as queue:
        queue.enqueue("t")
        failed = fail_once(queue, "x" * 1990 + "0123456789abcdef")
    assert failed.errors[0].error == "x" * 1990 + "0123456789"
    assert failed.last_error == "x" * 1990 + "0123456789abcdef"


def test_a_failure_whose_history_cannot_be_written_is_not_recorded(
    settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    """The failure and its history are one write: when the history write is
    refused, the attempt is not recorded as failed either."""
    with fast_queue(settings) as queue:
        job = queue.enqueue("t")
        fail_once(queue, "first")
        sql.execute(
            "ALTER TABLE pgqueue_jobs ADD CONSTRAINT one_error_at_most"
            " CHECK (jsonb_array_length(errors) < 2)"
        )
        [claimed] = queue.claim(1, worker="w")
        with pytest.raises(psycopg.errors.CheckViolation):
            queue.fail(claimed, "second")
        after = queue.get(job.id)
    assert (after.state, after.attempts, after.last_error) == (JobState.RUNNING, 2, "first")
    assert [e.error for e in after.errors] == ["first"]


async def test_errors_and_attempts_agree_after_many_workers_with_random_failures(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    fast = settings.replace(**FAST_RETRY, concurrency=8)
    chance = random.Random(14)

    async def flaky(job: Job) -> None:
        await asyncio.sleep(chance.random() / 1000)
        if chance.random() < 0.4:
            raise RuntimeError(f"flaky failure of job {job.id} at attempt {job.attempts}")

    jobs = await aqueue.enqueue_many([{"task": "flaky", "max_attempts": 4} for _ in range(400)])
    workers = [AsyncWorker({"flaky": flaky}, settings=fast) for _ in range(4)]
    async with running(workers[0]), running(workers[1]), running(workers[2]), running(workers[3]):
        for enqueued in jobs:
            await aqueue.wait(enqueued.id, 60)
    names = {worker.name for worker in workers}
    failures = 0
    for enqueued in jobs:
        job = await aqueue.get(enqueued.id)
        failed_attempts = job.attempts - (job.state is JobState.SUCCEEDED)
        assert [e.attempt for e in job.errors] == list(range(1, failed_attempts + 1)), job
        for error in job.errors:
            assert error.error.startswith(f"RuntimeError: flaky failure of job {job.id} at")
            assert error.worker in names
        failures += len(job.errors)
    [(counted,)] = sql.execute("SELECT sum(failed) FROM pgqueue_counters").fetchall()
    assert failures == counted > 50


async def test_the_api_shows_errors_on_one_job_not_in_summaries(settings: Settings) -> None:
    with fast_queue(settings) as queue:
        job = queue.enqueue("t", max_attempts=2)
        fail_once(queue, "E1: first\nhead of traceback")
        kept = fail_once(queue, "E2: second", "w2").errors
    async with api_client(settings) as http:
        one = (await http.get(f"/jobs/{job.id}")).json()
        summary = (await http.get("/jobs", params={"fields": "summary"})).json()["jobs"][0]
        full = (await http.get("/jobs")).json()["jobs"][0]
    assert [(e["attempt"], e["error"], e["worker"]) for e in one["errors"]] == [
        (1, "E1: first\nhead of traceback", "w1"),
        (2, "E2: second", "w2"),
    ]
    assert all(set(e) == {"attempt", "error", "worker", "at"} for e in one["errors"])
    assert [datetime.fromisoformat(e["at"]) for e in one["errors"]] == [e.at for e in kept]
    assert "errors" not in summary
    assert full["errors"] == one["errors"]


def test_jobs_show_prints_every_failed_attempt(settings: Settings, db_url: str) -> None:
    with fast_queue(settings) as queue:
        job = queue.enqueue("t", max_attempts=3)
        fail_once(queue, "KeyError: 'customer'\n  File handler.py, line 3", "host-a")
        fail_once(queue, "TimeoutError: slow", "host-b")
    result = CliRunner().invoke(
        app, ["--database-url", db_url, "jobs", "show", str(job.id)], env={"COLUMNS": "160"}
    )
    assert result.exit_code == 0, result.output
    assert "failed attempts" in result.output
    lines = result.output.split("failed attempts", 1)[1].splitlines()
    first = next(line for line in lines if "KeyError: 'customer'" in line)
    second = next(line for line in lines if "TimeoutError: slow" in line)
    assert first.split()[0] == "1" and "host-a" in first
    assert second.split()[0] == "2" and "host-b" in second
    assert any("File handler.py, line 3" in line for line in lines)
