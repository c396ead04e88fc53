"""Priority aging (priority_aging_seconds): a waiting job of negative
priority gains one level per interval, up to 0, so that a stream of
default-priority jobs cannot starve it; the claim's order is untouched."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, InvalidSettings, Job, JobState, Queue, Settings
from pgqueue.core import transitions as t
from pgqueue.worker import AsyncWorker
from tests.support import running

AGING = 0.05


def _row(sql: psycopg.Connection[Any], job_id: int) -> tuple[Any, ...]:
    row = sql.execute(
        "SELECT priority, state, run_at, aged_at FROM pgqueue_jobs WHERE id = %s", [job_id]
    ).fetchone()
    assert row is not None
    return row


def test_a_low_priority_job_overtakes_the_stream_once_aged_to_0(
    settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    aging = settings.replace(priority_aging_seconds=AGING)
    with Queue(settings.database_url, settings=aging) as queue:
        low = queue.enqueue("low", priority=-2)
        stream = [queue.enqueue("high").id for _ in range(3)]
        claimed: list[Any] = []
        while not any(job.id == low.id for job in claimed):
            assert len(claimed) < 1000, "the low-priority job starved"
            queue.run(t.age_priorities(aging))
            claimed += queue.claim(1, worker="w", queues=["default"])
            stream.append(queue.enqueue("high").id)  # never fewer than 3 waiting
            time.sleep(AGING / 5)  # (pacing: the steps need time to pass)
        [mine] = [job for job in claimed if job.id == low.id]
    priority, _, run_at, aged_at = _row(sql, low.id)
    assert mine.priority == priority == 0  # raised to 0, never past it
    # Two steps, each after a full interval of waiting (the database's clock).
    assert (aged_at - run_at).total_seconds() >= 2 * AGING
    # At 0 it is the oldest: it went before default-priority jobs enqueued before it rose.
    left = sql.execute(
        "SELECT count(*) FROM pgqueue_jobs WHERE state = 'queued' AND enqueued_at < %s",
        [aged_at],
    ).fetchone()
    assert left is not None and left[0] >= 1


def test_aging_leaves_other_jobs_alone(settings: Settings, sql: psycopg.Connection[Any]) -> None:
    aging = settings.replace(priority_aging_seconds=AGING)
    with Queue(settings.database_url, settings=aging) as queue:
        default = queue.enqueue("t")
        later = queue.enqueue("t", priority=-1, delay=3600)
        started = queue.enqueue("t", priority=-1, queue="busy")
        queue.claim(1, worker="w", queues=["busy"])
        time.sleep(AGING * 2)
        fresh = queue.enqueue("t", priority=-1)  # runnable, but not for an interval yet
        assert queue.run(t.age_priorities(aging)) == []
    assert _row(sql, default.id)[0] == 0
    assert _row(sql, later.id)[:2] == (-1, "queued")
    assert _row(sql, started.id)[:2] == (-1, "running")
    assert _row(sql, fresh.id)[0] == -1


def test_priority_aging_seconds_is_checked(settings: Settings) -> None:
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidSettings, match="priority_aging_seconds"):
            settings.replace(priority_aging_seconds=bad)
    with pytest.raises(InvalidSettings, match="priority_aging_batch"):
        settings.replace(priority_aging_batch=0)


async def test_the_workers_maintenance_ages_a_starved_job(
    settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    """A worker busy with a stream of default-priority jobs (each adds two
    more: the backlog only grows) runs a job of priority -3 once aging
    raised it to 0, ahead of stream jobs older than its last step."""
    # prefetch 0: each claim takes the one job at the head of the queue.
    aging = settings.replace(priority_aging_seconds=AGING, prefetch=0)
    async with AsyncQueue(settings.database_url, settings=aging) as aqueue:

        async def work(job: Job) -> None:
            if job.payload.get("stream"):
                await aqueue.enqueue_many([{"task": "work", "payload": {"stream": True}}] * 2)

        low = await aqueue.enqueue("work", priority=-3)
        await aqueue.enqueue_many([{"task": "work", "payload": {"stream": True}}] * 5)
        async with running(AsyncWorker({"work": work}, settings=aging, concurrency=1)):
            done = await aqueue.wait(low.id, timeout=60)
    assert done.state is JobState.SUCCEEDED and done.priority == 0
    assert done.started_at is not None
    # The bound docs/howto/limits.md promises (3 steps of at most 1.6
    # intervals), by the database's clock, with 1 s for the claim that
    # follows and a busy machine: without aging it would never start.
    waited = (done.started_at - done.run_at).total_seconds()
    assert waited <= 1.6 * 3 * AGING + 1.0, waited
    passed = sql.execute(
        "SELECT count(*) FROM pgqueue_jobs WHERE priority = 0 AND id <> %s AND run_at < %s"
        " AND (started_at IS NULL OR started_at > %s)",
        [low.id, done.started_at, done.started_at],
    ).fetchone()
    assert passed is not None and passed[0] >= 1  # it went ahead of waiting stream jobs
