"""Batches against a real PostgreSQL: callbacks enqueued exactly once when a
closed batch's last job ends (on_success, on_death, on_finish), at the close
when every job had ended, the counts handed to them, and refusals that write
nothing."""

from __future__ import annotations

from collections.abc import Collection
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


def run_all(queue: Queue, fail: Collection[int] = ()) -> None:
    """Claim and end the jobs of the queue "batch" until none is left: those
    in ``fail`` die, the others succeed. (Callback jobs stay queued.)"""
    while True:
        jobs = queue.claim(100, queues=["batch"])
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
    jobs = [queue.enqueue("work", queue="batch", batch=batch.id) for _ in range(3)]
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


def test_a_death_fires_on_death_and_on_finish_not_on_success(queue: Queue) -> None:
    batch = queue.open_batch(
        on_success={"task": "done"}, on_death={"task": "died"}, on_finish={"task": "finished"}
    )
    jobs = [queue.enqueue("work", queue="batch", batch=batch.id, max_attempts=1) for _ in range(3)]
    queue.close_batch(batch.id)
    run_all(queue, fail={jobs[1].id})
    assert callback_jobs(queue, "done") == []
    [died] = callback_jobs(queue, "died")
    assert len(callback_jobs(queue, "finished")) == 1
    assert died.metadata is not None
    assert died.metadata["batch"]["succeeded"] == 2
    assert died.metadata["batch"]["dead"] == 1
    shown = queue.get_batch(batch.id)
    assert shown.state is BatchState.FINISHED
    assert shown.counts == {"succeeded": 2, "dead": 1}


def test_a_cancelled_job_ends_it_too_but_is_no_success(queue: Queue) -> None:
    batch = queue.open_batch(on_success={"task": "done"}, on_finish={"task": "finished"})
    kept = queue.enqueue("work", queue="batch", batch=batch.id)
    dropped = queue.enqueue("work", queue="batch", batch=batch.id)
    queue.close_batch(batch.id)
    queue.cancel(dropped.id)
    run_all(queue)
    assert queue.get(kept.id).state is JobState.SUCCEEDED
    assert callback_jobs(queue, "done") == []
    [finished] = callback_jobs(queue, "finished")
    assert finished.metadata is not None
    assert finished.metadata["batch"]["cancelled"] == 1


def test_the_last_ack_after_the_close_fires_and_an_empty_batch_fires_at_its_close(
    queue: Queue,
) -> None:
    batch = queue.open_batch(on_success={"task": "done"})
    queue.enqueue("work", queue="batch", batch=batch.id)
    assert queue.close_batch(batch.id).state is BatchState.CLOSED
    assert callback_jobs(queue, "done") == []
    run_all(queue)
    assert len(callback_jobs(queue, "done")) == 1
    empty = queue.open_batch(on_success={"task": "empty_done"})
    assert queue.close_batch(empty.id).state is BatchState.FINISHED
    assert len(callback_jobs(queue, "empty_done")) == 1


def test_a_dead_job_retried_before_the_batch_finished_counts_again(queue: Queue) -> None:
    batch = queue.open_batch(on_success={"task": "done"}, on_death={"task": "died"})
    job = queue.enqueue("work", queue="batch", batch=batch.id, max_attempts=1)
    run_all(queue, fail={job.id})
    assert queue.get_batch(batch.id).dead == 1
    queue.retry(job.id)
    assert (queue.get_batch(batch.id).dead, queue.get_batch(batch.id).pending) == (0, 1)
    queue.close_batch(batch.id)
    run_all(queue)
    assert len(callback_jobs(queue, "done")) == 1
    assert callback_jobs(queue, "died") == []


def test_joining_an_unknown_or_closed_batch_is_refused_and_writes_nothing(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    unknown = "6f1c1f1e-0000-4000-8000-000000000000"
    with pytest.raises(BatchNotFound) as not_found:
        queue.enqueue("work", batch=unknown)
    assert not_found.value.field == "batch"
    batch = queue.open_batch(on_success={"task": "done"})
    queue.close_batch(batch.id)
    with pytest.raises(BatchClosed) as closed:
        queue.enqueue("work", queue="batch", batch=batch.id)
    assert closed.value.field == "batch"
    with pytest.raises(BatchClosed) as closed_many:
        queue.enqueue_many([{"task": "work"}, {"task": "work", "batch": str(batch.id)}])
    assert closed_many.value.field == "jobs[1].batch"
    assert count(sql, "pgqueue_jobs WHERE task = 'work'") == 0
    with pytest.raises(BatchNotFound):
        queue.close_batch(unknown)
    with pytest.raises(BatchNotFound):
        queue.get_batch("not-a-uuid")


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda q: q.enqueue("work", batch="nope"), "batch"),
        (lambda q: q.open_batch(on_death="died"), "on_death"),
        (lambda q: q.open_batch(metadata=[1]), "metadata"),
    ],
)
def test_bad_batch_input_names_the_field(
    queue: Queue, sql: psycopg.Connection[Any], call: Any, field: str
) -> None:
    with pytest.raises(InvalidJob) as bad:
        call(queue)
    assert bad.value.field == field
    assert count(sql, "pgqueue_batches") + count(sql, "pgqueue_jobs") == 0


def test_bad_callbacks_and_a_batch_with_dependencies_name_the_field(queue: Queue) -> None:
    with pytest.raises(InvalidJob) as priority:
        queue.open_batch(on_success={"task": "done", "priority": "high"})
    assert priority.value.field == "on_success.priority"
    with pytest.raises(InvalidJob) as key:
        queue.open_batch(on_finish={"task": "done", "idempotency_key": "k"})
    assert key.value.field == "on_finish.idempotency_key"
    batch = queue.open_batch()
    parent = queue.enqueue("parent")
    with pytest.raises(InvalidJob) as both:
        queue.enqueue("work", queue="batch", batch=batch.id, depends_on=[parent.id])
    assert both.value.field == "batch"


def test_a_bulk_cancel_and_a_reap_end_jobs_of_a_batch_too(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    batch = queue.open_batch(on_death={"task": "died"}, on_finish={"task": "finished"})
    for _ in range(3):
        queue.enqueue("work", queue="batch", batch=batch.id, max_attempts=1)
    queue.close_batch(batch.id)
    [lost] = queue.claim(1, queues=["batch"])
    sql.execute(
        "UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
        [lost.id],
    )
    assert queue.reap() == {lost.id: JobState.DEAD}
    assert callback_jobs(queue, "finished") == []
    assert queue.bulk_cancel(queue="batch") == 2
    shown = queue.get_batch(batch.id)
    assert (shown.state, shown.dead, shown.cancelled, shown.pending) == (
        BatchState.FINISHED,
        1,
        2,
        0,
    )
    assert len(callback_jobs(queue, "died")) == len(callback_jobs(queue, "finished")) == 1


def test_a_finished_batch_is_pruned_after_the_retention_period(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    old = queue.open_batch()
    queue.close_batch(old.id)
    young = queue.open_batch()
    queue.close_batch(young.id)
    open_one = queue.open_batch()
    sql.execute(
        "UPDATE pgqueue_batches SET finished_at = now() - interval '30 days' WHERE id <> %s",
        [young.id],
    )
    queue.prune()
    with pytest.raises(BatchNotFound):
        queue.get_batch(old.id)
    assert queue.get_batch(young.id).state is BatchState.FINISHED
    assert queue.get_batch(open_one.id).state is BatchState.OPEN
