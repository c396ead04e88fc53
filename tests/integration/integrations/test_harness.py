"""The fault harness checks what it claims: the invariant checker passes a
clean run and names each broken invariant, and the table builders make the
table they describe."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from harness import fault_tasks, invariants
from harness.history import LIVE_LOAD, add_finished_jobs, add_live_load
from pgqueue import Job, Queue


@pytest.fixture
def deliveries(db_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    fault_tasks.create_deliveries(db_url)
    monkeypatch.setenv("FAULT_DB_URL", db_url)
    return db_url


def _claim_one(queue: Queue) -> Job:
    [job] = queue.claim(1, worker="harness-test")
    return job


def test_a_clean_run_passes(queue: Queue, deliveries: str) -> None:
    queue.enqueue_many([{"task": "work", "payload": {"ms": 0}} for _ in range(3)])
    while claimed := queue.claim(1, worker="harness-test"):
        queue.ack(claimed[0], fault_tasks.work(claimed[0]))
    report = invariants.check(deliveries)
    report.assert_ok()
    assert report.states == {"succeeded": 3}
    assert report.deliveries == report.jobs_delivered == 3


def test_a_job_left_running_is_not_finished(queue: Queue, deliveries: str) -> None:
    queue.enqueue("work", {"ms": 0})
    fault_tasks.work(_claim_one(queue))
    report = invariants.check(deliveries)
    assert list(report.violations) == ["not_finished"]
    with pytest.raises(AssertionError, match="not_finished: 1"):
        report.assert_ok()


def test_a_claim_delivered_twice_is_reported(queue: Queue, deliveries: str) -> None:
    queue.enqueue("work", {"ms": 0})
    job = _claim_one(queue)
    fault_tasks.work(job)
    queue.ack(job, fault_tasks.work(job))  # the handler ran twice for one claim
    report = invariants.check(deliveries)
    assert set(report.violations) == {"claim_delivered_twice"}
    assert report.duplicate_deliveries == 1


def test_a_result_not_from_the_last_delivery_is_reported(queue: Queue, deliveries: str) -> None:
    queue.enqueue("work", {"ms": 0})
    job = _claim_one(queue)
    result: dict[str, Any] = fault_tasks.work(job)
    queue.ack(job, result | {"attempt": job.attempts + 1})
    assert set(invariants.check(deliveries).violations) == {"result_not_last_delivery"}


def test_counters_that_disagree_with_the_rows_are_reported(queue: Queue, deliveries: str) -> None:
    queue.enqueue("work", {"ms": 0})
    job = _claim_one(queue)
    queue.ack(job, fault_tasks.work(job))
    with psycopg.connect(deliveries, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue_counters SET succeeded = succeeded + 1")
    assert set(invariants.check(deliveries).violations) == {"counters_disagree"}


def test_the_live_load_is_what_it_says(sql: psycopg.Connection[Any]) -> None:
    add_live_load(sql)
    row = sql.execute(
        "SELECT count(*) FILTER (WHERE state = 'queued' AND run_at <= now()),"
        " count(*) FILTER (WHERE state = 'queued' AND run_at > now()),"
        " count(*) FILTER (WHERE state = 'running'), count(DISTINCT queue) FROM pgqueue_jobs"
    ).fetchone()
    assert row == tuple(LIVE_LOAD[k] for k in ("queued", "scheduled", "running", "queues"))


def test_finished_jobs_are_made_the_way_production_makes_them(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    add_finished_jobs(queue, 250, queue_name="old")
    row = sql.execute(
        "SELECT count(*) FILTER (WHERE state = 'succeeded' AND attempts = 1"
        " AND lease_token IS NOT NULL), count(*) FROM pgqueue_jobs WHERE queue = 'old'"
    ).fetchone()
    assert row == (250, 250)
