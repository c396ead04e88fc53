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
from pgqueue.worker import TaskRegistry


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


def test_extend_moves_run_at_later_never_earlier(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
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


def test_typed_tasks_pass_on_conflict_through(queue: Queue) -> None:
    registry = TaskRegistry()

    @registry.task
    def reindex(doc: str) -> None: ...

    first = reindex.using(queue, idempotency_key="doc", delay=60).enqueue("a")
    keyed = reindex.using(queue, idempotency_key="doc", on_conflict="extend", delay=120)
    again = keyed.enqueue("b")
    assert (again.id, again.debounced, again.payload) == (first.id, "extended", {"doc": "b"})


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


PRODUCERS = 50


def _race(
    db_url: str,
    queue: Queue,
    mode: str,
    *,
    delays: bool = True,
    claimer: Any = None,
    pooled: bool = False,
) -> list[tuple[Any, datetime, float]]:
    """PRODUCERS threads, each on its own connection, enqueue the same key at
    once with ``mode`` (and ``claimer`` runs beside them); each returns (its
    job, the database's clock just before its call, its delay). ``pooled``:
    each call on a connection of the queue's pool, as a retried call (with
    its reserved id and call key), instead of its thread's own."""
    barrier = threading.Barrier(PRODUCERS + (claimer is not None))
    results: list[tuple[Any, datetime, float]] = []
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as conn:
                delay = 30.0 + n if delays else 0.0  # each a different wait
                barrier.wait()
                before = _now(conn)
                job = queue.enqueue(
                    "t",
                    {"n": n},
                    idempotency_key="k",
                    on_conflict=mode,
                    delay=delay,
                    connection=None if pooled else conn,
                )
                results.append((job, before, delay))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(PRODUCERS)]
    if claimer is not None:
        threads.append(threading.Thread(target=lambda: (barrier.wait(), claimer())))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


@pytest.mark.parametrize(
    ("mode", "pooled"), [("replace", False), ("extend", False), ("extend", True)]
)
def test_concurrent_producers_leave_one_waiting_job(
    settings: Settings, sql: psycopg.Connection[Any], mode: str, pooled: bool
) -> None:
    wide = settings.replace(pool_max_size=PRODUCERS)
    with Queue(settings.database_url, settings=wide) as queue:
        results = _race(settings.database_url, queue, mode, pooled=pooled)
    assert len(results) == PRODUCERS
    ids = {job.id for job, _, _ in results}
    assert len(ids) == 1  # every call returned the one job
    assert sum(not job.duplicate for job, _, _ in results) == 1  # one created it
    assert all(job.debounced for job, _, _ in results if job.duplicate)
    # Each call's write was applied (none lost), and reads back as its own.
    assert all(job.payload == {"n": delay - 30} for job, _, delay in results)  # (delay: 30 + n)
    rows = sql.execute(
        "SELECT id, payload, run_at, state FROM pgqueue_jobs WHERE idempotency_key = 'k'"
    ).fetchall()
    assert len(rows) == 1 and rows[0][0] in ids and rows[0][3] == "queued"
    assert rows[0][1] in [{"n": n} for n in range(PRODUCERS)]
    if mode == "extend":
        latest = max(before + timedelta(seconds=delay) for _, before, delay in results)
        assert rows[0][2] >= latest


def test_a_job_claimed_during_the_race_keeps_the_payload_it_was_claimed_with(
    db_url: str, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    claimed: list[Any] = []

    def claim() -> None:
        while not claimed:
            claimed.extend(queue.claim(1, worker="w"))

    results = _race(db_url, queue, "replace", delays=False, claimer=claim)
    [job] = claimed
    rows = sql.execute(
        "SELECT payload, state FROM pgqueue_jobs WHERE id = %s", (job.id,)
    ).fetchall()
    assert rows == [(job.payload, "running")]  # no replace after the claim
    assert {r.id for r, _, _ in results} == {job.id}
    changed = [r for r, _, _ in results if r.debounced]
    assert all(r.state == "queued" for r in changed)
    assert sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone() == (1,)
