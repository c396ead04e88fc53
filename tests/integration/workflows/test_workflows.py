"""Workflows against a real PostgreSQL: dependencies, chains, groups and
fan-in with results passed along, failure policies, refusals that write
nothing, and two parents acked at once releasing their child once."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgqueue import BatchClosed, InvalidJob, Job, JobState, Queue, WorkflowNotFound, chain, group


def step(task: str, **payload: Any) -> dict[str, Any]:
    return {"task": task, "payload": payload}


def run_all(queue: Queue, handler: Any = None, limit: int = 100) -> list[Job]:
    """Claim and ack until nothing is runnable; the claimed jobs in order."""
    done: list[Job] = []
    while True:
        jobs = queue.claim(limit)
        if not jobs:
            return done
        for job in jobs:
            queue.ack(
                job, handler(job) if handler else {"id": job.id, "parents": list(job.parents)}
            )
        done += jobs


def test_a_dependent_job_waits_until_its_dependency_succeeds(queue: Queue) -> None:
    parent = queue.enqueue("p")
    child = queue.enqueue("c", depends_on=[parent.id])
    assert child.state is JobState.WAITING
    assert child.depends_on == [parent.id]
    [claimed] = queue.claim(10)
    assert claimed.id == parent.id
    queue.ack(claimed, 7)
    [claimed_child] = queue.claim(10)
    assert claimed_child.id == child.id
    assert claimed_child.parents == (7,)


def test_chain_passes_each_result_to_the_next_step(queue: Queue) -> None:
    made = queue.enqueue_workflow(chain(step("a"), step("b"), step("c")))
    a, b, c = made.jobs
    assert [j.state for j in made.jobs] == [JobState.QUEUED, JobState.WAITING, JobState.WAITING]
    order = run_all(queue, lambda job: [job.task, *job.parents])
    assert [j.task for j in order] == ["a", "b", "c"]
    assert queue.get(c.id).result == ["c", ["b", ["a"]]]
    assert queue.workflow(made.id).edges() == [(a.id, b.id), (b.id, c.id)]


def test_fan_in_receives_every_result_in_order(queue: Queue) -> None:
    made = queue.enqueue_workflow(chain(group(*(step("part", n=n) for n in range(5))), step("sum")))
    *parts, total = made.jobs
    run_all(queue, lambda job: sum(job.parents) if job.task == "sum" else job.payload["n"] * 10)
    assert queue.get(total.id).result == 100
    assert queue.get(total.id).depends_on == [p.id for p in parts]


def states(queue: Queue, jobs: list[Job]) -> list[JobState]:
    return [queue.get(job.id).state for job in jobs]


def test_a_dead_dependency_cancels_its_dependents_transitively(queue: Queue) -> None:
    made = queue.enqueue_workflow(chain(step("a"), step("b"), step("c")))
    [a] = queue.claim(10)
    assert queue.fail(a, "boom", retryable=False) is JobState.DEAD
    assert states(queue, made.jobs) == [JobState.DEAD, JobState.CANCELLED, JobState.CANCELLED]
    assert queue.claim(10) == []
    totals = {row["queue"]: row for row in queue.read("counters_totals")}
    assert totals["default"]["cancelled"] == 2


def test_run_anyway_releases_the_dependent_as_if_its_dependency_succeeded(queue: Queue) -> None:
    a = queue.enqueue("a")
    b = queue.enqueue("b")
    c = queue.enqueue("c", depends_on=[a.id, b.id], on_dependency_failure="run")
    for job in queue.claim(10):
        if job.id == a.id:
            queue.fail(job, "boom", retryable=False)
        else:
            queue.ack(job, "b done")
    [claimed] = queue.claim(10)
    assert claimed.id == c.id
    assert claimed.parents == (None, "b done")


def test_cancelling_a_waiting_job_cancels_its_dependents(queue: Queue) -> None:
    made = queue.enqueue_workflow(chain(step("a"), step("b"), group(step("c"), step("d"))))
    a, b, c, d = made.jobs
    queue.cancel(b.id)
    assert states(queue, [a, b, c, d]) == [
        JobState.QUEUED,
        JobState.CANCELLED,
        JobState.CANCELLED,
        JobState.CANCELLED,
    ]


def test_a_dependency_that_already_ended_counts_at_once(queue: Queue) -> None:
    done = queue.enqueue("a")
    queue.ack(queue.claim(1)[0], 1)
    dead = queue.enqueue("b", max_attempts=1)
    queue.fail(queue.claim(1)[0], "boom")
    ready = queue.enqueue("c", depends_on=[done.id])
    cancelled = queue.enqueue("d", depends_on=[done.id, dead.id])
    anyway = queue.enqueue("e", depends_on=[dead.id], on_dependency_failure="run")
    assert ready.state is JobState.QUEUED
    assert cancelled.state is JobState.CANCELLED
    assert anyway.state is JobState.QUEUED


def count_rows(sql: psycopg.Connection[Any]) -> tuple[int, int]:
    jobs = sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()
    edges = sql.execute("SELECT count(*) FROM pgqueue_job_deps").fetchone()
    assert jobs is not None and edges is not None
    return jobs[0], edges[0]


def test_unknown_ids_are_refused_and_nothing_is_written(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    parent = queue.enqueue("p")
    with pytest.raises(InvalidJob, match="no job with id 999") as caught:
        queue.enqueue("c", depends_on=[parent.id, 999])
    assert caught.value.field == "depends_on"
    with pytest.raises(InvalidJob, match="no job with id 999"):
        queue.enqueue_many([{"task": "x"}, {"task": "c", "depends_on": [999]}])
    assert count_rows(sql) == (1, 0)
    assert queue.get(parent.id).state is JobState.QUEUED
    with pytest.raises(InvalidJob) as named:
        queue.enqueue_many([{"task": "x"}, {"task": "y"}, {"task": "c", "depends_on": [999]}])
    assert named.value.field == "jobs[2].depends_on"
    assert count_rows(sql) == (1, 0)


def test_a_bulk_enqueue_with_dependencies_keeps_its_other_jobs_keys_and_batches(
    queue: Queue,
) -> None:
    parent = queue.enqueue("p")
    holder = queue.enqueue("h", {"v": 1}, idempotency_key="k", delay_seconds=60)
    batch = queue.open_batch()
    made = queue.enqueue_many(
        [
            {"task": "h", "payload": {"v": 2}, "idempotency_key": "k", "on_conflict": "replace"},
            {"task": "c", "depends_on": [parent.id]},
            {"task": "b", "batch": str(batch.id)},
            {"task": "u", "idempotency_key": "fresh"},
        ]
    )
    assert [r.created for r in made] == [False, True, True, True]
    assert made[0].id == holder.id and made[0].debounced == "replaced"
    assert queue.get(holder.id).payload == {"v": 2}
    assert queue.get(made[1].id).state is JobState.WAITING
    assert queue.get(made[2].id).batch_id == batch.id
    assert queue.get_batch(batch.id).total == 1
    assert queue.get(made[3].id).idempotency_key == "fresh"
    queue.close_batch(batch.id)
    with pytest.raises(BatchClosed) as closed:
        queue.enqueue_many(
            [{"task": "c", "depends_on": [parent.id]}, {"task": "b", "batch": str(batch.id)}]
        )
    assert closed.value.field == "jobs[1].batch"


@pytest.mark.parametrize(
    ("jobs", "field", "problem"),
    [
        (
            [
                {"name": "a", "task": "t", "depends_on": ["c"]},
                {"name": "b", "task": "t", "depends_on": ["a"]},
                {"name": "c", "task": "t", "depends_on": ["b"]},
            ],
            "depends_on",
            "cycle: a -> b -> c -> a",
        ),
        ([{"name": "a", "task": "t", "depends_on": ["a"]}], "depends_on", "cycle: a -> a"),
        ([{"name": "a", "task": "t", "depends_on": ["x"]}], "jobs[0].depends_on", "'x'"),
        ([{"name": "a", "task": "t"}, {"name": "a", "task": "t"}], "jobs[1].name", "two jobs"),
        ([{"task": "t"}], "jobs[0].name", "must be a string"),
        ([{"name": "a", "task": "t", "idempotency_key": "k"}], "jobs[0].idempotency_key", "key"),
        ([{"name": "a", "task": "t", "priority": "high"}], "jobs[0].priority", "integer"),
    ],
)
def test_a_bad_workflow_is_refused_and_nothing_is_written(
    queue: Queue, sql: psycopg.Connection[Any], jobs: list[dict[str, Any]], field: str, problem: str
) -> None:
    with pytest.raises(InvalidJob, match=problem) as caught:
        queue.enqueue_workflow(jobs)
    assert caught.value.field == field
    assert count_rows(sql) == (0, 0)


def test_a_workflow_in_a_rolled_back_transaction_leaves_nothing(
    queue: Queue, db_url: str, sql: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(db_url) as conn:
        made = queue.enqueue_workflow(
            chain(group(step("a"), step("b")), step("c")), connection=conn
        )
        assert len(made.jobs) == 3
        conn.rollback()
    assert count_rows(sql) == (0, 0)
    with psycopg.connect(db_url) as conn:
        made = queue.enqueue_workflow(chain(step("a"), step("b")), connection=conn)
    assert count_rows(sql) == (2, 1)
    assert queue.workflow(made.id).counts()["waiting"] == 1


def test_named_jobs_make_the_same_graph(queue: Queue) -> None:
    made = queue.enqueue_workflow(
        [
            {"name": "sum", "task": "sum", "depends_on": ["x", "y"]},
            {"name": "x", "task": "part", "payload": {"n": 1}},
            {"name": "y", "task": "part", "payload": {"n": 2}},
        ]
    )
    total, x, y = made.jobs
    assert total.state is JobState.WAITING and total.depends_on == [x.id, y.id]
    run_all(queue, lambda job: sum(job.parents) if job.task == "sum" else job.payload["n"])
    assert queue.get(total.id).result == 3


def test_workflow_cancel_and_retry(queue: Queue) -> None:
    made = queue.enqueue_workflow(chain(step("a"), step("b"), step("c")))
    after = queue.workflow(made.id, "cancel")
    assert after.counts()["cancelled"] == 3
    after = queue.workflow(str(made.id), "retry")
    assert [j.state for j in after.jobs] == [JobState.QUEUED, JobState.WAITING, JobState.WAITING]
    assert [j.task for j in run_all(queue)] == ["a", "b", "c"]
    assert queue.workflow(made.id).counts()["succeeded"] == 3


def test_retry_runs_only_the_failed_steps_again(queue: Queue) -> None:
    made = queue.enqueue_workflow(chain(step("a"), step("b"), step("c")))
    queue.ack(queue.claim(1)[0], "a")
    queue.fail(queue.claim(1)[0], "boom", retryable=False)
    assert queue.workflow(made.id).counts() == {
        "waiting": 0,
        "queued": 0,
        "running": 0,
        "succeeded": 1,
        "dead": 1,
        "cancelled": 1,
    }
    queue.workflow(made.id, "retry")
    assert [j.task for j in run_all(queue)] == ["b", "c"]
    c = queue.get(made.jobs[2].id)
    assert c.result["parents"] == [{"id": made.jobs[1].id, "parents": ["a"]}]


def test_an_unknown_workflow_is_not_found(queue: Queue) -> None:
    for bad in ("nope", "6f1c1f1e-0000-4000-8000-000000000000"):
        with pytest.raises(WorkflowNotFound):
            queue.workflow(bad)


def test_waiting_jobs_are_listed_counted_and_bulk_cancelled(queue: Queue) -> None:
    made = queue.enqueue_workflow(chain(step("a"), group(step("b"), step("c"))))
    assert {j.id for j in queue.list_jobs(state="waiting")} == {j.id for j in made.jobs[1:]}
    [row] = queue.read("queue_stats")
    assert (row["queued"], row["waiting"]) == (1, 2)
    assert queue.bulk_cancel(state="waiting") == 2
    assert queue.workflow(made.id).counts()["cancelled"] == 2


def test_a_job_reaped_dead_cancels_its_dependents(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    made = queue.enqueue_workflow(chain({"task": "a", "max_attempts": 1}, step("b")))
    [a] = queue.claim(1)
    expire = "UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s"
    sql.execute(expire, [a.id])
    assert queue.reap() == {a.id: JobState.DEAD}
    assert queue.get(made.jobs[1].id).state is JobState.CANCELLED


def test_pruning_a_parent_removes_its_edges(queue: Queue, sql: psycopg.Connection[Any]) -> None:
    made = queue.enqueue_workflow(chain(step("a"), step("b")))
    run_all(queue)
    sql.execute("UPDATE pgqueue_jobs SET finished_at = now() - interval '30 days'")
    assert queue.prune() == 2
    assert count_rows(sql) == (0, 0)
    assert made.jobs[1].depends_on == [made.jobs[0].id]


def test_the_order_check_of_the_crash_test_catches_a_step_run_too_early(
    queue: Queue, db_url: str, sql: psycopg.Connection[Any]
) -> None:
    from harness.fault_tasks import create_deliveries
    from harness.invariants import dependency_violations

    create_deliveries(db_url)
    a, b = queue.enqueue_workflow(chain(step("a"), step("b"))).jobs
    [claimed] = queue.claim(1)
    deliver = (
        "INSERT INTO fault_deliveries (job_id, attempt, token, worker_pid) VALUES (%s, 1, 1, 1)"
    )
    sql.execute(deliver, [a.id])
    sql.execute(deliver, [b.id])  # b "started" before a finished
    queue.ack(claimed)
    [violation] = dependency_violations(db_url)
    assert violation.startswith(f"job {b.id} (queued, first started ")
    assert f"depends on job {a.id} (succeeded, finished " in violation
