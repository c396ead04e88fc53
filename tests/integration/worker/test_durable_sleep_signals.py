"""Durable sleeps and signals against a real PostgreSQL: job.sleep() gives
the worker's slot back and resumes the job after its wake time without
running its completed steps again; job.wait_for_signal() consumes a signal
sent before it, or sleeps until one wakes it (at once, whatever its
timeout), or raises SignalTimeout at its deadline; each signal is consumed
once; a workflow's next step waits for a signalled one; bad input is
refused and writes nothing."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from pgqueue import (
    AsyncQueue,
    InvalidJob,
    Job,
    JobAlreadyFinished,
    JobNotFound,
    JobState,
    NotInHandler,
    Queue,
    Settings,
    SignalTimeout,
    StaleAttempt,
    chain,
)
from pgqueue.core.outcomes import attempt_token
from pgqueue.core.sleeps import MAX_SIGNAL_NAME, wait_for_signal
from pgqueue.sql import QUERIES
from pgqueue.worker import AsyncWorker
from tests.support import running, take_over, until

LONG = 3600.0  # a wait's timeout that no test waits out


def steps(sql: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    rows = sql.execute(
        "SELECT name, result FROM pgqueue_job_steps WHERE job_id = %s", (job_id,)
    ).fetchall()
    return {row[0]: row[1] for row in rows}


def signals(sql: psycopg.Connection[Any], job_id: int) -> list[tuple[str, Any]]:
    rows = sql.execute(
        "SELECT name, payload FROM pgqueue_job_signals WHERE job_id = %s ORDER BY id", (job_id,)
    ).fetchall()
    return [(row[0], row[1]) for row in rows]


def snoozed(sql: psycopg.Connection[Any]) -> int:
    row = sql.execute("SELECT coalesce(sum(snoozed), 0) FROM pgqueue_counters").fetchone()
    assert row is not None
    return int(row[0])


def db_now(sql: psycopg.Connection[Any]) -> datetime:
    row = sql.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def asleep_waiting(sql: psycopg.Connection[Any], job_id: int, signal: str) -> bool:
    """The job is queued again with an undecided wait for ``signal``."""
    row = sql.execute(
        "SELECT j.state = 'queued' AND EXISTS (SELECT FROM pgqueue_job_steps s"
        " WHERE s.job_id = j.id AND s.result ->> 'signal' = %s AND NOT s.result ? 'outcome')"
        " FROM pgqueue_jobs j WHERE j.id = %s",
        (signal, job_id),
    ).fetchone()
    return bool(row and row[0])


# -- sleep ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_sleep_gives_the_slot_back_and_resumes_after_its_wake_time(
    settings: Settings, queue: Queue, aqueue: AsyncQueue, sql: psycopg.Connection[Any], kind: str
) -> None:
    calls: Counter[str] = Counter()
    seen: dict[str, Any] = {}

    def count(name: str) -> str:
        calls[name] += 1
        return name

    def sleeper(job: Job) -> list[str]:
        before = job.step("before", count, "before")
        job.sleep(0.3)
        return [before, job.step("after", count, "after")]

    async def sleeper_async(job: Job) -> list[str]:
        before = await job.step_async("before", count, "before")
        await job.sleep_async(0.3)
        return [before, await job.step_async("after", count, "after")]

    def other(job: Job) -> None:
        # With one slot, this runs while the sleeper is asleep, or never.
        seen["sleeper"] = queue.get(job.payload["sleeper"]).state

    handlers = {"sleeper": sleeper if kind == "sync" else sleeper_async, "other": other}
    first = await aqueue.enqueue("sleeper")
    async with running(AsyncWorker(handlers, settings=settings, concurrency=1)):
        await until(lambda: "pgqueue:sleep:1" in steps(sql, first.id))
        second = await aqueue.enqueue("other", {"sleeper": first.id})
        assert (await aqueue.wait(second.id, 30)).state is JobState.SUCCEEDED
        done = await aqueue.wait(first.id, 30)
    assert seen["sleeper"] is JobState.QUEUED
    assert done.state is JobState.SUCCEEDED
    assert done.result == ["before", "after"]
    assert calls == Counter(before=1, after=1)  # the step before the sleep ran once
    # The sleep took no attempt and no snooze of the job's; the queue's
    # counters count it as snoozed. It resumed at its wake time or later.
    assert (done.attempts, done.snoozes) == (1, 0)
    assert snoozed(sql) == 1
    wake_at = datetime.fromisoformat(steps(sql, first.id)["pgqueue:sleep:1"]["wake_at"])
    assert done.finished_at is not None and done.finished_at >= wake_at


async def test_sleep_until_a_time_past_returns_at_once(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    def handler(job: Job) -> str:
        job.sleep_until(datetime(2000, 1, 1, tzinfo=UTC))
        job.sleep(0)
        return "awake"

    job = await aqueue.enqueue("s")
    async with running(AsyncWorker({"s": handler}, settings=settings)):
        done = await aqueue.wait(job.id, 30)
    assert (done.state, done.result, done.attempts) == (JobState.SUCCEEDED, "awake", 1)
    assert set(steps(sql, job.id)) == {"pgqueue:sleep:1", "pgqueue:sleep:2"}
    assert snoozed(sql) == 0


async def test_a_sleep_of_a_stale_attempt_stores_nothing(
    settings: Settings, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    """The sleep's statement is fenced by the attempt's token: an attempt
    that lost the job stores no wake time and puts nobody to sleep."""
    from pgqueue.worker.handles import Handles
    from pgqueue.worker.held import Held

    queue.enqueue("s")
    [job] = queue.claim(1)
    taken = take_over(queue, job.id)
    handles = Handles(settings, _connections(settings))
    with pytest.raises(StaleAttempt):
        await asyncio.to_thread(handles.sleep, Held(job, handles=handles), 60.0, None)
    assert steps(sql, job.id) == {}
    assert queue.get(job.id).state is JobState.RUNNING
    assert queue.get(job.id).lease_token == taken.lease_token


def _connections(settings: Settings) -> Any:
    from pgqueue.db.handler_transactions import HandlerConnections

    return HandlerConnections(settings.database_url, keep=1)


# -- signals -----------------------------------------------------------------------------


async def test_a_signal_sent_before_the_wait_is_consumed_once(
    settings: Settings, queue: Queue, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    def handler(job: Job) -> list[Any]:
        payload = job.wait_for_signal("approve", LONG)
        try:
            job.wait_for_signal("approve", 0)  # the same signal twice? no: a timeout
        except SignalTimeout:
            return [payload, "timed out"]
        return [payload, "twice"]

    job = await aqueue.enqueue("w")
    sent = queue.signal(job.id, "approve", {"by": "ann"})
    assert sent.id == job.id
    assert signals(sql, job.id) == [("approve", {"by": "ann"})]
    async with running(AsyncWorker({"w": handler}, settings=settings)):
        done = await aqueue.wait(job.id, 30)
    assert (done.state, done.attempts) == (JobState.SUCCEEDED, 1)
    assert done.result == [{"by": "ann"}, "timed out"]
    assert signals(sql, job.id) == []  # consumed: deleted
    stored = steps(sql, job.id)
    assert stored["pgqueue:wait:approve:1"]["outcome"] == "received"
    assert stored["pgqueue:wait:approve:2"]["outcome"] == "timed_out"


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_signal_wakes_a_waiting_job_at_once(
    settings: Settings, queue: Queue, aqueue: AsyncQueue, sql: psycopg.Connection[Any], kind: str
) -> None:
    calls: Counter[str] = Counter()

    def count() -> int:
        calls["before"] += 1
        return 1

    def handler(job: Job) -> Any:
        job.step("before", count)
        return job.wait_for_signal("go", LONG)

    async def handler_async(job: Job) -> Any:
        await job.step_async("before", count)
        return await job.wait_for_signal_async("go", LONG)

    job = await aqueue.enqueue("w")
    async with running(
        AsyncWorker({"w": handler if kind == "sync" else handler_async}, settings=settings)
    ):
        await until(lambda: asleep_waiting(sql, job.id, "go"))
        asleep = queue.get(job.id)
        assert (asleep.state, asleep.attempts) == (JobState.QUEUED, 0)
        woken = await aqueue.signal(job.id, "go", [1, 2])
        assert woken.run_at <= db_now(sql)  # due now, not in an hour
        # (An hour's timeout: only the wake can end this wait in time.)
        done = await aqueue.wait(job.id, 30)
    assert (done.state, done.result, done.attempts) == (JobState.SUCCEEDED, [1, 2], 1)
    assert calls["before"] == 1


async def test_a_wait_past_its_deadline_raises_signal_timeout_on_every_run(
    settings: Settings, queue: Queue, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    """The deadline is fixed by the wait's first call: the run that wakes
    at it raises SignalTimeout, and so does the run after an operator's
    retry, at once, with the same deadline."""
    deadlines: list[datetime] = []

    def handler(job: Job) -> Any:
        try:
            return job.wait_for_signal("never", 0.2)
        except SignalTimeout as exc:
            deadlines.append(exc.deadline)
            raise

    job = await aqueue.enqueue("w", max_attempts=1)
    async with running(AsyncWorker({"w": handler}, settings=settings)):
        dead = await aqueue.wait(job.id, 30)
        assert (dead.state, dead.attempts) == (JobState.DEAD, 1)
        await aqueue.retry(job.id)
        again = await aqueue.wait(job.id, 30)
    assert again.state is JobState.DEAD
    assert all("SignalTimeout" in e.error and "'never'" in e.error for e in again.errors)
    stored = steps(sql, job.id)["pgqueue:wait:never:1"]
    assert stored["outcome"] == "timed_out"
    assert deadlines == [datetime.fromisoformat(stored["deadline"])] * 2


async def test_two_waits_for_one_name_need_two_signals(
    settings: Settings, queue: Queue, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    def handler(job: Job) -> list[Any]:
        return [job.wait_for_signal("next", LONG), job.wait_for_signal("next", LONG)]

    job = await aqueue.enqueue("w")
    async with running(AsyncWorker({"w": handler}, settings=settings)):
        await until(lambda: asleep_waiting(sql, job.id, "next"))
        queue.signal(job.id, "next", "first")
        await until(lambda: "pgqueue:wait:next:2" in steps(sql, job.id))
        await until(lambda: asleep_waiting(sql, job.id, "next"))
        assert queue.get(job.id).state is JobState.QUEUED  # one signal is not enough
        queue.signal(job.id, "next", "second")
        done = await aqueue.wait(job.id, 30)
    assert (done.state, done.result) == (JobState.SUCCEEDED, ["first", "second"])


async def test_a_workflows_next_step_runs_after_the_signalled_step(
    settings: Settings, queue: Queue, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    def approval(job: Job) -> Any:
        return job.wait_for_signal("approved", LONG)

    def ship(job: Job) -> Any:
        return {"shipped": job.parents[0]}

    made = queue.enqueue_workflow(
        chain({"task": "approval", "payload": {}}, {"task": "ship", "payload": {}})
    )
    first, second = made.jobs
    async with running(AsyncWorker({"approval": approval, "ship": ship}, settings=settings)):
        await until(lambda: asleep_waiting(sql, first.id, "approved"))
        assert queue.get(second.id).state is JobState.WAITING
        queue.signal(first.id, "approved", {"by": "ops"})
        done = await aqueue.wait(second.id, 30)
    approved = queue.get(first.id)
    assert done.result == {"shipped": {"by": "ops"}}
    assert done.started_at is not None and approved.finished_at is not None
    assert done.started_at >= approved.finished_at


def _blocked(sql: psycopg.Connection[Any]) -> bool:
    row = sql.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
    return bool(row and row[0])


def _until_blocked(sql: psycopg.Connection[Any]) -> None:
    deadline = time.monotonic() + 10
    while not _blocked(sql):
        assert time.monotonic() < deadline, "the other side never waited for the lock"
        time.sleep(0.01)


def test_a_signal_sent_as_the_wait_decides_is_taken_by_it(
    settings: Settings, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    """A signal whose transaction holds the job's row when the wait starts:
    the wait waits for it, then takes the signal instead of sleeping."""
    queue.enqueue("w")
    [job] = queue.claim(1)
    connections = _connections(settings)
    flow = wait_for_signal(job.id, attempt_token(job), "pgqueue:wait:go:1", "go", LONG)
    with psycopg.connect(settings.database_url) as sender:
        sender.execute(QUERIES["job_signal_lock"], {"id": job.id})
        sender.execute(QUERIES["job_signal"], {"id": job.id, "name": "go", "payload": '"late"'})
        with ThreadPoolExecutor(1) as pool:
            waited = pool.submit(connections.run_in_transaction, flow)
            _until_blocked(sql)
            sender.commit()
            result, asleep = waited.result(10)
    assert (result["outcome"], result["payload"], asleep) == ("received", "late", False)
    assert queue.get(job.id).state is JobState.RUNNING
    assert signals(sql, job.id) == []


def test_a_signal_sent_as_the_job_goes_to_sleep_wakes_it(
    settings: Settings, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    """A wait whose transaction holds the job's row (no signal found, the
    job asleep) when the signal comes: the signal waits for it, then finds
    the job asleep waiting for it and wakes it."""
    queue.enqueue("w")
    [job] = queue.claim(1)
    params = {"id": job.id, "token": attempt_token(job)}
    with psycopg.connect(settings.database_url) as waiter:
        assert waiter.execute(QUERIES["job_lock_running"], params).fetchone()
        wait = {**params, "name": "pgqueue:wait:go:1", "signal": "go", "timeout": LONG}
        assert waiter.execute(QUERIES["job_signal_wait"], wait).fetchone()[1] is True  # type: ignore[index]
        with ThreadPoolExecutor(1) as pool:
            sent = pool.submit(queue.signal, job.id, "go", "now")
            _until_blocked(sql)
            waiter.commit()
            woken = sent.result(10)
    assert woken.state is JobState.QUEUED
    assert woken.run_at <= db_now(sql)  # due now, not in an hour
    assert signals(sql, job.id) == [("go", "now")]


# -- bad input ---------------------------------------------------------------------------


def test_signals_that_cannot_be_sent_are_refused_and_nothing_is_stored(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    job = queue.enqueue("t")
    with pytest.raises(JobNotFound):
        queue.signal(job.id + 1000, "go")
    for name in ["", "x" * (MAX_SIGNAL_NAME + 1), "no spaces", "-lead", "é", 7]:
        with pytest.raises(InvalidJob) as refused:
            queue.signal(job.id, name)  # type: ignore[arg-type]
        assert refused.value.field == "name"
    deep: Any = []
    for _ in range(100):
        deep = [deep]
    for payload in (deep, {"x": float("nan")}, {1: "key not text"}):
        with pytest.raises(InvalidJob) as refused:
            queue.signal(job.id, "go", payload)
        assert refused.value.field.startswith("payload")
    [claimed] = queue.claim(1)
    queue.ack(claimed, None)
    with pytest.raises(JobAlreadyFinished, match="cannot signal job"):
        queue.signal(job.id, "go")
    assert signals(sql, job.id) == []


async def test_bad_sleeps_and_waits_are_refused_in_the_handler(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    refusals: list[str] = []

    def handler(job: Job) -> None:
        for call in (
            lambda: job.sleep(-1),
            lambda: job.sleep(float("inf")),
            lambda: job.sleep_until(datetime(2030, 1, 1)),  # naive: refused
            lambda: job.wait_for_signal("bad name", 5),
            lambda: job.wait_for_signal("go", -1),
            lambda: job.step("pgqueue:sleep:1", lambda: 1),
        ):
            try:
                call()
            except InvalidJob as exc:
                refusals.append(exc.field)

    blocking: list[str] = []

    async def blocking_in_async(job: Job) -> None:
        for call in (lambda: job.sleep(1), lambda: job.wait_for_signal("go", 1)):
            try:
                call()
            except TypeError as exc:  # it would block the worker's loop
                blocking.append(str(exc))

    job = await aqueue.enqueue("b")
    other = await aqueue.enqueue("a")
    handlers = {"b": handler, "a": blocking_in_async}
    async with running(AsyncWorker(handlers, settings=settings)):
        assert (await aqueue.wait(job.id, 30)).state is JobState.SUCCEEDED
        assert (await aqueue.wait(other.id, 30)).state is JobState.SUCCEEDED
    assert refusals == ["seconds", "seconds", "when", "name", "timeout", "step"]
    assert [text.split(" in an async handler: use ")[1][:30] for text in blocking] == [
        "`await job.sleep_async(...)` (",
        "`await job.wait_for_signal_asy",
    ]
    assert steps(sql, job.id) == {} and steps(sql, other.id) == {}
    read_back = await aqueue.get(job.id)
    with pytest.raises(NotInHandler):
        read_back.sleep(1)
    with pytest.raises(NotInHandler):
        read_back.wait_for_signal("go", 1)


def test_deleting_a_job_deletes_its_signals(queue: Queue, sql: psycopg.Connection[Any]) -> None:
    job = queue.enqueue("t")
    queue.signal(job.id, "left", 1)
    [claimed] = queue.claim(1)
    queue.ack(claimed, None)
    assert queue.bulk_delete(state="succeeded") == 1
    assert signals(sql, job.id) == []
