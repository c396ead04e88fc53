"""The state machine's flows and the driver, without a database: each flow
is driven over a scripted session that answers by statement name."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pgqueue import JobAlreadyFinished, JobNotRetryable, JobSpec, JobState, Settings
from pgqueue.core import enqueue, reads
from pgqueue.core import transitions as t
from pgqueue.core.bulk import BulkAction, JobFilter, bulk
from pgqueue.core.errors import KeyTaken
from pgqueue.core.every_queue import EveryQueue
from pgqueue.core.flows import Statement
from pgqueue.core.outcomes import Outcome
from pgqueue.db import driver
from pgqueue.sql import migration_versions
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
    job = driver.drive(enqueue.enqueue(JobSpec.build("t", idempotency_key="k")), session)
    assert (job.id, job.duplicate) == (existing, True)
    assert [s.name for s in session.sent] == ["job_enqueue", "job_get_by_idempotency_key"]


def test_enqueue_gives_up_when_a_key_keeps_changing_hands() -> None:
    session = Scripted(job_enqueue=lambda p: [], job_get_by_idempotency_key=lambda p: [])
    with pytest.raises(RuntimeError, match="kept changing hands"):
        driver.drive(enqueue.enqueue(JobSpec.build("t", idempotency_key="k")), session)
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
    driver.drive(t.claim(SETTINGS, limit=5, worker="w", queues=queues, turn=0), db)
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
        jobs = driver.drive(flow, db)
        assert Counter(job.queue for job in jobs) == expected
        assert len(db.sent("job_claim")) == before + 1


def test_claim_gives_what_a_short_queue_left_to_the_queues_that_filled_theirs() -> None:
    db = MemoryDatabase()
    for queue, count in (("a", 10), ("b", 1), ("c", 10)):
        for _ in range(count):
            db.add(queue=queue)
    jobs = driver.drive(t.claim(SETTINGS, limit=9, worker="w", queues=["a", "b", "c"], turn=0), db)
    assert sorted(job.queue for job in jobs) == ["a"] * 4 + ["b"] + ["c"] * 4
    sent = db.sent("job_claim")
    shares = [dict(zip(s.params["queues"], s.params["shares"], strict=True)) for s in sent]
    assert shares == [{"a": 3, "b": 3, "c": 3}, {"c": 1, "a": 1}]


def test_claim_of_no_queue_sends_nothing() -> None:
    db = MemoryDatabase()
    assert driver.drive(t.claim(SETTINGS, limit=9, worker="w", queues=[]), db) == []
    assert db.statements == []


def test_a_claim_of_every_queue_lists_them_again_only_when_old_or_short() -> None:
    db = MemoryDatabase()
    for _ in range(5):
        db.add(queue="a")
    every = EveryQueue(max_age=3600)
    assert len(driver.drive(every.claim(SETTINGS, limit=2, worker="w"), db)) == 2
    assert len(driver.drive(every.claim(SETTINGS, limit=2, worker="w"), db)) == 2
    assert len(db.sent("queue_names_queued")) == 1  # one list for both claims
    db.add(queue="b")  # a queue the list does not have
    jobs = driver.drive(every.claim(SETTINGS, limit=5, worker="w"), db)
    # a came back short: the queues are listed again, and b is asked at once.
    assert sorted(job.queue for job in jobs) == ["a", "b"]
    assert len(db.sent("queue_names_queued")) == 2


def test_claim_takes_the_highest_priority_first_and_only_its_queues() -> None:
    db = MemoryDatabase()
    low, high = db.add(priority=0), db.add(priority=9)
    db.add(queue="other", priority=99)
    jobs = driver.drive(t.claim(SETTINGS, limit=10, worker="w", queues=["default"]), db)
    assert [j.id for j in jobs] == [high, low]
    assert all(j.state is JobState.RUNNING and j.lease_token for j in jobs)


def test_finish_is_fenced_by_the_token_of_the_attempt() -> None:
    db = MemoryDatabase()
    job_id = db.add()
    [job] = driver.drive(t.claim(SETTINGS, limit=1, worker="w"), db)
    stale = Outcome(job_id, job.lease_token - 1, True, result_json="1")  # type: ignore[operator]
    assert driver.drive(t.finish(SETTINGS, [stale]), db) == {}
    current = Outcome.success(job, 1)
    assert driver.drive(t.finish(SETTINGS, [current]), db) == {job_id: JobState.SUCCEEDED}


def test_an_unstorable_result_becomes_a_failed_attempt_before_any_statement() -> None:
    db = MemoryDatabase()
    db.add()
    [job] = driver.drive(t.claim(SETTINGS, limit=1, worker="w"), db)
    outcome = Outcome.success(job, float("nan"))
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
        driver.drive(t.cancel(done), session)
    with pytest.raises(JobNotRetryable, match="it is succeeded"):
        driver.drive(t.retry(done), session)


def test_schema_pending_lists_every_migration_of_a_never_migrated_database() -> None:
    assert (
        driver.drive(reads.schema_pending(), MemoryDatabase(migrated=False)) == migration_versions()
    )
    assert driver.drive(reads.schema_pending(), MemoryDatabase()) == []


def test_list_jobs_refuses_a_bad_state_before_sending_anything() -> None:
    session = Scripted()
    with pytest.raises(ValueError, match="state"):
        driver.drive(reads.list_jobs(state="nope"), session)
    assert session.sent == []


async def test_the_async_driver_runs_the_same_flows() -> None:
    db = MemoryDatabase()
    db.add()
    jobs = await driver.drive_async(t.claim(SETTINGS, limit=3, worker="w"), MemorySession(db))
    assert len(jobs) == 1
    held = [(jobs[0].id, jobs[0].lease_token)]
    still = await driver.drive_async(t.heartbeat(held, 30), MemorySession(db))  # type: ignore[arg-type]
    assert still == {jobs[0].id}


# -- unique keys and bulk actions ---------------------------------------------------------

NOW = datetime(2030, 1, 1, 10, 59, 59, tzinfo=UTC)


def test_a_key_without_a_period_costs_no_extra_statement() -> None:
    db = MemoryDatabase()
    session = Scripted(
        job_enqueue=lambda p: db.execute(Statement("job_get", {"id": db.add()}, jobs=True))
    )
    driver.drive(
        enqueue.enqueue(JobSpec.build("t", idempotency_key="k", unique_scope="active")), session
    )
    driver.drive(enqueue.enqueue(JobSpec.build("t")), session)
    assert [s.name for s in session.sent] == ["job_enqueue", "job_enqueue"]
    assert session.sent[0].params["unique_scope"] == "active"
    assert session.sent[1].params["unique_scope"] is None


def test_a_period_puts_the_start_of_the_database_clocks_period_in_the_key() -> None:
    db = MemoryDatabase()
    session = Scripted(
        db_now=lambda p: [{"now": NOW}],
        job_enqueue=lambda p: db.execute(Statement("job_get", {"id": db.add()}, jobs=True)),
    )
    spec = JobSpec.build("t", idempotency_key="digest", unique_period_seconds=3600)
    driver.drive(enqueue.enqueue(spec), session)
    assert [s.name for s in session.sent] == ["db_now", "job_enqueue"]
    assert session.sent[1].params["idempotency_key"] == "digest@2030-01-01T10:00:00+00:00"
    assert session.sent[1].params["unique_scope"] == "always"


def test_a_scope_or_a_period_without_a_key_keys_by_task_and_payload() -> None:
    one = JobSpec.build("t", {"a": 1, "b": [1, 2]}, unique_scope="queued")
    same = JobSpec.build("t", {"b": [1, 2], "a": 1}, unique_period_seconds=60)
    assert one.idempotency_key == same.idempotency_key
    assert one.idempotency_key is not None and one.idempotency_key.startswith("t:")
    assert JobSpec.build("u", {"a": 1, "b": [1, 2]}, unique_scope="queued").idempotency_key != (
        one.idempotency_key
    )
    assert JobSpec.build("t", {"a": 1}).idempotency_key is None
    assert JobSpec.build("t", idempotency_key="k").unique_scope == "always"


def bulk_session(name: str, batches: list[dict[str, Any]]) -> Scripted:
    answers = iter(batches)
    return Scripted(**{"db_now": lambda p: [{"now": NOW}], name: lambda p: [next(answers)]})


def test_a_bulk_cancel_repeats_bounded_batches_until_one_cancels_nothing() -> None:
    batches = [{"matched": 1000, "affected": n} for n in (1000, 990, 37, 0)]
    session = bulk_session("job_bulk_cancel", batches)
    where = JobFilter(queue="a", enqueued_before=timedelta(hours=1))
    assert driver.drive(bulk(BulkAction.CANCEL, where), session) == 2027
    sent = session.sent
    assert [s.name for s in sent] == ["db_now"] + ["job_bulk_cancel"] * 4
    assert {s.params["limit"] for s in sent[1:]} == {1000}
    # One moment for every batch: the start, and the age counted back from it.
    assert {s.params["started_at"] for s in sent[1:]} == {NOW}
    assert {s.params["enqueued_before"] for s in sent[1:]} == {NOW - timedelta(hours=1)}
    assert sent[1].params["states"] == ["waiting", "queued", "running"]


def test_retry_and_delete_walk_the_finished_jobs_once_in_order() -> None:
    last = [(NOW - timedelta(hours=h), 10 * h) for h in (3, 2)]
    batches = [
        {"matched": 1000, "affected": 1000, "last_at": last[0][0], "last_id": last[0][1]},
        # Every job of a full batch may be left (its key is held): go on.
        {"matched": 1000, "affected": 0, "last_at": last[1][0], "last_id": last[1][1]},
        {"matched": 7, "affected": 7, "last_at": NOW, "last_id": 99},
    ]
    session = bulk_session("job_bulk_finished", batches)
    assert driver.drive(bulk(BulkAction.RETRY, JobFilter(all=True)), session) == 1007
    cursors = [(s.params["after_at"], s.params["after_id"]) for s in session.sent[1:]]
    assert cursors == [(None, None), *last]
    assert session.sent[1].params["states"] == ["dead", "cancelled"]


def test_a_dry_run_is_one_count_without_a_limit() -> None:
    session = bulk_session("job_bulk_finished", [{"matched": 134_000, "affected": 0}])
    where = JobFilter(state="dead")
    assert driver.drive(bulk(BulkAction.DELETE, where, dry_run=True), session) == 134_000
    [_, count] = session.sent
    assert (count.params["dry_run"], count.params["limit"], count.params["states"]) == (
        True,
        None,
        ["dead"],
    )


def test_a_batch_that_met_a_taken_key_is_sent_again() -> None:
    answers: list[Any] = [KeyTaken("taken"), {"matched": 5, "affected": 5}]

    def job_bulk_finished(params: dict[str, Any]) -> list[Any]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return [answer]

    session = Scripted(db_now=lambda p: [{"now": NOW}], job_bulk_finished=job_bulk_finished)
    assert driver.drive(bulk(BulkAction.RETRY, JobFilter(all=True)), session) == 5
    assert [s.name for s in session.sent] == ["db_now"] + ["job_bulk_finished"] * 2
