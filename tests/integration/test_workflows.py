"""Workflows against a real PostgreSQL: dependencies, chains, groups and
fan-in with results passed along, failure policies, refusals that write
nothing, and two parents acked at once releasing their child once."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgqueue import InvalidJob, Job, JobState, Queue, chain, group


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
            queue.ack(job, handler(job) if handler else {"id": job.id, "parents": list(job.parents)})
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
