"""Exceptions a task retries without counting an attempt, over the in-memory
database: how they are declared, what the executor makes of them (a snooze
after a backoff, within the snooze bound; past it, a failed attempt), and
that the snooze statement carries their error. What PostgreSQL does with
them through real restarts: tests/integration/worker/test_retry_without_attempt.py."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgqueue import Job, Settings
from pgqueue.core import transitions as t
from pgqueue.db import driver
from pgqueue.worker import TaskRegistry
from pgqueue.worker.executor import Executor
from pgqueue.worker.handlers import resolve_tasks
from pgqueue.worker.isolation import HandlerProcesses
from pgqueue.worker.supervision import EventLog
from pgqueue.worker.threads import ThreadPool
from tests.unit.memory import MemoryDatabase

SETTINGS = Settings(database_url="memory://")
EVENTS = EventLog("unit")


def claimed(db: MemoryDatabase, task: str, **fields: Any) -> Job:
    db.add(task, **fields)
    [job] = driver.drive(t.claim(SETTINGS, limit=1, worker="unit"), db)
    return job


def outage(job: Job) -> None:
    raise psycopg.errors.AdminShutdown("terminating connection due to administrator command")


async def bug(job: Job) -> None:
    raise KeyError("bug")


def registry() -> TaskRegistry:
    tasks = TaskRegistry()
    tasks.add("outage", outage, retry_without_attempt=psycopg.OperationalError, max_snoozes=2)
    tasks.add("bug", bug, retry_without_attempt=(psycopg.OperationalError,))
    tasks.add("plain", outage)
    return tasks


def executor() -> Executor:
    # The delay doubles with each snooze, as the runtime's backoff does.
    tasks = resolve_tasks(registry())
    return Executor(
        tasks,
        ThreadPool(2),
        HandlerProcesses(tasks.values()),
        EVENTS,
        max_snoozes=100,
        retry_delay=lambda snoozes: 2.0**snoozes,
    )


@pytest.mark.parametrize("bad", [ValueError(), "OperationalError", (KeyError, 3), BaseException])
def test_retry_without_attempt_takes_exception_classes_only(bad: Any) -> None:
    with pytest.raises(ValueError, match="retry_without_attempt of task 'x' must be"):
        TaskRegistry().add("x", outage, retry_without_attempt=bad)


def test_a_declared_class_or_tuple_is_kept_as_a_tuple() -> None:
    tasks = registry().tasks()
    assert tasks["outage"].retry_without_attempt == (psycopg.OperationalError,)
    assert tasks["plain"].retry_without_attempt == ()


async def test_a_declared_exception_snoozes_after_a_backoff_with_its_error() -> None:
    db = MemoryDatabase()
    run = executor()
    job = claimed(db, "outage", snoozes=1)  # AdminShutdown is an OperationalError
    outcome = await run.execute(job)
    assert outcome.snooze_seconds == 2.0 and not outcome.succeeded
    assert outcome.error is not None
    assert outcome.error.startswith(
        "retried without counting an attempt (snooze 2 of 2): AdminShutdown: terminating"
    )
    [statement] = list(_statements(t.finish(SETTINGS, [outcome])))
    assert statement.name == "job_snooze" and statement.params["errors"] == [outcome.error]


async def test_past_the_bound_it_is_a_failed_attempt_like_any_other() -> None:
    db = MemoryDatabase()
    outcome = await executor().execute(claimed(db, "outage", snoozes=2))
    assert outcome.snooze_seconds is None and outcome.retryable
    assert outcome.error is not None and outcome.error.startswith(
        "counted as a failed attempt: 2 snoozes already, the most allowed (max_snoozes 2): "
        "AdminShutdown"
    )


async def test_other_exceptions_and_undeclared_tasks_fail_the_attempt() -> None:
    db = MemoryDatabase()
    run = executor()
    for task in ("bug", "plain"):
        outcome = await run.execute(claimed(db, task))
        assert outcome.snooze_seconds is None and outcome.retryable and outcome.error


async def test_the_snooze_written_keeps_the_attempt_and_records_the_error() -> None:
    db = MemoryDatabase()
    job = claimed(db, "outage")
    outcome = await executor().execute(job)
    assert driver.drive(t.finish(SETTINGS, [outcome]), db) == {job.id: "queued"}
    row = db.jobs[job.id]
    assert (row["attempts"], row["snoozes"]) == (0, 1)
    assert row["last_error"] == outcome.error


def _statements(flow: Any) -> Any:
    """The statements a flow sends, each answered with no rows."""
    try:
        statement = next(flow)
        while True:
            yield statement
            statement = flow.send([])
    except StopIteration:
        return
