"""Snooze and CancelJob against a real PostgreSQL: attempts given back, the
database clock, the max-snoozes bound, cancels that skip retries, fencing,
counters and metrics, many workers at once, and the migration."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgqueue import (
    AsyncQueue,
    CancelJob,
    Job,
    JobState,
    Outcome,
    Queue,
    Settings,
    Snooze,
    migrate,
)
from pgqueue.worker import AsyncWorker, TaskRegistry
from tests.support import api_client, migrated_before, running, take_over, until

COUNTED = ("succeeded", "failed", "dead", "cancelled", "snoozed")


def counters(sql: psycopg.Connection[Any], queue: str = "default") -> dict[str, int]:
    """The queue's outcome totals, summed over shards."""
    row = sql.execute(
        "SELECT coalesce(sum(succeeded), 0), coalesce(sum(failed), 0), coalesce(sum(dead), 0),"
        " coalesce(sum(cancelled), 0), coalesce(sum(snoozed), 0)"
        " FROM pgqueue_counters WHERE queue = %s",
        (queue,),
    ).fetchone()
    assert row is not None
    return dict(zip(COUNTED, map(int, row), strict=True))


def db_now(sql: psycopg.Connection[Any]) -> datetime:
    row = sql.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def both_kinds(body: Any) -> dict[str, Any]:
    """The same handler body as an async and as a sync (thread-pool) handler."""

    async def as_async(job: Job) -> Any:
        return body(job)

    return {"async": as_async, "sync": body}


# -- snooze -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_job_that_snoozes_three_times_then_succeeds_has_used_one_attempt(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any], kind: str
) -> None:
    seen: list[tuple[int, int]] = []

    def body(job: Job) -> str:
        seen.append((job.attempts, job.snoozes))
        if job.snoozes < 3:
            raise Snooze(0)
        return "done"

    # One attempt only: a snooze counted as a failed attempt would end it dead.
    job = await aqueue.enqueue("s", max_attempts=1)
    async with running(AsyncWorker({"s": both_kinds(body)[kind]}, settings=settings)) as worker:
        done = await aqueue.wait(job.id, 30)
        await until(lambda: worker.stats["succeeded"] == 1)
    assert (done.state, done.result, done.attempts, done.snoozes) == (
        JobState.SUCCEEDED,
        "done",
        1,
        3,
    )
    assert seen == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert (worker.stats["snoozed"], worker.stats["failed"]) == (3, 0)
    assert counters(sql) == {"succeeded": 1, "failed": 0, "dead": 0, "cancelled": 0, "snoozed": 3}


def test_a_snooze_sets_run_at_by_the_database_clock_and_gives_the_attempt_back(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.enqueue("t", max_attempts=3)
    [job] = queue.claim(1, worker="w")
    before = db_now(sql)
    assert queue.finish([Outcome.snooze(job, 30)]) == {job.id: JobState.QUEUED}
    after = db_now(sql)
    row = queue.get(job.id)
    assert before + timedelta(seconds=30) <= row.run_at <= after + timedelta(seconds=30)
    assert (row.state, row.attempts, row.snoozes) == (JobState.QUEUED, 0, 1)
    assert (row.lease_expires_at, row.finished_at, row.last_error) == (None, None, None)
    assert queue.claim(1, worker="w") == []  # not before its time


async def test_a_snoozed_job_runs_again_only_after_its_delay_by_the_database_clock(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    asked_at: list[datetime] = []

    def handler(job: Job) -> None:
        if job.snoozes == 0:
            with psycopg.connect(settings.database_url) as conn:
                row = conn.execute("SELECT clock_timestamp()").fetchone()
            assert row is not None
            asked_at.append(row[0])
            raise Snooze(1.5)

    job = await aqueue.enqueue("s")
    s = settings.replace(poll_interval_seconds=0.2)
    async with running(AsyncWorker({"s": handler}, settings=s)):
        done = await aqueue.wait(job.id, 30)
    assert done.state is JobState.SUCCEEDED and done.snoozes == 1
    assert done.started_at is not None
    # run_at is the snooze's (a claim leaves it); the rerun started after it.
    assert (done.run_at - asked_at[0]).total_seconds() >= 1.5
    assert done.started_at >= done.run_at


@pytest.mark.parametrize("bound_from", ["task", "setting"])
async def test_past_max_snoozes_the_job_is_dead_with_a_clear_error(
    settings: Settings,
    aqueue: AsyncQueue,
    sql: psycopg.Connection[Any],
    bound_from: str,
) -> None:
    async def forever(job: Job) -> None:
        raise Snooze(0)

    handlers: Any = {"forever": forever}
    s = settings.replace(max_snoozes=2)
    if bound_from == "task":
        handlers = TaskRegistry()
        handlers.add("forever", forever, max_snoozes=2)
        s = settings.replace(max_snoozes=50)
    job = await aqueue.enqueue("forever", max_attempts=5)
    async with running(AsyncWorker(handlers, settings=s)):
        done = await aqueue.wait(job.id, 30)
    assert (done.state, done.attempts, done.snoozes) == (JobState.DEAD, 1, 2)
    assert "after 2 snoozes, the most allowed (max_snoozes 2)" in (done.last_error or "")
    assert counters(sql) == {"succeeded": 0, "failed": 1, "dead": 1, "cancelled": 0, "snoozed": 2}
    retried = await aqueue.retry(job.id)  # a fresh budget of snoozes too
    assert (retried.state, retried.attempts, retried.snoozes) == (JobState.QUEUED, 0, 0)


# -- cancel -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_cancel_from_a_handler_ends_the_job_cancelled_without_retry(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any], kind: str
) -> None:
    runs: list[int] = []

    def body(job: Job) -> None:
        runs.append(job.id)
        raise CancelJob("customer 42 was deleted")

    job = await aqueue.enqueue("c", max_attempts=5)
    async with running(AsyncWorker({"c": both_kinds(body)[kind]}, settings=settings)) as worker:
        done = await aqueue.wait(job.id, 30)  # waiters are told it ended
        await until(lambda: worker.stats["cancelled"] == 1)
    assert (done.state, done.attempts, done.last_error) == (
        JobState.CANCELLED,
        1,
        "customer 42 was deleted",
    )
    assert done.finished_at is not None and done.lease_expires_at is None
    assert runs == [job.id]
    assert worker.stats["failed"] == 0
    assert counters(sql) == {"succeeded": 0, "failed": 0, "dead": 0, "cancelled": 1, "snoozed": 0}


def test_one_finish_writes_successes_failures_snoozes_and_cancels_together(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.enqueue_many([{"task": "t"} for _ in range(4)])
    ok, snooze, cancel, fail = queue.claim(4, worker="w")
    states = queue.finish(
        [
            Outcome.cancel(cancel, "no\x00pe"),  # text PostgreSQL refuses is made storable
            Outcome.snooze(snooze, 60),
            Outcome.success(ok, {"n": 1}),
            Outcome.failure(fail, "boom"),
        ]
    )
    assert states == {
        ok.id: JobState.SUCCEEDED,
        snooze.id: JobState.QUEUED,
        cancel.id: JobState.CANCELLED,
        fail.id: JobState.QUEUED,
    }
    assert queue.get(cancel.id).last_error == "no\\0pe"
    assert counters(sql) == {"succeeded": 1, "failed": 1, "dead": 0, "cancelled": 1, "snoozed": 1}


# -- fencing ------------------------------------------------------------------------------


def test_a_stale_token_can_neither_snooze_nor_cancel(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.enqueue("t")
    [stale] = queue.claim(1, worker="old")
    fresh = take_over(queue, stale.id, worker="new")
    assert queue.finish([Outcome.snooze(stale, 0), Outcome.cancel(stale, "late")]) == {}
    now = queue.get(fresh.id)
    assert (now.state, now.worker, now.lease_token, now.attempts, now.snoozes) == (
        JobState.RUNNING,
        "new",
        fresh.lease_token,
        2,
        0,
    )
    assert counters(sql)["snoozed"] == 0 and counters(sql)["cancelled"] == 0
    assert queue.finish([Outcome.snooze(fresh, 0)]) == {fresh.id: JobState.QUEUED}


async def test_a_worker_whose_lease_was_taken_over_cannot_snooze_the_new_attempt(
    settings: Settings, queue: Queue, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    started = threading.Event()
    release = threading.Event()

    def slow(job: Job) -> None:
        started.set()
        release.wait(10)
        raise Snooze(0)

    job = await aqueue.enqueue("slow")
    s = settings.replace(heartbeat_seconds=29.0)  # no heartbeat during the test
    async with running(AsyncWorker({"slow": slow}, settings=s, concurrency=1)) as worker:
        await asyncio.to_thread(started.wait, 10)
        taken = take_over(queue, job.id, worker="other")
        release.set()
        await until(lambda: worker.held_count == 0)
    now = queue.get(job.id)
    assert (now.state, now.worker, now.lease_token, now.snoozes) == (
        JobState.RUNNING,
        "other",
        taken.lease_token,
        0,
    )
    assert (worker.stats["lost"], worker.stats["snoozed"]) == (1, 0)


# -- many workers ---------------------------------------------------------------------------


async def test_many_workers_snoozing_run_each_job_once_per_snooze_and_lose_none(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    runs: Counter[int] = Counter()
    lock = threading.Lock()

    def body(job: Job) -> int:
        with lock:
            runs[job.id] += 1
        if job.snoozes < 2:
            raise Snooze(0)
        return job.attempts

    kinds = both_kinds(body)
    total = 400
    await aqueue.enqueue_many(
        [{"task": "async" if i % 2 else "sync", "max_attempts": 1} for i in range(total)]
    )
    workers = [AsyncWorker(kinds, settings=settings, concurrency=8) for _ in range(4)]
    async with running(workers[0]), running(workers[1]), running(workers[2]), running(workers[3]):
        await until(lambda: sum(w.stats["succeeded"] for w in workers) == total, 60)
    assert sum(w.stats["snoozed"] for w in workers) == 2 * total
    assert all(w.stats["claimed"] > 0 for w in workers)
    assert len(runs) == total and set(runs.values()) == {3}
    rows = sql.execute(
        "SELECT state, attempts, snoozes, result, count(*) FROM pgqueue_jobs GROUP BY 1, 2, 3, 4"
    ).fetchall()
    assert rows == [("succeeded", 1, 2, 1, total)]
    assert counters(sql) == {
        "succeeded": total,
        "failed": 0,
        "dead": 0,
        "cancelled": 0,
        "snoozed": 2 * total,
    }


# -- what operators see ------------------------------------------------------------------


async def test_snoozes_show_in_metrics_queue_totals_and_the_job_not_as_failures(
    settings: Settings, queue: Queue
) -> None:
    job = queue.enqueue("t", queue="mail")
    for _ in range(2):
        [claimed] = queue.claim(1, worker="w", queues=["mail"])
        queue.finish([Outcome.snooze(claimed, 0)])
    async with api_client(settings) as api:
        metrics = (await api.get("/metrics")).text
        queues = (await api.get("/queues")).json()["queues"]
        shown = (await api.get(f"/jobs/{job.id}")).json()
    assert 'pgqueue_job_snoozes_total{queue="mail"} 2.0' in metrics
    assert 'pgqueue_job_failures_total{queue="mail"} 0.0' in metrics
    [mail] = queues
    assert mail["totals"]["snoozed"] == 2 and mail["totals"]["failed_attempts"] == 0
    assert (shown["snoozes"], shown["attempts"], shown["state"]) == (2, 0, "queued")


def test_the_migration_adds_the_counts_to_a_table_that_has_jobs(empty_db: str) -> None:
    migrated_before(empty_db, "0006")
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("INSERT INTO pgqueue_jobs (task) VALUES ('old')")
        conn.execute("INSERT INTO pgqueue_counters (queue, shard, failed) VALUES ('default', 0, 3)")
    assert "0006_snooze" in migrate(empty_db)
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT snoozes FROM pgqueue_jobs").fetchall() == [(0,)]
        assert conn.execute("SELECT failed, snoozed FROM pgqueue_counters").fetchall() == [(3, 0)]
