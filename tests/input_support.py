"""Helpers of the tests of what enqueue accepts, on every surface (the job
shape, unstorable text, the round-trip rule)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, InvalidJob, Queue


def count_jobs(sql: psycopg.Connection[Any]) -> int:
    return sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()[0]  # type: ignore[index]


async def refusals(queue: Queue, aqueue: AsyncQueue, fields: dict[str, Any]) -> list[InvalidJob]:
    """The InvalidJob of each enqueue path for one job's ``fields`` (task
    included): Queue.enqueue, AsyncQueue.enqueue, and enqueue_many with the
    job second in the batch. A path that does not raise fails the test."""
    args = dict(fields)
    task, payload = args.pop("task"), args.pop("payload", None)
    raised = []
    with pytest.raises(InvalidJob) as sync:
        queue.enqueue(task, payload, **args)
    raised.append(sync.value)
    with pytest.raises(InvalidJob) as async_:
        await aqueue.enqueue(task, payload, **args)
    raised.append(async_.value)
    with pytest.raises(InvalidJob) as batch:
        queue.enqueue_many([{"task": "fine"}, fields])
    raised.append(batch.value)
    return raised
