"""Where a workflow's jobs are found (migration 0014): the range of their
ids, each job also tested for its workflow id; the range's row goes with
the workflow's last pruned job; workflows stored before 0014 are found."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from pgqueue import Queue, Settings, WorkflowNotFound, chain, group
from pgqueue.db.migrate import migrate
from tests.support import migrated_before


def step(task: str) -> dict[str, Any]:
    return {"task": task}


def test_another_producers_job_inside_the_range_is_not_part_of_the_workflow(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    before = queue.enqueue("plain")
    made = queue.enqueue_workflow(chain(step("a"), group(step("b"), step("c"))))
    after = queue.enqueue("plain")
    # As if the ids had been reserved while other producers took some.
    sql.execute(
        "UPDATE pgqueue_workflows SET first_job = %s, last_job = %s WHERE id = %s",
        (before.id, after.id, made.id),
    )
    ids = [job.id for job in made.jobs]
    assert [job.id for job in queue.workflow(made.id).jobs] == ids
    assert queue.workflow(made.id, "cancel").counts()["cancelled"] == 3
    assert queue.get(before.id).state == queue.get(after.id).state == "queued"
    assert [job.id for job in queue.workflow(made.id, "retry").jobs] == ids
    assert queue.get(before.id).attempts == 0


def test_the_workflow_row_goes_with_its_last_pruned_job(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    made = queue.enqueue_workflow(chain(step("a"), step("b")))
    kept = queue.enqueue_workflow(chain(step("c")))
    queue.workflow(made.id, "cancel")
    queue.workflow(kept.id, "cancel")
    first, second = (job.id for job in made.jobs)
    age = "UPDATE pgqueue_jobs SET finished_at = now() - interval '30 days' WHERE id = %s"
    sql.execute(age, (first,))
    assert queue.prune() == 1
    assert [job.id for job in queue.workflow(made.id).jobs] == [second]
    sql.execute(age, (second,))
    assert queue.prune() == 1
    with pytest.raises(WorkflowNotFound):
        queue.workflow(made.id)
    rows = sql.execute("SELECT id FROM pgqueue_workflows").fetchall()
    assert rows == [(kept.id,)]


def test_workflows_stored_before_the_migration_are_found(empty_db: str) -> None:
    migrated_before(empty_db, "0014")
    workflow = uuid.uuid4()
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("INSERT INTO pgqueue_jobs (task) VALUES ('outside')")
        conn.execute(
            "INSERT INTO pgqueue_jobs (task, workflow_id) VALUES ('a', %s), ('b', %s)",
            (workflow, workflow),
        )
    assert "0014_workflow_ranges" in migrate(empty_db)
    with Queue(empty_db, settings=Settings(database_url=empty_db)) as queue:
        assert [job.task for job in queue.workflow(workflow).jobs] == ["a", "b"]
    with psycopg.connect(empty_db) as conn:
        indexes = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes")}
    assert "pgqueue_jobs_workflow" not in indexes
