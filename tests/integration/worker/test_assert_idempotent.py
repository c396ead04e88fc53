"""pgqueue.testing.assert_idempotent: a handler run once, then through
duplicate delivery, a crash after its effects and a lost lease, through the
worker's own runner and fenced writes; a handler whose effects differ from
the single run's fails it with a readable report
(docs/howto/idempotent-handlers.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, Job, Queue
from pgqueue.db.embedded import EmbeddedPostgres
from pgqueue.testing import NotIdempotent, Report, assert_idempotent, assert_idempotent_async

CREDIT = {"account": "a", "amount": 10, "ref": "order-1"}
SCENARIOS = ["duplicate delivery", "crash after effects", "lost lease"]


@pytest.fixture
def ledger(sql: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    # No unique constraint on the rows themselves: only a key can dedupe.
    sql.execute("CREATE TABLE ledger (account text, amount int, ref text)")
    sql.execute("CREATE UNIQUE INDEX ledger_ref ON ledger (ref) WHERE ref IS NOT NULL")
    return sql


def probes(sql: psycopg.Connection[Any]) -> dict[str, Callable[[], Any]]:
    return {
        "effects": lambda: sql.execute("SELECT account, amount FROM ledger").fetchall(),
        "reset": lambda: sql.execute("TRUNCATE ledger"),
    }


def credit_naive(job: Job) -> None:
    with psycopg.connect(job.payload["url"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ledger (account, amount) VALUES (%s, %s)",
            (job.payload["account"], job.payload["amount"]),
        )


def credit_keyed(job: Job) -> None:
    with psycopg.connect(job.payload["url"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ledger VALUES (%s, %s, %s) ON CONFLICT (ref) WHERE ref IS NOT NULL "
            "DO NOTHING",
            (job.payload["account"], job.payload["amount"], job.payload["ref"]),
        )


def credit_in_transaction(job: Job) -> None:
    with job.transaction() as conn:
        conn.execute(
            "INSERT INTO ledger (account, amount) VALUES (%s, %s)",
            (job.payload["account"], job.payload["amount"]),
        )


async def credit_in_transaction_async(job: Job) -> None:
    async with job.transaction() as conn:
        await conn.execute(
            "INSERT INTO ledger (account, amount) VALUES (%s, %s)",
            (job.payload["account"], job.payload["amount"]),
        )


async def credit_naive_async(job: Job) -> None:
    async with await psycopg.AsyncConnection.connect(job.payload["url"], autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO ledger (account, amount) VALUES (%s, %s)",
            (job.payload["account"], job.payload["amount"]),
        )


def fates(report: Report) -> dict[str, list[str]]:
    return {s.name: [a.describe() for a in s.attempts] for s in report.scenarios}


def test_a_naive_insert_fails_every_scenario_with_the_rows_it_added(
    queue: Queue, ledger: psycopg.Connection[Any], db_url: str
) -> None:
    with pytest.raises(NotIdempotent) as raised:
        assert_idempotent(queue, credit_naive, {**CREDIT, "url": db_url}, **probes(ledger))
    report = raised.value.report
    assert report.single_run == [("a", 10)]
    assert [s.name for s in report.scenarios if s.differs] == SCENARIOS
    assert all(s.added == (("a", 10),) and s.missing == () for s in report.scenarios)
    message = str(raised.value)
    assert "task 'credit_naive' is not idempotent" in message
    assert "added:   ('a', 10)" in message


def test_an_insert_on_a_natural_key_passes_and_says_what_each_attempt_became(
    queue: Queue, ledger: psycopg.Connection[Any], db_url: str
) -> None:
    report = assert_idempotent(queue, credit_keyed, {**CREDIT, "url": db_url}, **probes(ledger))
    assert report.idempotent
    assert all(s.effects == [("a", 10)] for s in report.scenarios)
    refused = "its outcome refused (its lease was lost)"
    acked = "its outcome written: the job succeeded"
    assert fates(report) == {
        "duplicate delivery": [
            f"attempt 1: the handler returned; {refused}",
            f"attempt 2: the handler returned; {acked}",
        ],
        "crash after effects": [
            "attempt 1: the handler returned; its outcome never written (the worker crashed)",
            f"attempt 2: the handler returned; {acked}",
        ],
        "lost lease": [  # in the order they ran: the stalled first attempt last
            f"attempt 2: the handler returned; {acked}",
            f"attempt 1: the handler returned; {refused}",
        ],
    }


@pytest.mark.parametrize(
    "handler", [credit_in_transaction, credit_in_transaction_async], ids=["sync", "async"]
)
def test_a_handler_writing_in_job_transaction_passes_without_a_key(
    queue: Queue, ledger: psycopg.Connection[Any], handler: Callable[[Job], Any]
) -> None:
    report = assert_idempotent(queue, handler, CREDIT, **probes(ledger))
    assert report.idempotent
    assert all(s.effects == [("a", 10)] for s in report.scenarios)
    stale = fates(report)["lost lease"][-1]
    # The stalled attempt's block found its token gone: nothing of it committed.
    assert stale.startswith("attempt 1: the handler failed: StaleAttempt")
    assert fates(report)["crash after effects"] == [
        "attempt 1: the handler returned; its job.transaction() completed the job"
    ]


async def test_the_async_form_takes_async_probes_and_fails_an_async_naive_handler(
    aqueue: AsyncQueue, db_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE ledger (account text, amount int, ref text)")

        async def effects() -> list[tuple[Any, ...]]:
            return await (await conn.execute("SELECT account, amount FROM ledger")).fetchall()

        async def reset() -> None:
            await conn.execute("TRUNCATE ledger")

        with pytest.raises(NotIdempotent) as raised:
            await assert_idempotent_async(
                aqueue, credit_naive_async, {**CREDIT, "url": db_url}, effects=effects, reset=reset
            )
    assert [s.added for s in raised.value.report.scenarios] == [(("a", 10),)] * 3


def test_a_handler_that_fails_in_a_single_run_is_reported_as_such(
    queue: Queue, ledger: psycopg.Connection[Any]
) -> None:
    def broken(job: Job) -> None:
        raise RuntimeError("no such account")

    with pytest.raises(AssertionError, match=r"failed in a single run.*no such account"):
        assert_idempotent(queue, broken, CREDIT, **probes(ledger))


def test_a_queue_of_the_callers_own_is_refused_before_anything_runs(
    queue: Queue, ledger: psycopg.Connection[Any], db_url: str
) -> None:
    with pytest.raises(ValueError, match="its own queue"):
        assert_idempotent(
            queue, credit_naive, {**CREDIT, "url": db_url}, queue="mine", **probes(ledger)
        )
    assert ledger.execute("SELECT count(*) FROM ledger").fetchone() == (0,)
    assert ledger.execute("SELECT count(*) FROM pgqueue_jobs").fetchone() == (0,)


@pytest.fixture
def pgqueue_admin_url(pg_server: EmbeddedPostgres) -> str:
    """The plugin's databases on the session's server (not an embedded one of its own)."""
    return pg_server.url


def test_the_pytest_plugins_fixture_checks_a_handler_on_the_tests_own_database(
    pgqueue_assert_idempotent: Callable[..., Report], pgqueue_url: str
) -> None:
    with psycopg.connect(pgqueue_url, autocommit=True) as sql:
        sql.execute("CREATE TABLE ledger (account text, amount int, ref text UNIQUE)")
        passed = pgqueue_assert_idempotent(credit_in_transaction, CREDIT, **probes(sql))
        assert passed.idempotent and passed.single_run == [("a", 10)]
        with pytest.raises(NotIdempotent, match="task 'credit_naive' is not idempotent"):
            pgqueue_assert_idempotent(credit_naive, {**CREDIT, "url": pgqueue_url}, **probes(sql))
