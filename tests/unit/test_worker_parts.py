"""Each part of the worker on its own, and the whole worker, over the
in-memory database: slot accounting, the executor's outcomes, batched and
fenced writes with their fallbacks, lost leases, claims bounded by free
slots, supervision, and waiting for a schema."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from pgqueue import Job, JobState, Settings, WorkerFailed
from pgqueue.core import transitions as t
from pgqueue.core.outcomes import Outcome
from pgqueue.core.workers import WorkerInfo, WorkerLoad
from pgqueue.db import driver
from pgqueue.worker import AsyncWorker
from pgqueue.worker._context import in_context
from pgqueue.worker.completer import Completer
from pgqueue.worker.executor import Executor
from pgqueue.worker.handlers import resolve_tasks
from pgqueue.worker.held import Held, HeldJobs, Stage
from pgqueue.worker.isolation import HandlerProcesses
from pgqueue.worker.leases import LeaseKeeper
from pgqueue.worker.producer import FAIR_CLAIM_JOBS, Producer
from pgqueue.worker.running import RUNNERS_AT_ONCE
from pgqueue.worker.supervision import EventLog
from pgqueue.worker.threads import ThreadPool
from tests.support import running, until
from tests.unit.memory import MemoryConnection, MemoryDatabase, no_hints

SETTINGS = Settings(database_url="memory://", poll_interval_seconds=0.05)
EVENTS = EventLog("unit")
CALLER = contextvars.ContextVar("caller", default="unset")


def claimed(db: MemoryDatabase, count: int = 1, **fields: Any) -> list[Job]:
    for _ in range(count):
        db.add(**fields)
    return driver.drive(t.claim(SETTINGS, limit=count, worker="unit"), db)


# -- the registry ----------------------------------------------------------------------


def test_free_slots_count_running_handlers_hung_threads_and_unwritten_outcomes() -> None:
    hung = [0]
    held = HeldJobs(4, hung_threads=lambda: hung[0])
    jobs = claimed(MemoryDatabase(), 4)
    assert held.free_slots() == 4
    first = held.hold(jobs[0])
    held.hold(jobs[1])
    assert held.free_slots() == 2
    hung[0] = 1
    assert held.free_slots() == 1
    held.handler_finished(first)
    assert held.free_slots() == 2  # its outcome is not written yet: still held
    assert len(held) == 2
    held.release(jobs[0].id)
    assert held.free_slots() == 2 and len(held) == 1


def test_a_lease_being_written_is_not_lost_by_a_heartbeat() -> None:
    held = HeldJobs(2)
    [job] = claimed(MemoryDatabase())
    entry = held.hold(job)
    entry.stage = Stage.WRITING
    token = job.lease_token
    assert held.leases() == [] and held.lose(job.id, token) is None
    entry.stage = Stage.DONE
    assert held.lose(job.id, token) is entry and entry.lost and held.lose(job.id, token) is None


# -- the executor -------------------------------------------------------------------------


def executor(handlers: dict[str, Any], threads: ThreadPool | None = None) -> Executor:
    tasks = resolve_tasks(handlers)
    return Executor(
        tasks,
        threads or ThreadPool(2),
        HandlerProcesses(tasks.values()),
        EVENTS,
        max_snoozes=SETTINGS.max_snoozes,
    )


async def test_the_executor_turns_every_ending_into_an_outcome() -> None:
    async def slow(job: Job) -> None:
        await asyncio.sleep(5)

    run = executor({"ok": lambda job: {"x": 1}, "raises": lambda job: 1 / 0, "slow": slow})
    db = MemoryDatabase()
    [ok, raises, slow_job, unknown] = [
        claimed(db, task=name, timeout_seconds=0.05 if name == "slow" else None)[0]
        for name in ("ok", "raises", "slow", "nope")
    ]
    assert (await run.execute(ok)).result_json == '{"x":1}'
    assert "ZeroDivisionError" in ((await run.execute(raises)).error or "")
    timed_out = await run.execute(slow_job)
    assert "timed out after 0.05 s; handler cancelled" in (timed_out.error or "")
    assert "unknown task 'nope'" in ((await run.execute(unknown)).error or "")


async def test_a_sync_handler_past_its_timeout_keeps_its_slot_until_its_thread_returns() -> None:
    release = threading.Event()
    returned = asyncio.Event()
    threads = ThreadPool(2, on_hung_return=returned.set)
    run = executor({"hang": lambda job: release.wait(5)}, threads)
    [job] = claimed(MemoryDatabase(), task="hang", timeout_seconds=0.05)
    outcome = await run.execute(job)
    assert not outcome.succeeded and "its thread runs on" in (outcome.error or "")
    assert threads.hung == 1
    release.set()
    await asyncio.wait_for(returned.wait(), 5)
    assert threads.hung == 0


# -- the completer -------------------------------------------------------------------------


def completer(db: MemoryDatabase, held: HeldJobs) -> Completer:
    return Completer(MemoryConnection(db), held, SETTINGS, EVENTS)


async def test_outcomes_go_out_in_one_statement_and_are_released() -> None:
    db = MemoryDatabase()
    held = HeldJobs(10)
    writer = completer(db, held)
    jobs = claimed(db, 3)
    for job in jobs:
        writer.submit(held.hold(job), Outcome.success(job, None))
    task = asyncio.create_task(writer.write_loop())
    await until(lambda: len(held) == 0, 5)
    task.cancel()
    assert len(db.sent("job_finish")) == 1
    assert {db.state(j.id) for j in jobs} == {"succeeded"}


async def test_a_refused_batch_is_written_one_by_one_and_a_lost_connection_retried() -> None:
    db = MemoryDatabase()
    held = HeldJobs(10)
    writer = completer(db, held)
    jobs = claimed(db, 2)
    db.fail("job_finish", psycopg.OperationalError("connection lost"))
    db.fail("job_finish", psycopg.DataError("bad value"))
    for job in jobs:
        writer.submit(held.hold(job), Outcome.success(job, None))
    task = asyncio.create_task(writer.write_loop())
    await until(lambda: len(held) == 0, 5)
    task.cancel()
    # lost connection, refused batch, then one statement per outcome
    assert [len(s.params["ids"]) for s in db.sent("job_finish")] == [2, 2, 1, 1]
    assert {db.state(j.id) for j in jobs} == {"succeeded"}


async def test_an_outcome_whose_lease_was_lost_while_waiting_is_dropped() -> None:
    db = MemoryDatabase()
    held = HeldJobs(10)
    writer = completer(db, held)
    [job] = claimed(db)
    writer.submit(held.hold(job), Outcome.success(job, None))
    held.lose(job.id, job.lease_token)
    task = asyncio.create_task(writer.write_loop())
    await until(lambda: len(held) == 0, 5)
    task.cancel()
    assert db.sent("job_finish") == [] and writer.stats["lost"] == 1


# -- the lease keeper -----------------------------------------------------------------------


async def test_a_lost_lease_cancels_the_running_handler() -> None:
    db = MemoryDatabase()
    held = HeldJobs(10)
    info = WorkerInfo("unit", "host", 1, "0", None, 10)
    load = WorkerLoad(held=2, running=2, hung=0, claimed=2, claim_seconds_ago=0.5)
    keeper = LeaseKeeper(MemoryConnection(db), held, SETTINGS, EVENTS, info, lambda: load)
    kept, lost = claimed(db, 2)
    for job in (kept, lost):
        held.hold(job).task = asyncio.create_task(asyncio.sleep(10))
    db.jobs[lost.id]["state"] = "cancelled"  # an operator cancelled it
    await keeper.beat()
    assert [s.params["ids"] for s in db.sent("job_heartbeat")] == [[kept.id, lost.id]]
    # It said the worker is alive first: its row was missing, so it registered.
    assert db.workers["unit"]["pid"] == 1
    entry = held.get(lost.id)
    assert entry is not None and entry.lost
    await asyncio.sleep(0)
    assert entry.task is not None and entry.task.cancelled()
    kept_task = held.get(kept.id).task  # type: ignore[union-attr]
    assert kept_task is not None and not kept_task.done()
    await keeper.beat()  # the next heartbeat reports what the worker holds
    assert db.workers["unit"]["held"] == 2
    kept_task.cancel()


class Meanwhile(MemoryConnection):
    """Runs ``meanwhile`` once, when the first heartbeat is out."""

    def __init__(self, db: MemoryDatabase, meanwhile: Any) -> None:
        super().__init__(db)
        self.meanwhile = meanwhile

    async def drive(self, flow: Any) -> Any:
        outer = self

        class Session:
            async def execute(self, statement: Any) -> list[Any]:
                if statement.name == "job_heartbeat" and outer.meanwhile is not None:
                    outer.meanwhile()
                    outer.meanwhile = None
                return outer.db.execute(statement)

        return await driver.drive_async(flow, Session())


async def test_a_heartbeat_that_finds_an_attempt_gone_leaves_the_jobs_newer_attempt_alone() -> None:
    """A snooze of 0 s commits and the job is claimed again by the same
    worker while a heartbeat of the old attempt's token is out: the reply
    says that token is gone, and the newer attempt, holding the job's id
    by then, must keep its lease (it was dropped, never heartbeated again,
    and reaped dead when its lease expired)."""
    db = MemoryDatabase()
    held = HeldJobs(10)
    [job] = claimed(db)
    first = held.hold(job)
    first.stage = Stage.DONE  # its snooze waits in the outbox
    again: list[Held] = []

    def snoozed_and_claimed_again() -> None:
        db.jobs[job.id]["state"] = "queued"
        [newer] = claimed(db)
        held.release(job.id, first)
        again.append(held.hold(newer))

    info = WorkerInfo("unit", "host", 1, "0", None, 10)
    load = WorkerLoad(held=1, running=1, hung=0, claimed=2, claim_seconds_ago=0.5)
    conn = Meanwhile(db, snoozed_and_claimed_again)
    keeper = LeaseKeeper(conn, held, SETTINGS, EVENTS, info, lambda: load)
    await keeper.beat()
    [newer] = again
    assert newer.job.lease_token != job.lease_token
    assert held.get(job.id) is newer and not newer.lost
    await keeper.beat()
    assert db.sent("job_heartbeat")[-1].params["tokens"] == [newer.job.lease_token]


# -- a job's own context -------------------------------------------------------------------


async def test_in_context_runs_a_coroutine_as_its_own_task_would() -> None:
    """Values, errors, timeouts and cancellations pass as through a task,
    and what the coroutine sets in its context stays there."""
    CALLER.set("outside")

    async def job(fail: bool) -> str:
        seen = CALLER.get()
        CALLER.set("inside")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.01):  # cancels the runner's task, then uncancels it
                await asyncio.sleep(1)
        if fail:
            raise KeyError(seen)
        return seen

    assert await in_context(job(False), contextvars.copy_context()) == "outside"
    with pytest.raises(KeyError, match="outside"):
        await in_context(job(True), contextvars.copy_context())
    assert CALLER.get() == "outside"
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0

    async def stubborn() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "cancelled inside"
        return "not cancelled"

    runner = asyncio.create_task(in_context(stubborn(), contextvars.copy_context()))
    await asyncio.sleep(0.01)
    runner.cancel()
    assert await runner == "cancelled inside"


# -- the producer -------------------------------------------------------------------------


async def test_the_producer_claims_no_more_than_the_free_slots() -> None:
    db = MemoryDatabase()
    for _ in range(5):
        db.add()
    held = HeldJobs(2)
    started: list[Job] = []

    def start(jobs: list[Job]) -> None:
        for job in jobs:
            held.hold(job)
        started.extend(jobs)

    producer = Producer(
        MemoryConnection(db), held, SETTINGS, EVENTS, queues=["default"], start=start
    )
    task = asyncio.create_task(producer.claim_loop())
    await until(lambda: len(started) == 2)
    await asyncio.sleep(0.1)  # no slot is free: no further claim
    assert [s.params["limit"] for s in db.sent("job_claim")] == [2]
    producer.stop()
    await asyncio.wait_for(task, 5)


def idle_producer(db: MemoryDatabase, **kwargs: Any) -> Producer:
    """A producer whose poll is far longer than any test: only a wake-up
    makes it claim again."""
    slow = SETTINGS.replace(poll_interval_seconds=60)
    return Producer(
        MemoryConnection(db), HeldJobs(10), slow, EVENTS, start=lambda jobs: None, **kwargs
    )


async def test_an_ended_job_of_a_concurrency_limited_queue_wakes_the_producer() -> None:
    db = MemoryDatabase()
    db.limited = ["limited"]
    producer = idle_producer(db, queues=["limited", "other"])
    lookout = asyncio.create_task(producer.lookout_loop())
    task = asyncio.create_task(producer.claim_loop())
    await until(lambda: len(db.sent("queue_next_wake")) == 1)  # knows the limits
    await until(lambda: len(db.sent("job_claim")) == 1)  # and is idle
    await asyncio.sleep(0.05)
    claims = len(db.sent("job_claim"))
    producer.jobs_ended({"other"})
    await asyncio.sleep(0.05)
    assert len(db.sent("job_claim")) == claims  # no slot of a limit was freed
    producer.jobs_ended({"limited"})
    await until(lambda: len(db.sent("job_claim")) == claims + 1)
    producer.stop()
    lookout.cancel()
    await asyncio.wait_for(task, 5)


async def test_a_producer_of_every_queue_claims_from_those_it_finds_or_hears_of() -> None:
    db = MemoryDatabase()
    db.add(queue="found")
    producer = idle_producer(db, queues=None)

    async def hints() -> Any:
        yield None
        await until(lambda: db.sent("job_claim") != [])
        db.add(queue="new")
        yield "new"
        await asyncio.Event().wait()

    tasks = [
        asyncio.create_task(producer.claim_loop()),
        asyncio.create_task(producer.listen_loop(hints)),
        asyncio.create_task(producer.lookout_loop()),
    ]
    await until(lambda: any("new" in s.params["queues"] for s in db.sent("job_claim")))
    assert db.sent("job_claim")[0].params["queues"] == ["found"]
    assert {db.state(i) for i in db.jobs} == {"running"}
    producer.stop()
    for task in tasks[1:]:
        task.cancel()
    await asyncio.wait_for(tasks[0], 5)


class SlowListing(MemoryConnection):
    """Lists the queues as they were when asked, and answers 50 ms later."""

    async def drive(self, flow: Any) -> Any:
        db = self.db

        class Session:
            async def execute(self, statement: Any) -> list[Any]:
                rows = db.execute(statement)
                if statement.name == "queue_names_queued":
                    await asyncio.sleep(0.05)
                return rows

        return await driver.drive_async(flow, Session())


async def test_a_queue_heard_of_while_the_queues_are_listed_is_not_forgotten() -> None:
    db = MemoryDatabase()
    slow = SETTINGS.replace(poll_interval_seconds=60)
    producer = Producer(
        SlowListing(db), HeldJobs(10), slow, EVENTS, queues=None, start=lambda jobs: None
    )

    async def hints() -> Any:
        yield None
        await until(lambda: db.sent("queue_names_queued") != [])
        db.add(queue="new")  # enqueued, and its hint heard, while the listing runs
        yield "new"
        await asyncio.Event().wait()

    listener = asyncio.create_task(producer.listen_loop(hints))
    lookout = asyncio.create_task(producer.lookout_loop())
    claimer = asyncio.create_task(producer.claim_loop())
    await until(lambda: db.jobs and next(iter(db.jobs.values()))["state"] == "running")
    assert producer.known == ["new"]
    producer.stop()
    listener.cancel()
    lookout.cancel()
    await asyncio.wait_for(claimer, 5)


class Recorded(MemoryConnection):
    """Records the names of the statements sent on this connection."""

    def __init__(self, db: MemoryDatabase) -> None:
        super().__init__(db)
        self.names: list[str] = []

    async def drive(self, flow: Any) -> Any:
        db, names = self.db, self.names

        class Session:
            async def execute(self, statement: Any) -> list[Any]:
                names.append(statement.name)
                return db.execute(statement)

        return await driver.drive_async(flow, Session())


async def test_the_claimers_connections_carry_claims_and_nothing_else() -> None:
    """The lookout lists the queues, asks when a job is next due and reads
    the fair queues and latency objectives on a connection of its own, so
    that a slow listing cannot hold up a claim."""
    db = MemoryDatabase()
    db.add(queue="found")
    claims, lookout = Recorded(db), Recorded(db)
    producer = Producer(
        claims,
        HeldJobs(10),
        SETTINGS.replace(poll_interval_seconds=0.05),
        EVENTS,
        queues=None,
        start=lambda jobs: None,
        more=[claims],
        lookout=lookout,
    )
    tasks = [
        asyncio.create_task(producer.claim_loop()),
        asyncio.create_task(producer.lookout_loop()),
    ]
    await until(lambda: db.state(1) == "running")
    await until(lambda: lookout.names.count("queue_names_queued") >= 3)  # every poll interval
    producer.stop()
    tasks[1].cancel()
    await asyncio.wait_for(tasks[0], 5)
    assert set(claims.names) == {"job_claim"}
    assert set(lookout.names) == {"queue_names_queued", "queue_next_wake", "queue_claim_hints"}


async def test_a_producer_asks_first_the_queues_behind_their_objectives() -> None:
    """The lookout learns the objectives; each claim then reads the lags of
    those queues and asks first, for every slot, the one behind its own."""
    db = MemoryDatabase()
    db.objectives = {"tight": 10.0}
    for _ in range(4):
        db.add(queue="bulk")
    db.advance(5.0)  # tight's jobs have waited 5 s of 10: half way
    for _ in range(4):
        db.add(queue="tight")
    db.advance(5.0)
    claims, lookout = Recorded(db), Recorded(db)
    started: list[Job] = []
    producer = Producer(
        claims, HeldJobs(4), SETTINGS, EVENTS, queues=["bulk", "tight"], start=started.extend,
        lookout=lookout,
    )  # fmt: skip
    looking = asyncio.create_task(producer.lookout_loop())
    await until(lambda: "queue_claim_hints" in lookout.names)
    claiming = asyncio.create_task(producer.claim_loop())
    await until(lambda: len(started) >= 4)
    producer.stop()
    looking.cancel()
    await asyncio.wait_for(claiming, 5)
    assert [job.queue for job in started[:4]] == ["tight"] * 4
    assert claims.names[:2] == ["queue_start_lags", "job_claim"]


async def test_a_fair_queues_claims_are_short_and_count_as_full() -> None:
    """A fair queue gives at most FAIR_CLAIM_JOBS a claim; a claim that took
    that many is full (more may wait), so the next goes out at once."""
    db = MemoryDatabase()
    db.fair = ["tenants"]
    for _ in range(2 * FAIR_CLAIM_JOBS + 10):
        db.add(queue="tenants")
    started: list[Job] = []
    lookout = Recorded(db)
    producer = Producer(
        MemoryConnection(db), HeldJobs(1000), SETTINGS, EVENTS, queues=["tenants"],
        start=started.extend, lookout=lookout,
    )  # fmt: skip
    looking = asyncio.create_task(producer.lookout_loop())
    await until(lambda: "queue_claim_hints" in lookout.names)
    claiming = asyncio.create_task(producer.claim_loop())
    await until(lambda: len(started) == 2 * FAIR_CLAIM_JOBS + 10)
    producer.stop()
    looking.cancel()
    await asyncio.wait_for(claiming, 5)
    shares = [max(s.params["shares"]) for s in db.sent("job_claim")]
    assert shares[:3] == [FAIR_CLAIM_JOBS] * 3


class Gated(MemoryConnection):
    """A claim connection whose claims wait until the test opens the gate."""

    def __init__(self, db: MemoryDatabase) -> None:
        super().__init__(db)
        self.gate = asyncio.Event()
        self.in_flight = 0
        self.limits: list[int] = []

    async def drive(self, flow: Any) -> Any:
        gated = self

        class Session:
            async def execute(self, statement: Any) -> list[Any]:
                gated.limits.append(statement.params["limit"])
                gated.in_flight += 1
                await gated.gate.wait()
                gated.in_flight -= 1
                return gated.db.execute(statement)

        return await driver.drive_async(flow, Session())


async def test_a_hint_during_a_claim_starts_the_next_claim_on_the_other_connection() -> None:
    db = MemoryDatabase()
    conns = [Gated(db), Gated(db)]
    conns[0].gate.set()
    conns[1].gate.set()
    producer = Producer(
        conns[0],
        HeldJobs(10),
        SETTINGS.replace(poll_interval_seconds=60),
        EVENTS,
        queues=["default"],
        start=lambda jobs: None,
        more=conns[1:],
    )
    task = asyncio.create_task(producer.claim_loop())
    await until(lambda: sum(len(c.limits) for c in conns) == 1)  # nothing found: idle
    await asyncio.sleep(0.05)
    assert sum(len(c.limits) for c in conns) == 1  # one claimer polls
    for conn in conns:
        conn.gate.clear()
    producer.wake()
    await until(lambda: sum(c.in_flight for c in conns) == 1)
    busy, other = conns if conns[0].in_flight else conns[::-1]
    db.add()
    producer.wake()  # while that claim is out
    await until(lambda: other.in_flight == 1)
    # Each asked for a share of the room: the queues had run dry.
    assert busy.limits[-1] == other.limits[-1] == 5
    other.gate.set()
    await until(lambda: db.state(1) == "running")
    busy.gate.set()
    producer.stop()
    await asyncio.wait_for(task, 5)


async def test_a_fair_queues_two_claims_are_out_at_once_each_for_its_cap() -> None:
    """A claim of a fair queue reserves only the slots it can take (its
    cap), not every free one: the other claimer's claim goes out beside it,
    so that a key coming beside a backlog waits for whichever begins next."""
    db = MemoryDatabase()
    db.fair = ["tenants"]
    for _ in range(4 * FAIR_CLAIM_JOBS):
        db.add(queue="tenants")
    conns = [Gated(db), Gated(db)]
    lookout = Recorded(db)
    producer = Producer(
        conns[0], HeldJobs(4 * FAIR_CLAIM_JOBS), SETTINGS, EVENTS, queues=["tenants"],
        start=lambda jobs: None, more=conns[1:], lookout=lookout,
    )  # fmt: skip
    looking = asyncio.create_task(producer.lookout_loop())
    await until(lambda: "queue_claim_hints" in lookout.names)
    claiming = asyncio.create_task(producer.claim_loop())
    await until(lambda: conns[0].in_flight == conns[1].in_flight == 1)
    assert conns[0].limits == conns[1].limits == [FAIR_CLAIM_JOBS]
    for conn in conns:
        conn.gate.set()
    producer.stop()
    looking.cancel()
    await asyncio.wait_for(claiming, 5)


async def test_the_lookout_asks_when_a_job_is_next_due_only_after_a_short_claim() -> None:
    """A worker whose claims all come back full would never sleep until then."""
    db = MemoryDatabase()
    lookout = Recorded(db)
    producer = Producer(
        MemoryConnection(db),
        HeldJobs(10),
        SETTINGS.replace(poll_interval_seconds=0.02),
        EVENTS,
        queues=["default"],
        start=lambda jobs: None,
        lookout=lookout,
    )
    task = asyncio.create_task(producer.lookout_loop())

    def asked() -> list[str]:  # (the fair queues and objectives are read every round)
        return [name for name in lookout.names if name == "queue_next_wake"]

    await until(lambda: asked() == ["queue_next_wake"])  # it starts by asking
    producer._claimed([], full=True)
    await asyncio.sleep(0.1)  # five rounds
    assert asked() == ["queue_next_wake"]
    producer._claimed([], full=False)
    await until(lambda: asked() == ["queue_next_wake"] * 2)
    task.cancel()


# -- the whole worker ------------------------------------------------------------------------


def memory_worker(
    db: MemoryDatabase, handlers: dict[str, Any], settings: Settings = SETTINGS, **kwargs: Any
) -> AsyncWorker:
    return AsyncWorker(
        handlers,
        settings=settings,
        connect=lambda url: MemoryConnection(db),
        hints=lambda url: no_hints(),
        **kwargs,
    )


async def test_the_worker_runs_jobs_from_claim_to_ack() -> None:
    db = MemoryDatabase()
    ids = [db.add("echo") for _ in range(20)]
    worker = memory_worker(db, {"echo": lambda job: job.id}, concurrency=5)
    async with running(worker):
        await until(lambda: all(db.state(i) == "succeeded" for i in ids))
    assert worker.stats["succeeded"] == 20 and worker.stats["claimed"] == 20


async def test_one_runner_runs_the_waiting_jobs_each_in_a_context_of_its_own() -> None:
    """With one slot, the jobs that wait for it run on the runner of the
    first, one after another; none sees what the one before set in its
    context, nor the cancellation of the one whose lease was lost."""
    db = MemoryDatabase()
    seen: list[tuple[asyncio.Task[Any] | None, str, int]] = []
    blocking = asyncio.Event()

    async def probe(job: Job) -> None:
        task = asyncio.current_task()
        seen.append((task, CALLER.get(), task.cancelling() if task else -1))
        CALLER.set(f"job {job.id}")
        if job.payload.get("block"):
            blocking.set()
            await asyncio.sleep(30)  # until its lease is lost

    worker = memory_worker(db, {"probe": probe}, concurrency=1)
    jobs = claimed(db, 2, task="probe") + claimed(db, 1, task="probe", payload={"block": True})
    jobs += claimed(db, 3, task="probe")
    CALLER.set("the caller of run()")
    async with running(worker):
        await until(lambda: worker.running_count == 0 and db.sent("schedule_next_due"))
        worker.runners.start(jobs)
        assert worker.running_count == 1 and worker.held.prefetched == 5
        await asyncio.wait_for(blocking.wait(), 5)
        db.jobs[jobs[2].id]["state"] = "cancelled"  # an operator cancelled it
        await worker.lease_keeper.beat()
        await until(lambda: len(worker.held) == 0)
    assert len(seen) == 6 and len({id(task) for task, _, _ in seen}) == 1
    assert [caller for _, caller, _ in seen] == ["the caller of run()"] * 6
    assert [cancelling for _, _, cancelling in seen] == [0] * 6
    assert worker.stats["succeeded"] == 5 and worker.stats["lost"] == 1


LARGE_CLAIM = 3 * RUNNERS_AT_ONCE


@contextlib.asynccontextmanager
async def large_claim_started(handler: Any) -> AsyncIterator[tuple[AsyncWorker, list[Job]]]:
    """A running worker with LARGE_CLAIM slots, given a claim of as many
    jobs of ``handler``, which it has just started."""
    db = MemoryDatabase()
    worker = memory_worker(db, {"h": handler}, concurrency=LARGE_CLAIM)
    jobs = claimed(db, LARGE_CLAIM, task="h")
    async with running(worker):
        await until(lambda: db.sent("schedule_next_due"))
        worker.runners.start(jobs)
        yield worker, jobs
        await until(lambda: all(db.state(job.id) == "succeeded" for job in jobs))


async def test_a_large_claim_of_short_jobs_runs_on_at_most_runners_at_once_tasks() -> None:
    """With more slots than RUNNERS_AT_ONCE, a claim's jobs that never wait
    on anything run on that many runners, not on a task each."""
    tasks: set[int] = set()

    async def short(job: Job) -> None:
        tasks.add(id(asyncio.current_task()))

    async with large_claim_started(short) as (worker, _):
        assert worker.running_count == RUNNERS_AT_ONCE
    assert len(tasks) <= RUNNERS_AT_ONCE


async def test_a_large_claim_of_jobs_that_wait_runs_them_all_at_once() -> None:
    """The jobs of a large claim that found no runner at once start as soon
    as the runners' jobs wait on something: every slot's job runs at the
    same time, as concurrency promises."""
    started, release = [0], asyncio.Event()

    async def waits(job: Job) -> None:
        started[0] += 1
        await release.wait()

    async with large_claim_started(waits) as (worker, _):
        await until(lambda: started[0] == LARGE_CLAIM)
        assert worker.running_count == LARGE_CLAIM and worker.held.prefetched == 0
        release.set()


async def test_a_large_claim_of_sync_jobs_runs_them_all_at_once() -> None:
    """Sync handlers too: a runner's first wait is its thread, which starts
    runners for the claim's other jobs, so that every slot's thread runs at
    the same time."""
    lock, started, release = threading.Lock(), [0], threading.Event()

    def blocks(job: Job) -> None:
        with lock:
            started[0] += 1
        release.wait(10)

    async with large_claim_started(blocks) as (worker, _):
        await until(lambda: started[0] == LARGE_CLAIM)
        assert worker.running_count == LARGE_CLAIM and worker.held.prefetched == 0
        release.set()


async def test_a_job_waiting_behind_a_hung_thread_starts_when_the_thread_returns() -> None:
    db = MemoryDatabase()
    release = threading.Event()

    def hang(job: Job) -> None:
        release.wait(10)

    worker = memory_worker(db, {"hang": hang, "quick": lambda job: "done"}, concurrency=1)
    jobs = claimed(db, 1, task="hang", timeout_seconds=0.1) + claimed(db, 1, task="quick")
    async with running(worker):
        await until(lambda: db.sent("schedule_next_due"))
        worker.runners.start(jobs)
        await until(lambda: db.state(jobs[0].id) == "queued")  # timed out: retried later
        assert worker.degraded and worker.held.prefetched == 1
        release.set()
        await until(lambda: db.state(jobs[1].id) == "succeeded")


async def test_an_unexpected_error_in_a_part_stops_the_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = MemoryDatabase()
    db.add("echo")  # a worker of every queue claims from the queues that have jobs
    db.fail("job_claim", RuntimeError("a bug"))
    caplog.set_level(logging.ERROR, logger="pgqueue.worker")
    with pytest.raises(WorkerFailed, match="claims failed: RuntimeError: a bug"):
        await asyncio.wait_for(memory_worker(db, {}).run(), 5)
    assert "Traceback" in caplog.text


async def test_an_unexpected_error_in_a_runner_stops_the_worker(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Completer, held: Any, outcome: Outcome) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Completer, "submit", broken)
    db = MemoryDatabase()
    db.add("echo")
    caplog.set_level(logging.ERROR, logger="pgqueue.worker")
    with pytest.raises(WorkerFailed, match="jobs failed: RuntimeError: a bug"):
        # (Its outcome never comes: the drain gives up after the shutdown timeout.)
        quick = SETTINGS.replace(shutdown_timeout_seconds=0.1)
        await asyncio.wait_for(memory_worker(db, {"echo": lambda job: None}, quick).run(), 10)
    assert "Traceback" in caplog.text


async def test_database_errors_are_waited_out_not_fatal() -> None:
    db = MemoryDatabase()
    db.fail("job_claim", psycopg.OperationalError("server closed the connection"), times=3)
    job_id = db.add("echo")
    async with running(memory_worker(db, {"echo": lambda job: None})):
        await until(lambda: db.state(job_id) == "succeeded")
    assert len(db.sent("job_claim")) >= 4


async def test_maintenance_prunes_jobs_workers_and_waits_and_the_worker_runs_on() -> None:
    # Pruning is due at a random moment of its first interval: made short
    # here, so that every chore of it runs while the worker works.
    db = MemoryDatabase()
    settings = dataclasses.replace(SETTINGS, prune_interval_seconds=0.05)
    async with running(memory_worker(db, {"echo": lambda job: None}, settings)):
        await until(lambda: len(db.sent("wait_prune")) >= 2)
        job_id = db.add("echo")
        await until(lambda: db.state(job_id) == "succeeded")
    assert db.sent("job_prune") and db.sent("worker_prune")


async def test_the_worker_waits_for_the_schema_and_starts_when_it_appears(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pgqueue.worker")
    db = MemoryDatabase(migrated=False)
    job_id = db.add("echo")
    async with running(memory_worker(db, {"echo": lambda job: None})):
        await until(lambda: "schema not migrated" in caplog.text)
        await asyncio.sleep(0.2)
        assert db.sent("job_claim") == [] and db.state(job_id) == "queued"
        db.migrated = True
        await until(lambda: db.state(job_id) == "succeeded")
    assert caplog.text.count("schema not migrated") == 1


async def test_the_worker_opens_every_connection_before_its_parts_start() -> None:
    """Not at each one's first statement, which under a backlog is a claim
    or an ack that would wait for the connection."""
    db = MemoryDatabase()
    job_id = db.add("echo")
    made: list[MemoryConnection] = []
    opened_before_use: dict[int, bool] = {}

    class Watched(MemoryConnection):
        async def drive(self, flow: Any) -> Any:
            opened_before_use.setdefault(id(self), self.opened)
            return await super().drive(flow)

    def connect(url: str) -> MemoryConnection:
        made.append(Watched(db))
        return made[-1]

    worker = AsyncWorker(
        {"echo": lambda job: None}, settings=SETTINGS, connect=connect, hints=lambda url: no_hints()
    )
    async with running(worker):
        await until(lambda: db.state(job_id) == "succeeded")
    # The last is the upkeep connection: the schema check, before all, opens it.
    used = [opened_before_use[id(conn)] for conn in made[:-1] if id(conn) in opened_before_use]
    assert len(made) == 4 and len(used) >= 2  # a claimer's and a writer's, at least
    assert all(used)


async def test_a_stopped_worker_fails_the_attempts_of_handlers_past_the_shutdown_timeout() -> None:
    db = MemoryDatabase()
    job_id = db.add("slow")

    async def slow(job: Job) -> None:
        await asyncio.sleep(30)

    worker = AsyncWorker(
        {"slow": slow},
        settings=SETTINGS.replace(shutdown_timeout_seconds=0.1),
        connect=lambda url: MemoryConnection(db),
        hints=lambda url: no_hints(),
    )
    async with running(worker):
        await until(lambda: db.state(job_id) == "running")
    assert db.state(job_id) == "queued"
    assert "interrupted" in db.jobs[job_id]["last_error"]
    assert JobState(db.state(job_id)) is JobState.QUEUED


@contextlib.asynccontextmanager
async def claiming_and_listening(
    producer: Producer, gates: list[Gated]
) -> AsyncIterator[asyncio.Queue[str]]:
    """Run the producer's claim loop and listen loop; yield where to put the
    hints it hears. At the end, the gates open and it stops."""
    hinted = asyncio.Queue[str]()

    async def hints() -> Any:
        yield None
        while True:
            yield await hinted.get()

    tasks = [
        asyncio.create_task(producer.claim_loop()),
        asyncio.create_task(producer.listen_loop(hints)),
    ]
    try:
        yield hinted
    finally:
        for gate in gates:
            gate.gate.set()
        producer.stop()
        tasks[1].cancel()
        await asyncio.wait_for(tasks[0], 5)


@contextlib.asynccontextmanager
async def under_backlog(
    queues: list[str], **start: Any
) -> AsyncIterator[tuple[MemoryDatabase, Recorded, asyncio.Queue[str]]]:
    """A producer of ``queues`` whose claims took a backlog of the queue
    "backlog" (the others gave nothing) and whose next claim is out (held
    at its gate): the database, the lookout's connection and where to put
    the hints it hears."""
    db = MemoryDatabase()
    for _ in range(30):
        db.add(queue="backlog")
    claims = [Gated(db), Gated(db)]
    lookout = Recorded(db)
    producer = Producer(
        claims[0], HeldJobs(10, prefetch=10), SETTINGS, EVENTS, queues=queues, more=claims[1:],
        lookout=lookout, **{"start": lambda jobs: None, **start},
    )  # fmt: skip
    async with claiming_and_listening(producer, claims) as hinted:
        claims[0].gate.set()
        await until(lambda: producer.stats["claims"] >= 1)
        claims[0].gate.clear()
        producer.held.ahead = 5  # as the pace of a busy worker would set it
        producer.held.slot_freed.set()
        await until(lambda: claims[0].in_flight + claims[1].in_flight >= 1)
        yield db, lookout, hinted


async def test_a_quiet_queue_hinted_under_a_backlog_is_claimed_at_once_by_the_lookout() -> None:
    """A worker busy with a backlog of one queue claims in big batches; a
    job of another of its queues, quiet until now, is claimed at once on
    the lookout's connection while the claimers' claims are out, and starts
    before the jobs claimed ahead."""
    started: list[tuple[bool, list[str]]] = []
    async with under_backlog(
        ["backlog", "quiet"],
        start=lambda jobs: started.append((False, [j.queue for j in jobs])),
        start_first=lambda jobs: started.append((True, [j.queue for j in jobs])),
    ) as (db, lookout, hinted):
        assert started == [(False, ["backlog"] * 10)]  # "quiet" gave nothing
        quiet = db.add(queue="quiet")
        await hinted.put("quiet")
        await until(lambda: db.state(quiet) == "running")
        assert started[-1] == (True, ["quiet"])
        assert "job_claim" in lookout.names


async def test_a_hint_of_a_queue_that_gave_jobs_waits_for_the_claimers() -> None:
    """Under a backlog of the hinted queue itself, its hints make no extra
    claims: its jobs come in the claimers' batches."""
    async with under_backlog(["backlog"]) as (db, lookout, hinted):
        db.add(queue="backlog")
        await hinted.put("backlog")
        await asyncio.sleep(0.05)
        assert "job_claim" not in lookout.names


@pytest.mark.parametrize(
    "why", ["allowance full", "hung threads", "nothing claimed ahead"], ids=str
)
async def test_a_worker_that_would_hold_the_job_makes_no_quick_claim(why: str) -> None:
    """A hint of a quiet queue claims nothing when outcomes not yet written
    fill the worker's allowance (a database outage), when hung threads hold
    its slots (it starts nothing soon: a healthy worker should take the
    job), or when it claims nothing ahead (long jobs)."""
    db = MemoryDatabase()
    held = HeldJobs(1, hung_threads=lambda: 1 if why == "hung threads" else 0, prefetch=5)
    held.ahead = 0 if why == "nothing claimed ahead" else 5
    if why == "allowance full":
        for _ in range(12):  # 2 * (concurrency + prefetch)
            db.add(queue="backlog")
        for job in driver.drive(t.claim(SETTINGS, limit=12, worker="unit"), db):
            held.hold(job)
    lookout = Recorded(db)
    producer = Producer(
        MemoryConnection(db), held, SETTINGS, EVENTS, queues=["backlog", "quiet"],
        start=lambda jobs: None, lookout=lookout,
    )  # fmt: skip
    producer._sparse = frozenset({"quiet"})  # as the last claim, full, left it
    quick = asyncio.create_task(producer.quick_loop())
    db.add(queue="quiet")
    producer._hinted("quiet")
    await asyncio.sleep(0.05)
    assert lookout.names == []
    producer.stop()
    await asyncio.wait_for(quick, 5)


async def test_a_worker_of_every_queue_claims_before_the_lookout_has_listed_them() -> None:
    """Its first claim lists the queues itself: under a backlog it does not
    ask no queue and then wait for the lookout's listing (no lookout runs
    here, and its poll is far longer than the test)."""
    db = MemoryDatabase()
    job_id = db.add(queue="backlog")
    producer = idle_producer(db, queues=None)
    task = asyncio.create_task(producer.claim_loop())
    await until(lambda: db.state(job_id) == "running")
    assert db.sent("queue_names_queued") != []
    assert db.sent("job_claim")[0].params["queues"] == ["backlog"]
    producer.stop()
    await asyncio.wait_for(task, 5)


async def test_a_hint_of_a_queue_that_ran_dry_at_a_short_claim_makes_no_quick_claim() -> None:
    """No backlog, a claim out (one queue at moderate load): the hint of its
    queue, dry at the last claim, waits for the claimers, who are not busy
    with a backlog; the lookout's connection claims nothing."""
    db = MemoryDatabase()
    claims, lookout = Gated(db), Recorded(db)
    claims.gate.set()
    slow = SETTINGS.replace(poll_interval_seconds=60)
    producer = Producer(
        claims, HeldJobs(10), slow, EVENTS, queues=["default"], start=lambda jobs: None,
        lookout=lookout,
    )  # fmt: skip
    async with claiming_and_listening(producer, [claims]) as hinted:
        await until(lambda: producer.stats["claims"] >= 1)  # nothing: the queue is dry
        claims.gate.clear()
        producer.wake()
        await until(lambda: claims.in_flight == 1)  # a claim is out
        job_id = db.add()
        await hinted.put("default")
        await asyncio.sleep(0.05)
        assert "job_claim" not in lookout.names
        claims.gate.set()
        await until(lambda: db.state(job_id) == "running")
