"""Batches against a real PostgreSQL: callbacks enqueued exactly once when a
closed batch's last job ends (on_success, on_death, on_finish), at the close
when every job had ended, the counts handed to them, and refusals that write
nothing."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgqueue import (
    BatchClosed,
    BatchNotFound,
    BatchState,
    InvalidJob,
    Job,
    JobState,
    Queue,
)


def callback_jobs(queue: Queue, task: str) -> list[Job]:
    return [job for job in queue.list_jobs(limit=1000) if job.task == task]


def run_all(queue: Queue, fail: set[int] = frozenset(), tasks: tuple[str, ...] = ("work",)) -> None:  # type: ignore[assignment]
    while True:
        jobs = [job for job in queue.claim(100) if job.task in tasks]
        if not jobs:
            return
        for job in jobs:
            if job.id in fail:
                queue.fail(job, "boom", retryable=False)
            else:
                queue.ack(job, job.id)


def count(sql: psycopg.Connection[Any], table: str) -> int:
    row = sql.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def test_success_callback_runs_once_with_the_batch_counts(queue: Queue) -> None:
    batch = queue.open_batch(
        on_success={"task": "done", "payload": {"x": 1}, "queue": "callbacks"},
        on_death={"task": "died"},
        on_finish={"task": "finished"},
        metadata={"order": 7},
    )
    assert batch.state is BatchState.OPEN
    jobs = [queue.enqueue("work", batch=batch.id) for _ in range(3)]
    assert all(job.batch_id == batch.id for job in jobs)
    run_all(queue)
    assert callback_jobs(queue, "done") == []  # still open
    closed = queue.close_batch(batch.id)
    assert closed.state is BatchState.FINISHED
    [done] = callback_jobs(queue, "done")
    [finished] = callback_jobs(queue, "finished")
    assert callback_jobs(queue, "died") == []
    assert done.queue == "callbacks" and done.payload == {"x": 1}
    assert done.metadata == {
        "batch": {
            "id": str(batch.id),
            "callback": "on_success",
            "total": 3,
            "succeeded": 3,
            "dead": 0,
            "cancelled": 0,
            "metadata": {"order": 7},
        }
    }
    shown = queue.get_batch(str(batch.id))
    assert shown.callback_jobs == {"on_success": done.id, "on_finish": finished.id}
    assert (shown.total, shown.pending, shown.succeeded) == (3, 0, 3)
    assert shown.counts == {"succeeded": 3}
    # Closing again changes nothing and fires nothing.
    assert queue.close_batch(batch.id).state is BatchState.FINISHED
    assert len(callback_jobs(queue, "done")) == 1
