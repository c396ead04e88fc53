"""Parents of one child acked at the same moment, in many statements at
once, release the child once: never lost (stuck waiting), never counted
below zero, never deadlocked."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import psycopg

from pgqueue import JobState, Queue, Settings, chain, group

PARENTS = 6
CHILDREN = 3
ROUNDS = 25


def ack_at_once(settings: Settings, queue: Queue) -> None:
    """Claim every parent, then ack each in its own thread, all released together."""
    parents = queue.claim(PARENTS)
    assert len(parents) == PARENTS
    barrier = threading.Barrier(PARENTS)
    errors: list[BaseException] = []

    def ack(job: Any) -> None:
        try:
            barrier.wait()
            assert queue.ack(job, job.id) is JobState.SUCCEEDED
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=ack, args=(job,)) for job in parents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_concurrent_acks_of_every_parent_release_each_child_once(
    settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    # A pool as large as the threads, so that every ack has a connection of its own.
    settings = dataclasses.replace(settings, pool_max_size=PARENTS + 2)
    with Queue(settings.database_url, settings=settings) as queue:
        for _ in range(ROUNDS):
            parts = group(*({"task": "part"} for _ in range(PARENTS)))
            # Every child depends on every parent: the releases overlap.
            made = queue.enqueue_workflow(
                chain(parts, group(*({"task": "c"} for _ in range(CHILDREN))))
            )
            ack_at_once(settings, queue)
            children = made.jobs[PARENTS:]
            rows = sql.execute(
                "SELECT state, waiting_on FROM pgqueue_jobs WHERE id = ANY(%s)",
                [[c.id for c in children]],
            ).fetchall()
            assert rows == [("queued", 0)] * CHILDREN
            claimed = queue.claim(10)
            assert sorted(j.id for j in claimed) == [c.id for c in children]
            assert all(j.parents == tuple(p.id for p in made.jobs[:PARENTS]) for j in claimed)
            for job in claimed:
                queue.ack(job)
