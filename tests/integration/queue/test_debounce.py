"""on_conflict (debounce): what an enqueue does to a waiting job that holds
its key: ignore it, replace its payload, or extend its wait. Enforced by
the database (job_debounce), under concurrent producers too."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, InvalidJob, Queue
from pgqueue.core.settings import Settings


def _now(sql: psycopg.Connection[Any]) -> datetime:
    row = sql.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_ignore_is_the_default_and_keeps_the_waiting_job(queue: Queue) -> None:
    first = queue.enqueue("t", {"n": 1}, idempotency_key="k", delay=60)
    again = queue.enqueue("t", {"n": 2}, idempotency_key="k", on_conflict="ignore")
    assert again.id == first.id and again.duplicate and again.debounced is None
    assert again.payload == {"n": 1}


def test_replace_writes_the_later_payload_metadata_and_priority(queue: Queue) -> None:
    first = queue.enqueue("t", {"n": 1}, idempotency_key="k", delay=60)
    again = queue.enqueue(
        "t", {"n": 2}, idempotency_key="k", on_conflict="replace", priority=7, metadata={"m": 1}
    )
    assert (again.id, again.duplicate, again.debounced) == (first.id, True, "replaced")
    assert (again.payload, again.priority, again.metadata) == ({"n": 2}, 7, {"m": 1})
    assert again.run_at == first.run_at  # replace keeps the wait
    assert queue.get(first.id).payload == {"n": 2}


def test_extend_moves_run_at_later_never_earlier(queue: Queue, sql: psycopg.Connection[Any]) -> None:
    first = queue.enqueue("t", {"n": 1}, idempotency_key="k", delay=60)
    shorter = queue.enqueue("t", {"n": 2}, idempotency_key="k", on_conflict="extend", delay=5)
    assert shorter.debounced == "extended" and shorter.run_at == first.run_at
    assert shorter.payload == {"n": 2}  # extend takes the new payload too
    before = _now(sql)
    longer = queue.enqueue("t", {"n": 3}, idempotency_key="k", on_conflict="extend", delay=600)
    assert longer.id == first.id and longer.run_at >= before + timedelta(seconds=600)


def test_a_running_job_is_never_replaced_nor_extended(queue: Queue) -> None:
    first = queue.enqueue("t", {"n": 1}, idempotency_key="k", unique_scope="active")
    [claimed] = queue.claim(1, worker="w")
    assert claimed.id == first.id
    for mode in ("replace", "extend"):
        again = queue.enqueue(
            "t", {"n": 2}, idempotency_key="k", unique_scope="active", on_conflict=mode, delay=60
        )
        assert (again.id, again.duplicate, again.debounced) == (first.id, True, None)
    job = queue.get(first.id)
    assert job.payload == {"n": 1} and job.run_at == claimed.run_at


def test_a_key_let_go_makes_a_new_job(queue: Queue) -> None:
    first = queue.enqueue("t", {"n": 1}, idempotency_key="k", unique_scope="queued")
    queue.claim(1, worker="w")
    again = queue.enqueue(
        "t", {"n": 2}, idempotency_key="k", unique_scope="queued", on_conflict="replace"
    )
    assert again.id != first.id and not again.duplicate and again.payload == {"n": 2}


def test_enqueue_many_later_jobs_of_a_key_win_in_order(queue: Queue) -> None:
    waiting = queue.enqueue("t", {"n": 0}, idempotency_key="a", delay=60)
    results = queue.enqueue_many(
        [
            {"task": "t", "payload": {"n": 1}, "idempotency_key": "a", "on_conflict": "replace"},
            {"task": "t", "payload": {"n": 2}, "idempotency_key": "b", "on_conflict": "replace"},
            {"task": "t", "payload": {"n": 3}, "idempotency_key": "b", "on_conflict": "replace"},
            {"task": "t", "payload": {"n": 4}, "idempotency_key": "b"},
        ]
    )
    assert [(r.created, r.debounced) for r in results] == [
        (False, "replaced"),
        (True, None),
        (False, "replaced"),
        (False, None),
    ]
    assert results[0].id == waiting.id and results[1].id == results[2].id == results[3].id
    assert queue.get(waiting.id).payload == {"n": 1}
    assert queue.get(results[1].id).payload == {"n": 3}


async def test_async_queue_and_group_commit_debounce(settings: Settings) -> None:
    async with AsyncQueue(settings.database_url, settings=settings, group_commit=True) as q:
        first = await q.enqueue("t", {"n": 1}, idempotency_key="k", delay=60)
        again = await q.enqueue("t", {"n": 2}, idempotency_key="k", on_conflict="extend", delay=90)
        assert (again.id, again.debounced, again.payload) == (first.id, "extended", {"n": 2})
        assert again.run_at > first.run_at


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"idempotency_key": "k", "on_conflict": "merge"}, "on_conflict"),
        ({"on_conflict": "replace"}, "on_conflict"),
        ({"on_conflict": "ignore"}, "on_conflict"),
    ],
)
def test_bad_on_conflict_is_refused_naming_the_field(
    queue: Queue, sql: psycopg.Connection[Any], fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidJob) as caught:
        queue.enqueue("t", {}, **fields)
    assert caught.value.field == field
    with pytest.raises(InvalidJob) as in_batch:
        queue.enqueue_many([{"task": "t"}, {"task": "t", **fields}])
    assert in_batch.value.field == f"jobs[1].{field}"
    assert sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone() == (0,)
