"""Snooze and CancelJob over the in-memory database: what the executor makes
of them, how finish() groups outcomes into statements, and how the completer
writes a mixed batch (and retries only what a fault left unwritten). What
PostgreSQL does with them is proven in tests/integration/worker/test_snooze.py."""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgqueue import CancelJob, InvalidJob, Job, Settings, Snooze
from pgqueue.core import transitions as t
from pgqueue.core.outcomes import Outcome
from pgqueue.db import driver
from pgqueue.worker import TaskRegistry
from pgqueue.worker.completer import Completer
from pgqueue.worker.executor import Executor
from pgqueue.worker.handlers import resolve_tasks
from pgqueue.worker.held import HeldJobs, Stage
from pgqueue.worker.isolation import HandlerProcesses
from pgqueue.worker.supervision import EventLog
from pgqueue.worker.threads import ThreadPool
from tests.support import until
from tests.unit.memory import MemoryConnection, MemoryDatabase

SETTINGS = Settings(database_url="memory://", max_snoozes=3)
EVENTS = EventLog("unit")


def claimed(db: MemoryDatabase, task: str = "t", **fields: Any) -> Job:
    db.add(task, **fields)
    [job] = driver.drive(t.claim(SETTINGS, limit=1, worker="unit"), db)
    return job


def executor(handlers: Any) -> Executor:
    tasks = resolve_tasks(handlers)
    return Executor(tasks, ThreadPool(2), HandlerProcesses(tasks.values()), EVENTS, max_snoozes=3)


# -- asking -------------------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [-1, math.nan, math.inf, "5", True, None, 11 * 365 * 86400])
def test_a_snooze_out_of_range_is_refused_where_it_is_raised(seconds: Any) -> None:
    with pytest.raises(InvalidJob, match="Snooze seconds"):
        Snooze(seconds)


def test_a_snooze_takes_seconds_or_a_timedelta() -> None:
    assert Snooze(timedelta(minutes=2)).seconds == 120.0
    assert Snooze(0).seconds == 0.0
    assert CancelJob().reason == "cancelled by its handler"


@pytest.mark.parametrize("is_async", [True, False])
async def test_the_executor_makes_snooze_and_cancel_outcomes_for_async_and_sync_handlers(
    is_async: bool,
) -> None:
    def sync_snooze(job: Job) -> None:
        raise Snooze(30)

    def sync_cancel(job: Job) -> None:
        raise CancelJob("customer deleted")

    async def async_snooze(job: Job) -> None:
        raise Snooze(30)

    async def async_cancel(job: Job) -> None:
        raise CancelJob("customer deleted")

    run = executor(
        {"snooze": async_snooze, "cancel": async_cancel}
        if is_async
        else {"snooze": sync_snooze, "cancel": sync_cancel}
    )
    db = MemoryDatabase()
    snoozed = await run.execute(claimed(db, "snooze"))
    cancelled = await run.execute(claimed(db, "cancel"))
    assert (snoozed.snooze_seconds, snoozed.succeeded, snoozed.cancelled) == (30.0, False, False)
    assert (cancelled.cancelled, cancelled.error) == (True, "customer deleted")
    assert cancelled.snooze_seconds is None


async def test_past_max_snoozes_the_task_bound_wins_over_the_setting_and_the_job_is_dead() -> None:
    registry = TaskRegistry()

    @registry.task(max_snoozes=1)
    async def strict(job: Job) -> None:
        raise Snooze(5)

    @registry.task
    async def lenient(job: Job) -> None:
        raise Snooze(5)

    run = executor(registry)
    db = MemoryDatabase()
    assert (await run.execute(claimed(db, "strict", snoozes=0))).snooze_seconds == 5.0
    refused = await run.execute(claimed(db, "strict", snoozes=1))
    assert refused.snooze_seconds is None and not refused.retryable
    assert "after 1 snoozes, the most allowed (max_snoozes 1)" in (refused.error or "")
    # Without a bound of its own the task gets the worker's setting (3 here).
    assert (await run.execute(claimed(db, "lenient", snoozes=2))).snooze_seconds == 5.0
    assert (await run.execute(claimed(db, "lenient", snoozes=3))).snooze_seconds is None


def test_a_task_bound_must_be_a_count() -> None:
    registry = TaskRegistry()
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_snoozes of task"):
            registry.add(f"t{bad}", lambda job: None, max_snoozes=bad)


# -- writing ------------------------------------------------------------------------------


def test_outcomes_without_snoozes_or_cancels_are_one_job_finish_as_given() -> None:
    db = MemoryDatabase()
    outcomes = [Outcome.success(claimed(db), 1), Outcome.failure(claimed(db), "x")]
    assert t.finish_groups(outcomes) == [outcomes]
    assert t.finish_groups([]) == []


def test_a_mixed_batch_is_one_statement_per_kind_in_one_flow() -> None:
    db = MemoryDatabase()
    ok, snooze, cancel, fail = (claimed(db) for _ in range(4))
    states = driver.drive(
        t.finish(
            SETTINGS,
            [
                Outcome.cancel(cancel, "gone"),
                Outcome.snooze(snooze, 60),
                Outcome.success(ok, 1),
                Outcome.failure(fail, "boom"),
            ],
        ),
        db,
    )
    assert [s.name for s in db.statements[-3:]] == ["job_finish", "job_snooze", "job_cancel_held"]
    assert db.sent("job_finish")[0].params["ids"] == [ok.id, fail.id]
    assert {job_id: str(state) for job_id, state in states.items()} == {
        ok.id: "succeeded",
        snooze.id: "queued",
        cancel.id: "cancelled",
        fail.id: "queued",
    }
    row = db.jobs[snooze.id]
    assert (row["attempts"], row["snoozes"]) == (0, 1)
    assert row["run_at"] == db.clock + timedelta(seconds=60)
    assert db.jobs[cancel.id]["last_error"] == "gone"


async def test_a_fault_between_the_statements_of_a_batch_retries_only_what_was_not_written() -> (
    None
):
    db = MemoryDatabase()
    held = HeldJobs(10)
    writer = Completer(MemoryConnection(db), held, SETTINGS, EVENTS)
    ok, snooze, cancel = (claimed(db) for _ in range(3))
    db.fail("job_snooze", psycopg.OperationalError("connection lost"))
    for job, outcome in (
        (ok, Outcome.success(ok, None)),
        (snooze, Outcome.snooze(snooze, 10)),
        (cancel, Outcome.cancel(cancel, "no")),
    ):
        writer.submit(held.hold(job), outcome)
    task = asyncio.create_task(writer.write_loop())
    await until(lambda: len(held) == 0, 5)
    task.cancel()
    # job_finish went through before the fault: it is not sent again.
    assert [
        s.name
        for s in db.statements
        if s.name.startswith(("job_finish", "job_snooze", "job_cancel"))
    ] == [
        "job_finish",
        "job_snooze",
        "job_snooze",
        "job_cancel_held",
    ]
    assert [db.state(j.id) for j in (ok, snooze, cancel)] == ["succeeded", "queued", "cancelled"]
    assert {
        k: writer.stats[k] for k in ("succeeded", "snoozed", "cancelled", "failed", "lost")
    } == {
        "succeeded": 1,
        "snoozed": 1,
        "cancelled": 1,
        "failed": 0,
        "lost": 0,
    }


async def test_a_job_claimed_again_before_its_snooze_reply_is_read_stays_held() -> None:
    """A 0 s snooze commits and wakes the producer, which may claim the job
    again before the completer has read the snooze's reply: the new attempt
    must stay held, and its own outcome be written."""
    db = MemoryDatabase()
    held = HeldJobs(10)
    writer = Completer(MemoryConnection(db), held, SETTINGS, EVENTS)
    first = claimed(db)
    again: list[Job] = []
    snooze = db.job_snooze

    def snooze_then_claim(**params: Any) -> list[dict[str, Any]]:
        rows = snooze(**params)
        again.extend(driver.drive(t.claim(SETTINGS, limit=1, worker="unit"), db))
        held.hold(again[0])  # the producer wins the race
        return rows

    db.job_snooze = snooze_then_claim  # type: ignore[method-assign]
    writer.submit(held.hold(first), Outcome.snooze(first, 0))
    task = asyncio.create_task(writer.write_loop())
    await until(lambda: writer.stats["snoozed"] == 1, 5)
    entry = held.get(first.id)
    assert entry is not None and entry.stage is Stage.RUNNING
    assert entry.job.lease_token == again[0].lease_token != first.lease_token
    writer.submit(entry, Outcome.success(again[0], "done"))
    await until(lambda: len(held) == 0, 5)
    task.cancel()
    assert db.state(first.id) == "succeeded"
    assert (writer.stats["succeeded"], writer.stats["lost"]) == (1, 0)
