"""Enqueue from SQL with the rules of migrations 0037 and 0038: on_conflict
(a debounce that replaces or extends the waiting job holding the key),
batch (join an open batch, counted in it, its callbacks fired by the last
job) and depends_on (wait for existing jobs, planned as the library plans).
The property tests that the library and the SQL debounce and plan alike are
in test_sql_enqueue_property.py."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest
from psycopg import errors

from pgqueue import JobState, Outcome, Queue

Sql = psycopg.Connection[tuple[Any, ...]]


def one(sql: Sql, query: str, params: Any = None) -> Any:
    row = sql.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def enqueue(sql: Sql, payload: dict[str, Any], **named: Any) -> int:
    args = "".join(f", {name} => %({name})s" for name in named)
    return int(
        one(
            sql,
            f"SELECT pgqueue_enqueue('t', %(payload)s::jsonb{args})",
            {"payload": json.dumps(payload), **named},
        )
    )


def test_replace_writes_the_new_payload_into_the_waiting_holder(sql: Sql, queue: Queue) -> None:
    first = enqueue(sql, {"n": 1}, idempotency_key="k", delay_seconds=60.0, priority=1)
    again = enqueue(
        sql,
        {"n": 2},
        idempotency_key="k",
        delay_seconds=5.0,
        priority=3,
        metadata='{"v": 2}',
        on_conflict="replace",
    )
    job = queue.get(first)
    assert again == first
    assert (job.payload, job.priority, job.metadata) == ({"n": 2}, 3, {"v": 2})
    # replace keeps the holder's run_at (about a minute away), extend would not.
    assert one(sql, "SELECT run_at - enqueued_at > interval '50 s' FROM pgqueue_jobs") is True
    assert one(sql, "SELECT count(*) FROM pgqueue_jobs") == 1


def test_extend_moves_run_at_later_and_never_earlier(sql: Sql) -> None:
    first = enqueue(sql, {}, idempotency_key="k", delay_seconds=30.0)
    later = "SELECT run_at - now() FROM pgqueue_jobs WHERE id = %s"
    enqueue(sql, {}, idempotency_key="k", delay_seconds=120.0, on_conflict="extend")
    assert 119 < one(sql, later, [first]).total_seconds() <= 120
    enqueue(sql, {}, idempotency_key="k", delay_seconds=10.0, on_conflict="extend")
    assert 119 < one(sql, later, [first]).total_seconds() <= 120


def test_ignore_and_no_on_conflict_return_the_holder_unchanged(sql: Sql, queue: Queue) -> None:
    first = enqueue(sql, {"n": 1}, idempotency_key="k")
    assert enqueue(sql, {"n": 2}, idempotency_key="k", on_conflict="ignore") == first
    assert enqueue(sql, {"n": 3}, idempotency_key="k") == first
    assert queue.get(first).payload == {"n": 1}


def test_a_holder_that_started_is_not_changed(sql: Sql, queue: Queue) -> None:
    first = enqueue(sql, {"n": 1}, idempotency_key="k", unique_scope="active")
    [claimed] = queue.claim(1, worker="w")
    assert claimed.id == first
    assert (
        enqueue(sql, {"n": 2}, idempotency_key="k", unique_scope="active", on_conflict="replace")
        == first
    )
    assert queue.get(first).payload == {"n": 1}


def test_on_conflict_needs_a_key_and_one_of_three_words(sql: Sql) -> None:
    for named, problem in (
        ({"on_conflict": "replace"}, "on_conflict: needs a key"),
        ({"on_conflict": "ignore"}, "on_conflict: needs a key"),
        ({"on_conflict": "merge", "idempotency_key": "k"}, "on_conflict: must be one of"),
    ):
        with pytest.raises(errors.InvalidParameterValue, match=problem) as caught:
            enqueue(sql, {}, **named)
        assert caught.value.diag.column_name == "on_conflict"
    assert one(sql, "SELECT count(*) FROM pgqueue_jobs") == 0


def test_enqueue_many_debounces_in_the_order_given(sql: Sql, queue: Queue) -> None:
    jobs = [
        {"task": "t", "payload": {"n": n}, "idempotency_key": "k", "on_conflict": "replace"}
        for n in (1, 2, 3)
    ]
    ids = one(sql, "SELECT pgqueue_enqueue_many(%s::jsonb)", [json.dumps(jobs)])
    assert len(set(ids)) == 1
    assert queue.get(ids[0]).payload == {"n": 3}
    bad = [{"task": "t", "on_conflict": 1, "idempotency_key": "x"}]
    with pytest.raises(errors.InvalidParameterValue, match=r"jobs\[0\]\.on_conflict"):
        sql.execute("SELECT pgqueue_enqueue_many(%s::jsonb)", [json.dumps(bad)])


def test_concurrent_debounces_leave_one_job_with_the_latest_run_at(db_url: str, sql: Sql) -> None:
    # 20 producers extend one key at once: one row, and its run_at is the
    # furthest any of them asked for (extend never moves it earlier).
    barrier = threading.Barrier(20)
    ids: list[int] = []
    failures: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as conn:
                barrier.wait(10)
                ids.append(
                    enqueue(
                        conn,
                        {"n": n},
                        idempotency_key="k",
                        delay_seconds=float(100 + n),
                        on_conflict="extend",
                    )
                )
        except BaseException as exc:  # (a thread's error is the test's)
            failures.append(exc)

    before = one(sql, "SELECT now()")
    threads = [threading.Thread(target=produce, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not failures and len(set(ids)) == 1 and len(ids) == 20
    assert one(sql, "SELECT count(*) FROM pgqueue_jobs") == 1
    # Each producer's now() is after ``before``: the last one's 119 s
    # delay ends no earlier than before + 119 s, and none asked for later.
    assert one(sql, "SELECT run_at >= %s + interval '119 s' FROM pgqueue_jobs", [before])
    assert one(sql, "SELECT run_at <= now() + interval '119 s' FROM pgqueue_jobs")


def test_a_job_joins_an_open_batch_and_the_last_ack_fires_its_callback(
    sql: Sql, queue: Queue
) -> None:
    batch = queue.open_batch(on_finish={"task": "report"})
    first = enqueue(sql, {"n": 1}, batch=str(batch.id))
    ids = one(
        sql,
        "SELECT pgqueue_enqueue_many(%s::jsonb)",
        [json.dumps([{"task": "t", "batch": str(batch.id)}, {"task": "t", "batch": None}])],
    )
    assert queue.get_batch(batch.id).total == 2
    assert queue.get(ids[1]).batch_id is None
    queue.close_batch(batch.id)
    claimed = queue.claim(10, worker="w", queues=["default"])
    assert {job.id for job in claimed} == {first, *ids}
    queue.finish([Outcome.success(job, None) for job in claimed])
    done = queue.get_batch(batch.id)
    assert done.state == "finished" and done.succeeded == 2
    [callback] = [j for j in queue.claim(10, worker="w") if j.task == "report"]
    assert callback.metadata["batch"]["id"] == str(batch.id)
    assert queue.get(first).state is JobState.SUCCEEDED


def test_an_unknown_or_closed_batch_is_refused_and_nothing_is_written(
    sql: Sql, queue: Queue
) -> None:
    unknown = "00000000-0000-4000-8000-000000000000"
    with pytest.raises(errors.InvalidParameterValue, match="batch: no batch has the id") as caught:
        enqueue(sql, {}, batch=unknown)
    assert caught.value.diag.column_name == "batch"
    batch = queue.open_batch()
    member = enqueue(sql, {}, batch=str(batch.id))  # (closed, not finished, while it waits)
    queue.close_batch(batch.id)
    with pytest.raises(errors.ObjectNotInPrerequisiteState, match="is closed") as closed:
        enqueue(sql, {}, batch=str(batch.id))
    assert closed.value.diag.column_name == "batch"
    many = [{"task": "t"}, {"task": "t", "batch": "not-a-uuid"}]
    with pytest.raises(errors.InvalidParameterValue, match=r"jobs\[1\]\.batch: must be a batch id"):
        sql.execute("SELECT pgqueue_enqueue_many(%s::jsonb)", [json.dumps(many)])
    assert one(sql, "SELECT array_agg(id) FROM pgqueue_jobs") == [member]
    assert queue.get_batch(batch.id).total == 1


def test_a_dependent_waits_for_its_parents_and_gets_their_results(sql: Sql, queue: Queue) -> None:
    a, b = queue.enqueue("a").id, queue.enqueue("b").id
    child = enqueue(sql, {}, depends_on=[b, a, b])  # (a repeat counts once)
    job = queue.get(child)
    assert job.state is JobState.WAITING and list(job.depends_on or ()) == [b, a]
    for parent in queue.claim(2, worker="w", queues=["default"]):
        queue.finish([Outcome.success(parent, parent.task.upper())])
    [claimed] = queue.claim(1, worker="w")
    assert claimed.id == child and claimed.parents == ("B", "A")
    assert queue.dependents(a) == [child]


def test_a_parent_that_already_failed_applies_the_policy_at_once(sql: Sql, queue: Queue) -> None:
    dead = queue.enqueue("d", max_attempts=1)
    [claimed] = queue.claim(1, worker="w")
    queue.finish([Outcome.failure(claimed, "boom")])
    done = queue.enqueue("s").id
    cancelled = queue.get(enqueue(sql, {}, depends_on=[dead.id, done]))
    assert cancelled.state is JobState.CANCELLED and "failed or was cancelled" in str(
        cancelled.last_error
    )
    run = queue.get(enqueue(sql, {}, depends_on=[dead.id], on_dependency_failure="run"))
    assert run.state is JobState.QUEUED
    counted = "SELECT sum(cancelled) FROM pgqueue_counters WHERE queue = 'default'"
    assert one(sql, counted) == 1


def test_bad_dependencies_are_refused_and_nothing_is_written(sql: Sql, queue: Queue) -> None:
    parent = queue.enqueue("p").id
    batch = queue.open_batch()
    for named, column, problem in (
        ({"depends_on": [parent, 999]}, "depends_on", "no job with id 999"),
        ({"depends_on": [0]}, "depends_on", "positive integers"),
        ({"depends_on": []}, "depends_on", "list of 1 to"),
        ({"depends_on": [parent], "idempotency_key": "k"}, "depends_on", "cannot have a key"),
        ({"depends_on": [parent], "batch": str(batch.id)}, "batch", "cannot join a batch"),
        (
            {"depends_on": [parent], "on_dependency_failure": "skip"},
            "on_dependency_failure",
            "one of",
        ),
    ):
        with pytest.raises(errors.InvalidParameterValue, match=problem) as caught:
            enqueue(sql, {}, **named)
        assert caught.value.diag.column_name == column
    many = [{"task": "t", "depends_on": [parent]}, {"task": "t", "depends_on": [True]}]
    with pytest.raises(errors.InvalidParameterValue, match=r"jobs\[1\]\.depends_on"):
        sql.execute("SELECT pgqueue_enqueue_many(%s::jsonb)", [json.dumps(many)])
    assert one(sql, "SELECT count(*) FROM pgqueue_jobs") == 1
    assert one(sql, "SELECT count(*) FROM pgqueue_job_deps") == 0
    assert one(sql, "SELECT has_dependents FROM pgqueue_jobs WHERE id = %s", [parent]) is False


def test_enqueue_many_takes_dependencies_beside_keyed_jobs(sql: Sql, queue: Queue) -> None:
    parent = queue.enqueue("p").id
    jobs = [
        {"task": "k", "idempotency_key": "once"},
        {"task": "c", "depends_on": [parent], "on_dependency_failure": "run"},
        {"task": "k", "idempotency_key": "once"},
    ]
    ids = one(sql, "SELECT pgqueue_enqueue_many(%s::jsonb)", [json.dumps(jobs)])
    assert ids[0] == ids[2] != ids[1]
    child = queue.get(ids[1])
    assert (child.state, list(child.depends_on or ())) == (JobState.WAITING, [parent])


def test_an_archived_parent_is_taken_back_for_its_new_dependent(sql: Sql, queue: Queue) -> None:
    parent = queue.enqueue("p").id
    [claimed] = queue.claim(1, worker="w")
    queue.ack(claimed, "done")
    sql.execute(
        "UPDATE pgqueue_jobs SET finished_at = now() - interval '1 hour' WHERE id = %s", [parent]
    )
    assert queue.archive() == 1
    child = enqueue(sql, {}, depends_on=[parent])
    assert one(sql, "SELECT count(*) FROM pgqueue_jobs_archive") == 0
    assert one(sql, "SELECT has_dependents FROM pgqueue_jobs WHERE id = %s", [parent]) is True
    assert queue.get(child).state is JobState.QUEUED  # its parent had succeeded
    [ran] = queue.claim(1, worker="w")
    assert ran.id == child and ran.parents == ("done",)
