"""Claim, heartbeat, ack, fail, backoff, reap, cancel, retry, prune: the state machine."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest

from pgqueue import (
    JobAlreadyFinished,
    JobNotFound,
    JobNotRetryable,
    JobState,
    Outcome,
    Queue,
    Settings,
)


def expire_leases(sql: psycopg.Connection) -> None:
    sql.execute(
        "UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 second'"
        " WHERE state = 'running'"
    )


def make_runnable(sql: psycopg.Connection) -> None:
    sql.execute("UPDATE pgqueue_jobs SET run_at = now() WHERE state = 'queued'")


def test_claim_takes_a_batch_in_priority_then_age_order(queue: Queue) -> None:
    low = queue.enqueue("t", priority=0)
    high = queue.enqueue("t", priority=5)
    low2 = queue.enqueue("t", priority=0)
    claimed = queue.claim(2, worker="w")
    assert [j.id for j in claimed] == [high.id, low.id]
    assert [j.id for j in queue.claim(5, worker="w")] == [low2.id]


def test_claim_sets_a_lease_and_a_fresh_token_per_claim(
    queue: Queue, sql: psycopg.Connection
) -> None:
    queue.enqueue("t")
    [first] = queue.claim(1, worker="w1")
    assert first.state is JobState.RUNNING and first.attempts == 1 and first.worker == "w1"
    assert first.lease_expires_at - first.started_at == timedelta(
        seconds=queue.settings.lease_seconds
    )
    expire_leases(sql)
    queue.reap()
    make_runnable(sql)
    [second] = queue.claim(1, worker="w2")
    assert second.id == first.id and second.attempts == 2
    assert second.lease_token != first.lease_token


def test_claim_filters_by_queue(queue: Queue) -> None:
    queue.enqueue("t", queue="a")
    b = queue.enqueue("t", queue="b")
    assert [j.id for j in queue.claim(10, worker="w", queues=["b", "c"])] == [b.id]


def test_concurrent_claimers_never_get_the_same_job(settings: Settings) -> None:
    settings = settings.replace(pool_max_size=12)
    with Queue(settings.database_url, settings=settings) as queue:
        queue.enqueue_many([{"task": "t"} for _ in range(2000)])
        claimed: list[int] = []
        barrier = threading.Barrier(8)

        def claimer() -> None:
            barrier.wait()
            while batch := queue.claim(7, worker=threading.current_thread().name):
                claimed.extend(job.id for job in batch)

        threads = [threading.Thread(target=claimer) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(claimed) == 2000 and len(set(claimed)) == 2000


def test_heartbeat_extends_only_leases_still_held(queue: Queue, sql: psycopg.Connection) -> None:
    queue.enqueue_many([{"task": "t"}, {"task": "t"}])
    a, b = queue.claim(2, worker="w")
    queue.cancel(b.id)
    assert queue.heartbeat([a, b], lease_seconds=600) == {a.id}
    assert queue.get(a.id).lease_expires_at > a.lease_expires_at


def test_a_stale_token_cannot_ack_fail_or_heartbeat(queue: Queue, sql: psycopg.Connection) -> None:
    queue.enqueue("t")
    [stale] = queue.claim(1, worker="old")
    expire_leases(sql)
    queue.reap()
    make_runnable(sql)
    [fresh] = queue.claim(1, worker="new")
    assert queue.ack(stale, {"from": "old"}) is None
    assert queue.fail(stale, "late failure") is None
    assert queue.heartbeat([stale]) == set()
    assert queue.ack(fresh, {"from": "new"}) is JobState.SUCCEEDED
    assert queue.get(fresh.id).result == {"from": "new"}


def test_ack_stores_the_result_and_finishes(queue: Queue) -> None:
    queue.enqueue("t")
    [job] = queue.claim(1, worker="w")
    assert queue.ack(job, [1, "two", {"3": None}]) is JobState.SUCCEEDED
    done = queue.get(job.id)
    assert done.result == [1, "two", {"3": None}] and done.finished_at is not None
    assert done.lease_expires_at is None


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        (float("nan"), "not JSON-serialisable"),
        ({"x": object()}, "not JSON-serialisable"),
        ("a\x00b", "NUL character"),
    ],
)
def test_an_unstorable_result_is_a_failed_attempt(
    queue: Queue, result: object, reason: str
) -> None:
    queue.enqueue("t")
    [job] = queue.claim(1, worker="w")
    assert queue.ack(job, result) is JobState.QUEUED
    failed = queue.get(job.id)
    assert reason in failed.last_error and failed.result is None


def test_failure_backs_off_exponentially_with_jitter(queue: Queue, sql: psycopg.Connection) -> None:
    s = queue.settings  # base 0.5 s, cap 2 s
    queue.enqueue("t", max_attempts=10)
    for attempt in range(1, 5):
        make_runnable(sql)
        [job] = queue.claim(1, worker="w")
        assert job.attempts == attempt
        assert queue.fail(job, f"boom {attempt}") is JobState.QUEUED
        after = queue.get(job.id)
        delay = (after.run_at - sql.execute("SELECT now()").fetchone()[0]).total_seconds()
        full = min(s.backoff_cap_seconds, s.backoff_base_seconds * 2 ** (attempt - 1))
        assert full / 2 - 0.05 <= delay <= full + 0.01, (attempt, delay)
        assert after.last_error == f"boom {attempt}"


def test_dead_after_max_attempts(queue: Queue, sql: psycopg.Connection) -> None:
    queue.enqueue("t", max_attempts=2)
    states = []
    for _ in range(2):
        make_runnable(sql)
        [job] = queue.claim(1, worker="w")
        states.append(queue.fail(job, "no"))
    assert states == [JobState.QUEUED, JobState.DEAD]
    make_runnable(sql)
    assert queue.claim(1, worker="w") == []


def test_non_retryable_failure_is_dead_at_once(queue: Queue) -> None:
    queue.enqueue("t", max_attempts=5)
    [job] = queue.claim(1, worker="w")
    assert queue.fail(job, "bad input", retryable=False) is JobState.DEAD


def test_batch_finish_records_many_outcomes_in_one_call(queue: Queue) -> None:
    queue.enqueue_many([{"task": "t"} for _ in range(3)])
    a, b, c = queue.claim(3, worker="w")
    states = queue.finish([Outcome.success(a, 1), Outcome.failure(b, "x"), Outcome.success(c, 3)])
    assert states == {a.id: JobState.SUCCEEDED, b.id: JobState.QUEUED, c.id: JobState.SUCCEEDED}


def test_reap_returns_expired_leases_with_backoff(queue: Queue, sql: psycopg.Connection) -> None:
    queue.enqueue("t", max_attempts=3)
    [job] = queue.claim(1, worker="crashed")
    assert queue.reap() == {}  # lease still valid
    expire_leases(sql)
    assert queue.reap() == {job.id: JobState.QUEUED}
    assert queue.reap() == {}  # idempotent
    back = queue.get(job.id)
    assert back.last_error == "lease expired (worker crashed, attempt 1)"
    assert back.run_at > sql.execute("SELECT now()").fetchone()[0]  # backoff, not immediately


def test_reap_at_max_attempts_is_dead(queue: Queue, sql: psycopg.Connection) -> None:
    queue.enqueue("t", max_attempts=1)
    [job] = queue.claim(1, worker="w")
    expire_leases(sql)
    assert queue.reap() == {job.id: JobState.DEAD}


def test_concurrent_reapers_reap_each_job_once(queue: Queue, sql: psycopg.Connection) -> None:
    queue.enqueue_many([{"task": "t"} for _ in range(300)])
    queue.claim(300, worker="w")
    expire_leases(sql)
    reaped: list[int] = []
    while sql.execute("SELECT count(*) FROM pgqueue_jobs WHERE state = 'running'").fetchone()[0]:
        threads = [
            threading.Thread(target=lambda: reaped.extend(queue.reap(limit=20))) for _ in range(6)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted(reaped) == sorted(set(reaped)) and len(reaped) == 300
    totals = queue.read("counters_totals")
    assert totals[0]["failed"] == 300


def test_cancel_queued_and_running_jobs(queue: Queue) -> None:
    queued = queue.enqueue("t")
    running = queue.enqueue("t")
    queue.claim(1, worker="w")  # takes `queued` (older)
    assert queue.cancel(running.id).state is JobState.CANCELLED
    [held] = [j for j in [queue.get(queued.id)] if j.state is JobState.RUNNING]
    assert queue.cancel(held.id).state is JobState.CANCELLED
    assert queue.ack(held, "late") is None  # the lease was revoked


def test_cancel_of_a_finished_job_conflicts(queue: Queue) -> None:
    job = queue.enqueue("t")
    [claimed] = queue.claim(1, worker="w")
    queue.ack(claimed)
    with pytest.raises(JobAlreadyFinished, match=f"cannot cancel job {job.id}: it is succeeded"):
        queue.cancel(job.id)


def test_unknown_ids_are_not_found(queue: Queue) -> None:
    for call in (queue.get, queue.cancel, queue.retry):
        with pytest.raises(JobNotFound):
            call(987654)
    with pytest.raises(JobNotFound):
        queue.get(-1)


def test_retry_puts_a_dead_job_back_with_a_fresh_budget(queue: Queue) -> None:
    job = queue.enqueue("t", max_attempts=1)
    [claimed] = queue.claim(1, worker="w")
    queue.fail(claimed, "no")
    again = queue.retry(job.id)
    assert again.state is JobState.QUEUED and again.attempts == 0
    with pytest.raises(JobNotRetryable):
        queue.retry(job.id)
    assert [j.id for j in queue.claim(1, worker="w")] == [job.id]


def test_retry_dead_of_one_queue(queue: Queue) -> None:
    for name in ("a", "a", "b"):
        queue.enqueue("t", queue=name, max_attempts=1)
    for job in queue.claim(3, worker="w"):
        queue.fail(job, "no")
    assert queue.retry_dead("a") == 2
    assert {j.queue for j in queue.list_jobs(state="dead")} == {"b"}


def test_list_filters_and_keyset_pagination(queue: Queue) -> None:
    ids = [queue.enqueue("t", queue="q" if i % 2 else "r").id for i in range(7)]
    page1 = queue.list_jobs(queue="q", limit=2)
    page2 = queue.list_jobs(queue="q", limit=2, before_id=page1[-1].id)
    assert [j.id for j in page1 + page2] == [ids[5], ids[3], ids[1]]
    assert queue.list_jobs(task="other") == []
    assert len(queue.list_jobs(state="queued", limit=100)) == 7


def test_prune_deletes_old_finished_jobs_and_keeps_totals(
    queue: Queue, sql: psycopg.Connection
) -> None:
    queue.enqueue_many([{"task": "t"} for _ in range(5)])
    jobs = queue.claim(5, worker="w")
    for job in jobs[:3]:
        queue.ack(job)
    for job in jobs[3:]:
        queue.fail(job, "no", retryable=False)
    before = queue.read("counters_totals")
    assert queue.prune() == 0  # all within retention
    sql.execute("UPDATE pgqueue_jobs SET finished_at = now() - interval '30 days'")
    assert queue.prune(limit=2) == 2
    assert queue.prune() == 3
    assert sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()[0] == 0
    assert queue.read("counters_totals") == before
    assert before[0]["succeeded"] == 3 and before[0]["dead"] == 2


def test_latency_histogram_counts_every_start(queue: Queue) -> None:
    queue.enqueue_many([{"task": "t"} for _ in range(4)])
    queue.claim(4, worker="w")
    rows = queue.read("start_latency_histogram")
    assert sum(r["count"] for r in rows) == 4
