"""The flow and loop logic of retried enqueues (no database: what PostgreSQL
does with the keys is proven in tests/integration/queue/test_enqueue_retry.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from pgqueue.core import enqueue
from pgqueue.core.enqueue import CallKey, Enqueued
from pgqueue.core.errors import DatabaseUnavailable, KeyTaken
from pgqueue.core.flows import Statement
from pgqueue.core.job_spec import JobSpec
from pgqueue.core.settings import Settings
from pgqueue.db import driver
from pgqueue.db.retrying import Retries, Retrying
from tests.unit.memory import MemoryDatabase


class Scripted:
    """A session that answers each statement by name, and records them."""

    def __init__(self, **answers: Callable[[dict[str, Any]], list[Any]]) -> None:
        self.answers = answers
        self.sent: list[Statement] = []

    def execute(self, statement: Statement) -> list[Any]:
        self.sent.append(statement)
        return self.answers[statement.name](statement.params)


def taken(params: dict[str, Any]) -> list[Any]:
    raise KeyTaken("duplicate key value violates unique constraint")


def test_a_first_attempt_reserves_the_jobs_id_and_inserts_with_it() -> None:
    db = MemoryDatabase()
    session = Scripted(
        job_reserve_ids=lambda p: [{"ids": [41]}],
        job_enqueue=lambda p: db.execute(Statement("job_get", {"id": db.add()}, jobs=True)),
    )
    call = CallKey()
    driver.drive(enqueue.enqueue(JobSpec.build("t"), call), session)
    assert [s.name for s in session.sent] == ["job_reserve_ids", "job_enqueue"]
    assert session.sent[1].params["id"] == 41 and call.ids == [41]


def test_a_retry_that_meets_its_own_id_returns_the_job_an_earlier_attempt_committed() -> None:
    db = MemoryDatabase()
    call = CallKey()
    earlier = db.add(payload={"n": 1}, call_key=call.key)  # what the first attempt wrote
    call.ids = [earlier]
    call.begin()  # the attempt whose reply was lost
    session = Scripted(job_enqueue=taken, job_get=lambda p: db.execute(Statement("job_get", p)))
    job = driver.drive(enqueue.enqueue(JobSpec.build("t", {"n": 1}), call), session)
    assert (job.id, job.payload, job.duplicate) == (earlier, {"n": 1}, False)
    assert [s.name for s in session.sent] == ["job_enqueue", "job_get"]  # no new reservation
    assert session.sent[0].params["call_key"] == call.key


@pytest.mark.parametrize("other_key", [uuid4(), None], ids=["another_call", "no_call"])
def test_a_retry_does_not_take_a_job_without_its_key_under_its_id(other_key: Any) -> None:
    """An identical job under the call's id, written by another call (its
    key) or outside any call (no key, as SQL writes it), is not the call's:
    its job gets a new id."""
    db = MemoryDatabase()
    other = db.add(call_key=other_key)
    call = CallKey(ids=[other])
    call.begin()
    job = driver.drive(enqueue.enqueue(JobSpec.build("t"), call), db)
    assert job.id != other and call.ids == [job.id]
    assert [s.name for s in db.statements] == [
        "job_enqueue",
        "job_get",
        "job_reserve_ids",
        "job_enqueue",
    ]
    assert db.jobs[job.id]["call_key"] == call.key and db.jobs[other]["call_key"] == other_key


def test_a_retry_of_a_keyed_job_prefers_its_own_job_to_a_duplicate() -> None:
    """The caller's key is ON CONFLICT's target: the insert returns nothing,
    and the job found by the call's id is this call's, not a duplicate."""
    db = MemoryDatabase()
    earlier = db.add(idempotency_key="k")
    session = Scripted(
        job_enqueue=lambda p: [],
        job_get=lambda p: db.execute(Statement("job_get", p)),
    )
    call = CallKey(ids=[earlier])
    call.begin()
    db.jobs[earlier]["call_key"] = call.key
    job = driver.drive(enqueue.enqueue(JobSpec.build("t", idempotency_key="k"), call), session)
    assert (job.id, job.duplicate) == (earlier, False)
    assert [s.name for s in session.sent] == ["job_enqueue", "job_get"]


def test_a_transactional_enqueue_reserves_no_id() -> None:
    db = MemoryDatabase()
    session = Scripted(
        job_enqueue=lambda p: db.execute(Statement("job_get", {"id": db.add()}, jobs=True))
    )
    driver.drive(enqueue.enqueue(JobSpec.build("t")), session)
    assert [s.name for s in session.sent] == ["job_enqueue"]
    assert session.sent[0].params["id"] is session.sent[0].params["call_key"] is None


def test_a_bulk_retry_inserts_with_the_ids_the_first_attempt_reserved() -> None:
    """The first attempt reserved ids and sent its COPY (whose outcome is
    unknown); the retry skips the reservation and the COPY, inserts with the
    same ids, and counts the rows found under them as created by the call."""
    specs = [JobSpec.build("t", {"n": n}) for n in range(3)]
    call = CallKey()
    first = Scripted(
        job_reserve_ids=lambda p: [{"ids": [7, 8, 9]}],
        job_copy=lambda p: [],
        job_copied=lambda p: [],
    )
    assert driver.drive(enqueue.enqueue_many(specs, call=call), first) == [
        Enqueued(7, True),
        Enqueued(8, True),
        Enqueued(9, True),
    ]
    retry = Scripted(
        job_enqueue_many=lambda p: [{"id": 9}],  # 7 and 8 committed by the first attempt
        job_enqueue_found=lambda p: [
            {"id": i, "reserved": True, "holds_key": None, "call_key": call.key} for i in p["ids"]
        ],
    )
    results = driver.drive(enqueue.enqueue_many(specs, call=call), retry)
    assert results == [Enqueued(7, True), Enqueued(8, True), Enqueued(9, True)]
    assert [s.name for s in retry.sent] == ["job_enqueue_many", "job_enqueue_found"]
    assert first.sent[1].copy_rows is not None
    assert {row[-1] for row in first.sent[1].copy_rows} == {str(call.key)}
    assert retry.sent[0].params["id"] == [7, 8, 9]
    assert retry.sent[0].params["call_key"] == call.key
    assert retry.sent[1].params == {"ids": [7, 8], "idempotency_keys": []}


def test_a_bulk_enqueue_gives_a_held_key_its_holders_id() -> None:
    specs = [JobSpec.build("t", idempotency_key="k"), JobSpec.build("t", idempotency_key="new")]
    session = Scripted(
        job_reserve_ids=lambda p: [{"ids": [1, 2]}],
        job_enqueue_many=lambda p: [{"id": 2}],
        job_enqueue_found=lambda p: [
            {"id": 50, "reserved": False, "holds_key": "k", "call_key": None}
        ],
    )
    results = driver.drive(enqueue.enqueue_many(specs), session)
    assert results == [Enqueued(50, False), Enqueued(2, True)]
    assert session.sent[2].params == {"ids": [1], "idempotency_keys": ["k"]}


def test_a_bulk_attempt_whose_reservation_was_lost_reserves_again_and_copies() -> None:
    specs = [JobSpec.build("t")]
    call = CallKey()
    lost = Scripted(job_reserve_ids=lambda p: (_ for _ in ()).throw(psycopg.OperationalError()))
    with pytest.raises(psycopg.OperationalError):
        driver.drive(enqueue.enqueue_many(specs, call=call), lost)
    again = Scripted(
        job_reserve_ids=lambda p: [{"ids": [4]}],
        job_copy=lambda p: [],
        job_copied=lambda p: [],
    )
    assert driver.drive(enqueue.enqueue_many(specs, call=call), again) == [Enqueued(4, True)]
    assert [s.name for s in again.sent] == ["job_reserve_ids", "job_copy", "job_copied"]


# -- a few plain jobs: one statement, no transaction ------------------------------------


def test_a_few_plain_jobs_go_in_by_one_statement_and_without_a_transaction() -> None:
    """Up to ONE_STATEMENT_JOBS plain jobs: the ids' reservation, then one
    statement that counts and wakes the jobs itself; so the call needs no
    transaction. More jobs, or one that is not plain, keep the COPY's or
    the INSERT's transaction."""
    specs = [JobSpec.build("t", {"n": n}) for n in range(3)]
    call = CallKey()
    session = Scripted(
        job_reserve_ids=lambda p: [{"ids": [7, 8, 9]}], job_enqueue_plain=lambda p: []
    )
    results = driver.drive(enqueue.enqueue_plain(specs, call), session)
    assert results == [Enqueued(7, True), Enqueued(8, True), Enqueued(9, True)]
    assert [s.name for s in session.sent] == ["job_reserve_ids", "job_enqueue_plain"]
    params = session.sent[1].params
    assert params["id"] == [7, 8, 9] and params["call_key"] == call.key
    assert params["payload"] == [spec.payload_json for spec in specs]
    few = [JobSpec.build("t")] * enqueue.ONE_STATEMENT_JOBS
    assert enqueue.one_statement(few)
    assert not enqueue.one_statement([*few, JobSpec.build("t")])
    for field in ({"idempotency_key": "k"}, {"delay_seconds": 5}, {"depends_on": [1]}):
        assert not enqueue.one_statement([JobSpec.build("t"), JobSpec.build("t", **field)])


def test_a_retry_of_a_few_plain_jobs_that_meets_its_ids_returns_what_it_committed() -> None:
    """The first attempt's statement committed (its reply lost): the retry's
    fails on the first id it meets, and the jobs under the ids carry the
    call's key: all of them are the call's (the statement commits all or
    none), and nothing more is written."""
    specs = [JobSpec.build("t", {"n": n}) for n in range(2)]
    call = CallKey(ids=[7, 8], attempts=1)
    session = Scripted(
        job_enqueue_plain=taken,
        job_enqueue_found=lambda p: [{"id": 7, "reserved": True, "call_key": call.key}],
    )
    results = driver.drive(enqueue.enqueue_plain(specs, call), session)
    assert results == [Enqueued(7, True), Enqueued(8, True)]
    assert [s.name for s in session.sent] == ["job_enqueue_plain", "job_enqueue_found"]


def test_a_few_plain_jobs_whose_id_another_call_holds_are_written_under_new_ids() -> None:
    """A primary promoted after a failover handed one of the call's ids out
    again: the row under it is another call's, so none of the call's jobs
    were written, and all of them go in again under ids the call never held."""
    specs = [JobSpec.build("t", {"n": n}) for n in range(2)]
    call = CallKey(ids=[7, 8], attempts=1)
    inserts = iter([taken, lambda p: []])
    reserved = iter([[8, 9], [10]])  # 8 is the call's own: skipped
    session = Scripted(
        job_enqueue_plain=lambda p: next(inserts)(p),
        job_enqueue_found=lambda p: [{"id": 7, "reserved": True, "call_key": uuid4()}],
        job_reserve_ids=lambda p: [{"ids": next(reserved)}],
    )
    results = driver.drive(enqueue.enqueue_plain(specs, call), session)
    assert results == [Enqueued(9, True), Enqueued(10, True)] and call.ids == [9, 10]
    assert session.sent[-1].params["id"] == [9, 10]


# -- the loop ---------------------------------------------------------------------


class Flaky:
    """An attempt that raises ``errors`` in turn, then returns "done"."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.waits: list[float] = []

    def __call__(self, retries: Retries) -> str:
        assert retries.failures == len(self.waits)
        self.waits.append(retries.remaining())
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def test_lost_connections_are_retried_within_the_deadline() -> None:
    attempt = Flaky(
        psycopg.OperationalError("server closed the connection"), psycopg.InterfaceError()
    )
    assert Retrying(Settings(enqueue_retry_seconds=5.0)).call(attempt, "enqueue") == "done"
    assert len(attempt.waits) == 3
    assert all(0 < wait <= 5.0 for wait in attempt.waits)
    assert attempt.waits == sorted(attempt.waits, reverse=True)  # one deadline for all


async def test_the_async_loop_retries_the_same_errors() -> None:
    attempt = Flaky(psycopg.errors.AdminShutdown("terminating connection"))

    async def run(retries: Retries) -> str:
        await asyncio.sleep(0)
        return attempt(retries)

    assert await Retrying(Settings(enqueue_retry_seconds=5.0)).call_async(run, "enqueue") == "done"
    assert len(attempt.waits) == 2


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.UniqueViolation("duplicate key"),
        psycopg.errors.CheckViolation("check"),
        psycopg.errors.InvalidTextRepresentation("bad input"),
        psycopg.errors.UndefinedColumn("enqueue_key"),
        ValueError("a bug"),
    ],
)
def test_what_is_not_a_lost_connection_is_not_retried(error: BaseException) -> None:
    attempt = Flaky(error)
    with pytest.raises(type(error)):
        Retrying(Settings(enqueue_retry_seconds=5.0)).call(attempt, "enqueue")
    assert len(attempt.waits) == 1


def test_past_the_deadline_the_call_fails_with_database_unavailable() -> None:
    attempt = Flaky(*[psycopg.OperationalError("connection refused")] * 1000)
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match=r"within 0\.3 s.*connection refused"):
        Retrying(Settings(enqueue_retry_seconds=0.3)).call(attempt, "enqueue")
    assert time.monotonic() - started < 0.3 + 0.2
    assert len(attempt.waits) >= 10  # the back-off is capped at a tenth of the deadline


def test_after_a_lost_connection_first_attempts_connect_anew_for_a_while() -> None:
    """The pool replaces lost connections with a back-off of its own: for
    one deadline after a loss, calls do not wait for it."""
    retrying = Retrying(Settings(enqueue_retry_seconds=0.2))
    assert not retrying.new_connection(Retries(0.2, "enqueue"))
    retrying.call(Flaky(psycopg.OperationalError("lost")), "enqueue")
    assert retrying.new_connection(Retries(0.2, "enqueue"))
    time.sleep(0.25)
    assert not retrying.new_connection(Retries(0.2, "enqueue"))
