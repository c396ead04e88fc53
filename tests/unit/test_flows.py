"""The state machine's flows and the driver, without a database: each flow
is driven over a scripted session that answers by statement name."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from pgqueue import JobAlreadyFinished, JobNotRetryable, JobSpec, JobState, Settings, driver
from pgqueue import transitions as t
from pgqueue.queue import EveryQueue
from pgqueue.sql import migration_versions
from pgqueue.transitions import Statement
from tests.unit.memory import MemoryDatabase, MemorySession

Answer = Callable[[dict[str, Any]], list[Any]]


class Scripted:
    """A session that answers each statement name with a function of its
    parameters, and records what was sent."""

    def __init__(self, **answers: Answer) -> None:
        self.answers = answers
        self.sent: list[Statement] = []

    def execute(self, statement: Statement) -> list[Any]:
        self.sent.append(statement)
        return self.answers[statement.name](statement.params)


SETTINGS = Settings()


def test_enqueue_returns_the_existing_job_when_its_key_is_taken() -> None:
    db = MemoryDatabase()
    existing = db.add("t", idempotency_key="k")
    session = Scripted(
        job_enqueue=lambda p: [],
        job_get_by_idempotency_key=lambda p: db.execute(
            Statement("job_get", {"id": existing}, jobs=True)
        ),
    )
    job = driver.run(t.enqueue(JobSpec.build("t", idempotency_key="k")), session)
    assert (job.id, job.duplicate) == (existing, True)
    assert [s.name for s in session.sent] == ["job_enqueue", "job_get_by_idempotency_key"]


def test_enqueue_gives_up_when_a_key_keeps_changing_hands() -> None:
    session = Scripted(job_enqueue=lambda p: [], job_get_by_idempotency_key=lambda p: [])
    with pytest.raises(RuntimeError, match="kept changing hands"):
        driver.run(t.enqueue(JobSpec.build("t", idempotency_key="k")), session)
    assert len(session.sent) == 6


@pytest.mark.parametrize(
    ("queues", "sent_queues", "shares"),
    [(None, ["a", "b"], [3, 2]), (["a"], ["a"], [5]), (["b", "a", "b"], ["b", "a"], [3, 2])],
)
def test_claim_walks_each_queues_index_with_a_share_of_the_slots(
    queues: list[str] | None, sent_queues: list[str], shares: list[int]
) -> None:
    db = MemoryDatabase()
    db.add(queue="a"), db.add(queue="b")  # (no queue named: the queues that have jobs)
    driver.run(t.claim(SETTINGS, limit=5, worker="w", queues=queues, turn=0), db)
    sent = db.sent("job_claim")[0]
    assert (sent.params["queues"], sent.params["shares"], sent.jobs) == (sent_queues, shares, True)


def test_round_robin_splits_the_slots_and_the_turn_says_who_gets_the_rest() -> None:
    assert t.round_robin(5, ["a", "b", "c"], 0) == {"a": 2, "b": 2, "c": 1}
    assert t.round_robin(5, ["a", "b", "c"], 1) == {"b": 2, "c": 2, "a": 1}
    # Fewer slots than queues: the turn moves on with each claim, so each gets its go.
    assert [t.round_robin(1, ["a", "b", "c"], turn) for turn in range(4)] == [
        {"a": 1},
        {"b": 1},
        {"c": 1},
        {"a": 1},
    ]


def test_a_sparse_queue_is_asked_for_one_job_first_and_the_others_for_all() -> None:
    assert t.round_robin(10, ["a", "b", "c"], 0, sparse={"b"}) == {"b": 1, "a": 5, "c": 5}
    assert t.round_robin(10, ["a", "b"], 0, sparse={"a", "b"}) == {"a": 5, "b": 5}
    db = MemoryDatabase()
    for _ in range(20):
        db.add(queue="flood")
    trickle = db.add(queue="trickle")
    # One statement: what the sparse queue does not take (it is empty, then
    # has one), the flood takes.
    for expected in ({"flood": 10}, {"trickle": 1, "flood": 9}):
        if "trickle" in expected:
            db.jobs[trickle]["run_at"] = db.clock
        else:
            db.jobs[trickle]["run_at"] = db.clock + timedelta(hours=1)
        before = len(db.sent("job_claim"))
        flow = t.claim(
            SETTINGS, limit=10, worker="w", queues=["flood", "trickle"], turn=0, sparse={"trickle"}
        )
        jobs = driver.run(flow, db)
        assert Counter(job.queue for job in jobs) == expected
        assert len(db.sent("job_claim")) == before + 1


def test_claim_gives_what_a_short_queue_left_to_the_queues_that_filled_theirs() -> None:
    db = MemoryDatabase()
    for queue, count in (("a", 10), ("b", 1), ("c", 10)):
        for _ in range(count):
            db.add(queue=queue)
    jobs = driver.run(t.claim(SETTINGS, limit=9, worker="w", queues=["a", "b", "c"], turn=0), db)
    assert sorted(job.queue for job in jobs) == ["a"] * 4 + ["b"] + ["c"] * 4
    sent = db.sent("job_claim")
    shares = [dict(zip(s.params["queues"], s.params["shares"], strict=True)) for s in sent]
    assert shares == [{"a": 3, "b": 3, "c": 3}, {"c": 1, "a": 1}]


def test_claim_of_no_queue_sends_nothing() -> None:
    db = MemoryDatabase()
    assert driver.run(t.claim(SETTINGS, limit=9, worker="w", queues=[]), db) == []
    assert db.statements == []


def test_a_claim_of_every_queue_lists_them_again_only_when_old_or_short() -> None:
    db = MemoryDatabase()
    for _ in range(5):
        db.add(queue="a")
    every = EveryQueue(max_age=3600)
    assert len(driver.run(every.claim(SETTINGS, limit=2, worker="w"), db)) == 2
    assert len(driver.run(every.claim(SETTINGS, limit=2, worker="w"), db)) == 2
    assert len(db.sent("queue_names_queued")) == 1  # one list for both claims
    db.add(queue="b")  # a queue the list does not have
    jobs = driver.run(every.claim(SETTINGS, limit=5, worker="w"), db)
    # a came back short: the queues are listed again, and b is asked at once.
    assert sorted(job.queue for job in jobs) == ["a", "b"]
    assert len(db.sent("queue_names_queued")) == 2


def test_claim_takes_the_highest_priority_first_and_only_its_queues() -> None:
    db = MemoryDatabase()
    low, high = db.add(priority=0), db.add(priority=9)
    db.add(queue="other", priority=99)
    jobs = driver.run(t.claim(SETTINGS, limit=10, worker="w", queues=["default"]), db)
    assert [j.id for j in jobs] == [high, low]
    assert all(j.state is JobState.RUNNING and j.lease_token for j in jobs)


def test_finish_is_fenced_by_the_token_of_the_attempt() -> None:
    db = MemoryDatabase()
    job_id = db.add()
    [job] = driver.run(t.claim(SETTINGS, limit=1, worker="w"), db)
    stale = t.Outcome(job_id, job.lease_token - 1, True, result_json="1")  # type: ignore[operator]
    assert driver.run(t.finish(SETTINGS, [stale]), db) == {}
    current = t.Outcome.success(job, 1)
    assert driver.run(t.finish(SETTINGS, [current]), db) == {job_id: JobState.SUCCEEDED}


def test_an_unstorable_result_becomes_a_failed_attempt_before_any_statement() -> None:
    db = MemoryDatabase()
    db.add()
    [job] = driver.run(t.claim(SETTINGS, limit=1, worker="w"), db)
    outcome = t.Outcome.success(job, float("nan"))
    assert not outcome.succeeded and "cannot store" in (outcome.error or "")


def test_cancel_and_retry_say_why_they_do_not_apply() -> None:
    db = MemoryDatabase()
    done = db.add(state="succeeded")
    session = Scripted(
        job_cancel=lambda p: [],
        job_retry=lambda p: [],
        job_get=lambda p: db.execute(Statement("job_get", p, jobs=True)),
    )
    with pytest.raises(JobAlreadyFinished, match="it is succeeded"):
        driver.run(t.cancel(done), session)
    with pytest.raises(JobNotRetryable, match="it is succeeded"):
        driver.run(t.retry(done), session)


def test_schema_pending_lists_every_migration_of_a_never_migrated_database() -> None:
    assert driver.run(t.schema_pending(), MemoryDatabase(migrated=False)) == migration_versions()
    assert driver.run(t.schema_pending(), MemoryDatabase()) == []


def test_list_jobs_refuses_a_bad_state_before_sending_anything() -> None:
    session = Scripted()
    with pytest.raises(ValueError, match="state"):
        driver.run(t.list_jobs(state="nope"), session)
    assert session.sent == []


async def test_the_async_driver_runs_the_same_flows() -> None:
    db = MemoryDatabase()
    db.add()
    jobs = await driver.run_async(t.claim(SETTINGS, limit=3, worker="w"), MemorySession(db))
    assert len(jobs) == 1
    held = [(jobs[0].id, jobs[0].lease_token)]
    still = await driver.run_async(t.heartbeat(held, 30), MemorySession(db))  # type: ignore[arg-type]
    assert still == {jobs[0].id}
