"""Bulk cancel, retry and delete by filter, from the library, against a real
PostgreSQL: a flood cleared while workers drain it, counters kept right,
each filter, dry runs, and bad filters refused before anything is written."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgqueue import BulkAction, InvalidJob, JobFilter, JobState, Queue
from pgqueue.core.outcomes import Outcome
from tests.support import query_plan

FLOOD = 20_000


def count(sql: psycopg.Connection[Any], where: str = "true", *params: Any) -> int:
    row = sql.execute(f"SELECT count(*) FROM pgqueue_jobs WHERE {where}", params).fetchone()
    assert row is not None
    return int(row[0])


def cancelled_total(sql: psycopg.Connection[Any], queue: str) -> int:
    row = sql.execute(
        "SELECT coalesce(sum(cancelled), 0) FROM pgqueue_counters WHERE queue = %s", (queue,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def snapshot(sql: psycopg.Connection[Any]) -> list[Any]:
    return (
        sql.execute("SELECT * FROM pgqueue_jobs ORDER BY id").fetchall()
        + sql.execute("SELECT * FROM pgqueue_counters ORDER BY queue, shard").fetchall()
    )


class Drainers:
    """Threads that claim from one queue and ack after a pause, as workers
    do; they count the acks refused because the job was cancelled meanwhile."""

    def __init__(self, queue: Queue, name: str, threads: int = 4) -> None:
        self.queue, self.name = queue, name
        self.stop = threading.Event()
        self.refused = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.drain) for _ in range(threads)]

    def drain(self) -> None:
        while not self.stop.is_set():
            jobs = self.queue.claim(50, worker="drainer", queues=[self.name])
            self.stop.wait(0.005)  # the jobs are running now
            states = self.queue.finish([Outcome.success(job, None) for job in jobs])
            with self.lock:
                self.refused += len(jobs) - len(states)

    def __enter__(self) -> Drainers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def test_a_flood_is_cancelled_while_workers_drain_it(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.enqueue_many([{"task": "flood", "queue": "flood"} for _ in range(FLOOD)])
    queue.enqueue_many([{"task": "mail", "queue": "mail"} for _ in range(100)])
    with Drainers(queue, "flood") as drainers:
        while count(sql, "state = 'succeeded'") < 200:  # the workers are at it
            drainers.stop.wait(0.01)
        cancelled = queue.bulk_cancel(queue="flood")
    assert count(sql, "queue = 'flood' AND state IN ('queued', 'running')") == 0
    succeeded = count(sql, "queue = 'flood' AND state = 'succeeded'")
    assert cancelled == count(sql, "queue = 'flood' AND state = 'cancelled'")
    assert succeeded + cancelled == FLOOD and succeeded >= 200
    # Counters say what the rows say, and every running job that was
    # cancelled lost its lease: its worker's ack matched nothing.
    assert cancelled_total(sql, "flood") == cancelled
    assert drainers.refused == count(
        sql, "state = 'cancelled' AND started_at IS NOT NULL AND lease_expires_at IS NULL"
    )
    assert count(sql, "queue = 'mail' AND state = 'queued'") == 100


def test_a_producer_still_enqueuing_does_not_keep_a_bulk_cancel_going(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.enqueue_many([{"task": "t"} for _ in range(5000)])
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            queue.enqueue_many([{"task": "t"} for _ in range(200)])

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        [row] = queue.read("db_now")
        cancelled = queue.bulk_cancel(task="t")
    finally:
        stop.set()
        producer.join()
    # Everything enqueued before the action began is cancelled; the action
    # ended although the producer kept the queue full.
    assert count(sql, "state = 'queued' AND enqueued_at < %s", row["now"]) == 0
    assert cancelled >= 5000 and cancelled == count(sql, "state = 'cancelled'")


def test_running_jobs_are_cancelled_with_their_lease_and_counted(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.enqueue_many([{"task": "t", "queue": q} for q in ("a", "a", "a", "b")])
    running = queue.claim(2, worker="w", queues=["a"])
    assert queue.bulk_cancel(queue="a", state="running") == 2
    assert [queue.ack(job) for job in running] == [None, None]
    assert count(sql, "state = 'cancelled' AND lease_expires_at IS NULL") == 2
    assert count(sql, "state = 'queued'") == 2
    assert (cancelled_total(sql, "a"), cancelled_total(sql, "b")) == (2, 0)


def test_a_dry_run_counts_and_changes_nothing(queue: Queue, sql: psycopg.Connection[Any]) -> None:
    queue.enqueue_many([{"task": "t"} for _ in range(30)])
    [job] = queue.claim(1, worker="w")
    queue.fail(job, "boom", retryable=False)
    before = snapshot(sql)
    assert queue.bulk_cancel(dry_run=True) == 29
    assert queue.bulk_retry(dry_run=True) == 1
    assert queue.bulk_delete(JobFilter(state="dead"), dry_run=True) == 1
    assert snapshot(sql) == before


def test_retry_by_error_text_gives_a_fresh_attempt_budget(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.enqueue_many([{"task": "t", "max_attempts": 1} for _ in range(4)])
    errors = ["timeout talking to smtp", "bad address", "smtp timeout", "Timeout"]
    for job, error in zip(queue.claim(4, worker="w"), errors, strict=True):
        queue.fail(job, error)
    assert queue.bulk_retry(error_contains="timeout") == 2
    retried = sql.execute(
        "SELECT last_error, attempts, started_at FROM pgqueue_jobs WHERE state = 'queued'"
        " ORDER BY id"
    ).fetchall()
    assert retried == [("timeout talking to smtp", 0, None), ("smtp timeout", 0, None)]


def test_delete_takes_finished_jobs_only_and_keeps_the_totals(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.enqueue_many([{"task": "t"} for _ in range(6)])
    done, failed, running = queue.claim(3, worker="w")
    queue.ack(done)
    queue.fail(failed, "boom", retryable=False)
    queue.cancel(queue.list_jobs(state="queued")[0].id)
    totals = queue.read("counters_totals")
    assert queue.bulk_delete(all=True) == 3
    assert count(sql) == 3 and queue.get(running.id).state is JobState.RUNNING
    assert queue.read("counters_totals") == totals


def backdate(sql: psycopg.Connection[Any], ids: list[int], column: str, hours: int) -> None:
    sql.execute(
        f"UPDATE pgqueue_jobs SET {column} = now() - make_interval(hours => %s) WHERE id = ANY(%s)",
        (hours, ids),
    )


@pytest.mark.parametrize(
    ("action", "where", "expected"),
    [
        (BulkAction.CANCEL, {"queue": "b"}, ["b-new"]),
        (BulkAction.CANCEL, {"task": "old"}, ["a-old"]),
        (BulkAction.CANCEL, {"enqueued_before": timedelta(hours=1)}, ["a-old"]),
        (BulkAction.CANCEL, {"enqueued_before": 3600}, ["a-old"]),
        (BulkAction.CANCEL, {"state": "queued", "queue": "a"}, ["a-new", "a-old"]),
        (BulkAction.DELETE, {"finished_before": timedelta(hours=1)}, ["dead-old"]),
        (BulkAction.DELETE, {"state": "succeeded"}, ["ok"]),
        (BulkAction.RETRY, {"error_contains": "disk"}, ["dead-old"]),
        (BulkAction.RETRY, {"finished_before": datetime(2000, 1, 1).astimezone()}, []),
    ],
)
def test_each_filter_picks_its_jobs(
    queue: Queue,
    sql: psycopg.Connection[Any],
    action: BulkAction,
    where: dict[str, Any],
    expected: list[str],
) -> None:
    names = ["a-old", "a-new", "b-new", "ok", "dead-old", "dead-new"]
    specs = [
        {"task": "old", "queue": "a", "payload": {"n": "a-old"}},
        {"task": "t", "queue": "a", "payload": {"n": "a-new"}},
        {"task": "t", "queue": "b", "payload": {"n": "b-new"}},
        *({"task": "t", "queue": "c", "payload": {"n": n}} for n in names[3:]),
    ]
    ids = dict(zip(names, (r.id for r in queue.enqueue_many(specs)), strict=True))
    ok, dead_old, dead_new = queue.claim(3, worker="w", queues=["c"])
    queue.ack(ok)
    queue.fail(dead_old, "disk full", retryable=False)
    queue.fail(dead_new, "network down", retryable=False)
    backdate(sql, [ids["a-old"]], "enqueued_at", 2)
    backdate(sql, [ids["dead-old"]], "finished_at", 2)
    before = {j.id: j.state for j in queue.list_jobs()}
    assert queue.bulk(action, **where) == len(expected)
    changed = {name for name, i in ids.items() if _state(sql, i) != before[i]}
    assert changed == set(expected)


def test_a_selection_of_ids_takes_those_of_them_the_action_applies_to(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.enqueue_many([{"task": "t"}] * 4)
    first, second = queue.claim(2, worker="w", queues=["default"])
    queue.ack(first)
    queue.fail(second, "boom", retryable=False)
    done, dead = first.id, second.id
    queued, other = (j.id for j in queue.list_jobs(state="queued"))
    selection = [queued, done, dead]
    assert queue.bulk_cancel(ids=selection, dry_run=True) == 1
    assert queue.bulk_cancel(ids=selection) == 1
    assert _state(sql, queued) is JobState.CANCELLED and _state(sql, other) is JobState.QUEUED
    assert queue.bulk_delete(ids=[done, other]) == 1
    assert _state(sql, done) is None and _state(sql, other) is JobState.QUEUED
    assert queue.bulk_retry(JobFilter(ids=(dead, dead))) == 1
    assert _state(sql, dead) is JobState.QUEUED


def _state(sql: psycopg.Connection[Any], job_id: int) -> JobState | None:
    row = sql.execute("SELECT state FROM pgqueue_jobs WHERE id = %s", (job_id,)).fetchone()
    return None if row is None else JobState(row[0])


@pytest.mark.parametrize(
    ("action", "where", "field", "problem"),
    [
        (
            BulkAction.CANCEL,
            {"state": "succeeded"},
            "state",
            "cancel applies to waiting or queued or running",
        ),
        (BulkAction.RETRY, {"state": "queued"}, "state", "retry applies to dead or cancelled"),
        (BulkAction.DELETE, {"state": "running"}, "state", "not running"),
        (BulkAction.CANCEL, {"finished_before": 60}, "finished_before", "not finished ones"),
        (BulkAction.CANCEL, {"state": "nope"}, "state", "must be one of"),
        (BulkAction.CANCEL, {"queue": "no spaces"}, "queue", "not a valid queue name"),
        (BulkAction.CANCEL, {"queu": "a"}, "queu", "unknown filter"),
        (BulkAction.DELETE, {"enqueued_before": -1}, "enqueued_before", "at least 0"),
        (BulkAction.DELETE, {"enqueued_before": "yesterday"}, "enqueued_before", "ISO 8601"),
        (BulkAction.DELETE, {"enqueued_before": "2030-01-01T00:00:00"}, "enqueued_before", "zone"),
        (BulkAction.RETRY, {"error_contains": ""}, "error_contains", "1 to 1000"),
        (BulkAction.RETRY, {"error_contains": "\x00"}, "error_contains", "NUL"),
        (BulkAction.CANCEL, {}, "all", "no filter given: this would cancel every waiting"),
        (BulkAction.DELETE, {"all": False}, "all", "give a filter, or all"),
        (BulkAction.DELETE, {"all": 1}, "all", "true or false"),
        (BulkAction.CANCEL, {"ids": []}, "ids", "list of 1 to 1000 job ids"),
        (BulkAction.CANCEL, {"ids": [1, "2"]}, "ids", "positive integers"),
    ],
)
def test_a_bad_filter_names_its_field_and_writes_nothing(
    queue: Queue,
    sql: psycopg.Connection[Any],
    action: BulkAction,
    where: dict[str, Any],
    field: str,
    problem: str,
) -> None:
    queue.enqueue_many([{"task": "t"} for _ in range(3)])
    before = snapshot(sql)
    with pytest.raises(InvalidJob, match=problem) as caught:
        queue.bulk(action, **where)
    assert caught.value.field == field
    assert snapshot(sql) == before


def test_a_filter_object_or_keywords_not_both(queue: Queue) -> None:
    assert queue.bulk_cancel(JobFilter(queue="a")) == queue.bulk_cancel(queue="a") == 0
    with pytest.raises(TypeError, match="not both"):
        queue.bulk_cancel(JobFilter(queue="a"), task="t")


async def test_the_async_queue_has_the_same_actions(aqueue: Any) -> None:
    await aqueue.enqueue_many([{"task": "t"} for _ in range(3)])
    assert await aqueue.bulk_cancel(task="t", dry_run=True) == 3
    assert await aqueue.bulk_cancel(task="t") == 3
    assert await aqueue.bulk_retry(task="t") == 3
    await aqueue.bulk_cancel(all=True)
    assert await aqueue.bulk_delete(state="cancelled") == 3


def test_each_batch_reads_the_partial_index_of_its_states(sql: psycopg.Connection[Any]) -> None:
    params: dict[str, Any] = {
        **dict.fromkeys(
            ("task", "enqueued_before", "finished_before", "error_contains", "error_kind", "ids")
        ),
        **dict.fromkeys(("after_at", "after_id")),
        "started_at": datetime.now().astimezone(),
        "dry_run": False,
        "limit": 1000,
        "queue": "flood",
    }

    def plan(action: BulkAction, states: list[str]) -> str:
        name = "job_bulk_cancel" if action is BulkAction.CANCEL else "job_bulk_finished"
        return query_plan(sql, name, {**params, "action": action, "states": states})

    cancel = plan(BulkAction.CANCEL, ["queued", "running"])
    assert "pgqueue_jobs_claim_queue" in cancel and "pgqueue_jobs_reap" in cancel
    assert "pgqueue_jobs_finished" not in cancel
    delete = plan(BulkAction.DELETE, ["succeeded", "dead", "cancelled"])
    assert "Index Scan using pgqueue_jobs_finished" in delete
    assert "pgqueue_jobs_claim" not in delete
