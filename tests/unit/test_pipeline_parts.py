"""The pipelined worker over the in-memory database: the prefetch buffer
(jobs claimed ahead of the free slots, started as slots free up, dropped
when their lease is lost), a producer that claims ahead as far as its pace
asks and no further, outcomes written on two connections at once, and
prefetched jobs given back at shutdown."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pgqueue import Job, Settings
from pgqueue.core import transitions as t
from pgqueue.core.outcomes import Outcome
from pgqueue.db import driver
from pgqueue.worker import AsyncWorker
from pgqueue.worker.completer import ACK_DELAY_SECONDS, Completer
from pgqueue.worker.held import HeldJobs, Stage
from pgqueue.worker.producer import Producer
from pgqueue.worker.supervision import EventLog
from tests.support import running, until
from tests.unit.memory import MemoryConnection, MemoryDatabase, no_hints

SETTINGS = Settings(database_url="memory://", poll_interval_seconds=0.05)
EVENTS = EventLog("unit")


def claimed(db: MemoryDatabase, count: int) -> list[Job]:
    for _ in range(count):
        db.add()
    return driver.drive(t.claim(SETTINGS, limit=count, worker="unit"), db)


# -- the buffer --------------------------------------------------------------------------


def test_waiting_jobs_start_in_claim_order_as_slots_free_up() -> None:
    held = HeldJobs(2, prefetch=3)
    jobs = claimed(MemoryDatabase(), 6)
    entries = [held.hold(job) for job in jobs[:5]]
    assert [e.stage for e in entries] == [Stage.RUNNING] * 2 + [Stage.PREFETCHED] * 3
    assert held.running == 2 and held.prefetched == 3
    assert held.next_ready() is None  # no free slot
    held.handler_finished(entries[0])
    # A job claimed now waits behind those claimed before, though a slot is free.
    assert held.hold(jobs[5]).stage is Stage.PREFETCHED
    assert held.next_ready() is entries[2] and held.running == 2 and held.prefetched == 3


def test_claims_reach_ahead_of_the_free_slots_by_ahead_and_no_further() -> None:
    held = HeldJobs(4, prefetch=6)
    assert held.free_slots() == 4
    held.ahead = 6
    assert held.free_slots() == 10
    for job in claimed(MemoryDatabase(), 10):
        held.hold(job)
    while held.next_ready():
        pass
    assert held.running == 4 and held.prefetched == 6 and held.free_slots() == 0


def test_unwritten_outcomes_bound_the_claims_under_an_outage() -> None:
    held = HeldJobs(2, prefetch=2)
    held.ahead = 2
    for job in claimed(MemoryDatabase(), 8):  # 8 = 2 * (concurrency + prefetch)
        entry = held.hold(job)
        held.handler_finished(entry)  # its outcome is never written
    assert held.free_slots() == 0


def test_leases_of_waiting_jobs_are_kept_and_a_lost_one_never_starts() -> None:
    held = HeldJobs(1, prefetch=2)
    running, first, second = (held.hold(job) for job in claimed(MemoryDatabase(), 3))
    assert (first.stage, second.stage) == (Stage.PREFETCHED, Stage.PREFETCHED)
    assert [i for i, _ in held.leases()] == [running.job.id, first.job.id, second.job.id]
    assert held.lose(first.job.id, first.job.lease_token) is first
    held.handler_finished(running)
    assert held.next_ready() is first and first.lost and held.running == 0
    assert held.next_ready() is second and second.stage is Stage.RUNNING


def test_taken_prefetched_jobs_never_start() -> None:
    held = HeldJobs(1, prefetch=2)
    running, *prefetched = [held.hold(job) for job in claimed(MemoryDatabase(), 3)]
    assert held.take_prefetched() == prefetched
    held.handler_finished(running)
    assert held.next_ready() is None and held.prefetched == 0


def test_jobs_waiting_for_a_runner_are_given_back_at_a_stop_and_never_start() -> None:
    """A large claim's jobs that have slots but no runner yet
    (JobRunners.start's start=False) are taken at a stop, as prefetched
    jobs are: the runners that finish their jobs find none to run."""
    held = HeldJobs(10, prefetch=0)
    running, *waiting = [held.hold(job, start=False) for job in claimed(MemoryDatabase(), 4)]
    held.next_ready()  # the one runner's job
    assert running.stage is Stage.RUNNING and held.running == 1
    assert held.take_prefetched() == waiting and held.prefetched == 0
    held.handler_finished(running)
    assert held.next_ready() is None and held.running == 0


# -- the producer --------------------------------------------------------------------------


class SlowClaims(MemoryConnection):
    """Claims that take 20 ms to come back, as over a slow commit. ``out``
    (shared by the connections of one producer) holds the limits of the
    claims in flight; ``peaks``, at each send, how many were in flight and
    how many jobs they asked for in all."""

    def __init__(self, db: MemoryDatabase, out: list[int] | None = None) -> None:
        super().__init__(db)
        self.out = [] if out is None else out
        self.peaks: list[tuple[int, int]] = []

    async def drive(self, flow: Any) -> Any:
        db, out, peaks = self.db, self.out, self.peaks

        class Session:
            async def execute(self, statement: Any) -> list[Any]:
                if statement.name == "job_claim":
                    out.append(statement.params["limit"])
                    peaks.append((len(out), sum(out)))
                    await asyncio.sleep(0.02)
                    out.remove(statement.params["limit"])
                return db.execute(statement)

        return await driver.drive_async(flow, Session())


async def test_a_busy_producer_claims_ahead_up_to_prefetch() -> None:
    db = MemoryDatabase()
    for _ in range(400):
        db.add()
    held = HeldJobs(10, prefetch=15)

    def end(entry: Any) -> None:  # every job ends as soon as it starts
        held.handler_finished(entry)
        held.release(entry.job.id, entry)

    def start(jobs: list[Job]) -> None:
        for entry in [held.hold(job) for job in jobs]:
            if entry.stage is Stage.RUNNING:
                end(entry)
        while (entry := held.next_ready()) is not None:
            end(entry)

    producer = Producer(SlowClaims(db), held, SETTINGS, EVENTS, queues=["default"], start=start)
    task = asyncio.create_task(producer.claim_loop())
    await until(lambda: all(row["state"] == "running" for row in db.jobs.values()))
    producer.stop()
    await asyncio.wait_for(task, 5)
    limits = [s.params["limit"] for s in db.sent("job_claim")]
    assert limits[0] == 10 and max(limits) == 25  # concurrency + prefetch
    assert held.ahead == 15


async def test_a_producer_of_long_jobs_claims_only_a_job_or_so_ahead() -> None:
    db = MemoryDatabase()
    for _ in range(20):
        db.add()
    held = HeldJobs(4, prefetch=50)
    entries: list[Any] = []

    def start_ready() -> None:  # as the worker does: after a claim, and when a slot frees
        while (entry := held.next_ready()) is not None:
            entries.append(entry)

    def start(jobs: list[Job]) -> None:  # the jobs run until the test ends them
        entries.extend(e for e in (held.hold(job) for job in jobs) if e.stage is Stage.RUNNING)

    producer = Producer(SlowClaims(db), held, SETTINGS, EVENTS, queues=["default"], start=start)
    task = asyncio.create_task(producer.claim_loop())
    await until(lambda: held.running == 4)
    for _ in range(3):  # one job ends every 0.1 s
        await asyncio.sleep(0.1)
        held.handler_finished(entries.pop(0))
        start_ready()
        await until(lambda: held.running == 4)
    await asyncio.sleep(0.1)
    producer.stop()
    await asyncio.wait_for(task, 5)
    assert held.ahead <= 1 and held.prefetched <= 1


def test_the_pace_keeps_a_burst_through_the_lull_after_it_and_forgets_it_over_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Short jobs end in bursts: the buffer is sized by the busiest recent
    rate, not by the last interval's (which a lull puts at 0)."""
    held = HeldJobs(10, prefetch=1000)
    producer = Producer(
        MemoryConnection(MemoryDatabase()), held, SETTINGS, EVENTS, queues=None, start=print
    )
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    producer._paced = (100.0, 0, 0.0)

    def claim_returns(at: float, finished: int, round_trip: float = 0.01) -> int:
        clock[0], held.finished = at, finished
        producer._pace(sent_at=at - round_trip)
        return held.ahead

    assert claim_returns(100.01, 500) == 1000  # 50,000 jobs/s x 2 round trips of 10 ms
    assert claim_returns(100.02, 500) >= 980  # none ended while that claim was out
    assert claim_returns(110.02, 510) == 1  # then a job a second for 10 s


# -- the completer -------------------------------------------------------------------------


class Gated(MemoryConnection):
    """A connection whose writes wait until the test opens the gate."""

    def __init__(self, db: MemoryDatabase) -> None:
        super().__init__(db)
        self.gate = asyncio.Event()
        self.in_flight = 0

    async def drive(self, flow: Any) -> Any:
        self.in_flight += 1
        await self.gate.wait()
        self.in_flight -= 1
        return await super().drive(flow)


async def test_what_arrives_while_a_batch_commits_goes_out_in_one_next_batch() -> None:
    """One writer: the outcomes that came while a batch committed are not
    sent one statement each, but together, as soon as it is done (batches
    grow when commits are slow)."""
    db = MemoryDatabase()
    held = HeldJobs(10)
    conn = Gated(db)
    writer = Completer(conn, held, SETTINGS, EVENTS)
    jobs = claimed(db, 5)
    task = asyncio.create_task(writer.write_loop())
    writer.submit(held.hold(jobs[0]), Outcome.success(jobs[0], None))
    await until(lambda: conn.in_flight == 1)
    for job in jobs[1:]:
        writer.submit(held.hold(job), Outcome.success(job, None))
    await asyncio.sleep(ACK_DELAY_SECONDS * 3)
    assert conn.in_flight == 1  # nothing else goes out while it commits
    conn.gate.set()
    await until(lambda: len(held) == 0)
    task.cancel()
    assert {db.state(job.id) for job in jobs} == {"succeeded"}
    assert len(db.sent("job_finish")) == 2 and writer.stats["succeeded"] == 5


async def test_an_unexpected_error_of_the_writer_ends_the_write_loop() -> None:
    db = MemoryDatabase()
    db.fail("job_finish", RuntimeError("a bug"))
    held = HeldJobs(10)
    writer = Completer(MemoryConnection(db), held, SETTINGS, EVENTS)
    [job] = claimed(db, 1)
    writer.submit(held.hold(job), Outcome.success(job, None))
    try:
        await asyncio.wait_for(writer.write_loop(), 5)
    except RuntimeError as exc:
        assert str(exc) == "a bug"
    else:
        raise AssertionError("the write loop went on after the writer's bug")


# -- shutdown --------------------------------------------------------------------------------


async def test_a_stopping_worker_gives_back_its_prefetched_jobs_at_once() -> None:
    db = MemoryDatabase()
    ids = [db.add("slow") for _ in range(6)]
    release = asyncio.Event()

    async def slow(job: Job) -> None:
        await release.wait()

    worker = AsyncWorker(
        {"slow": slow},
        settings=SETTINGS.replace(prefetch=3),
        connect=lambda url: MemoryConnection(db),
        hints=lambda url: no_hints(),
        concurrency=2,
    )
    async with running(worker):
        await until(lambda: worker.running_count == 2)
        worker.held.ahead = 3  # as the pace of a busy worker would set it
        worker.producer.wake()
        worker.held.slot_freed.set()
        await until(lambda: worker.held.prefetched == 3)
        waiting = [h.job.id for h in worker.held if h.stage is Stage.PREFETCHED]
        worker.request_stop()
        await until(lambda: all(db.state(i) == "queued" for i in waiting))
        assert worker.running_count == 2  # given back while the handlers still run
        release.set()
    assert len(db.sent("job_release")) == 1
    for job_id in waiting:
        row = db.jobs[job_id]
        assert row["attempts"] == 0 and row["lease_expires_at"] is None
    started = [i for i in ids if i not in waiting and db.state(i) != "queued"]
    assert {db.state(i) for i in started} == {"succeeded"} and len(started) == 2


async def test_two_claimers_overlap_and_never_ask_for_more_than_the_room() -> None:
    db = MemoryDatabase()
    for _ in range(400):
        db.add()
    held = HeldJobs(10, prefetch=15)
    ended: list[Any] = []

    def run(entry: Any) -> None:  # every job ends 5 ms after it starts
        asyncio.get_running_loop().call_later(0.005, end, entry)

    def start(jobs: list[Job]) -> None:
        for entry in [held.hold(job) for job in jobs]:
            if entry.stage is Stage.RUNNING:
                run(entry)

    def start_ready() -> None:
        while (entry := held.next_ready()) is not None:
            run(entry)

    def end(entry: Any) -> None:
        held.handler_finished(entry)
        held.release(entry.job.id, entry)
        ended.append(entry)
        start_ready()

    one = SlowClaims(db)
    two = SlowClaims(db, one.out)
    producer = Producer(one, held, SETTINGS, EVENTS, queues=["default"], start=start, more=[two])
    task = asyncio.create_task(producer.claim_loop())
    await until(lambda: len(ended) == 400)
    producer.stop()
    await asyncio.wait_for(task, 5)
    counts, asked = zip(*(one.peaks + two.peaks), strict=True)
    assert max(counts) == 2  # a claim went out while the other was in flight
    assert max(asked) <= 25  # never more than concurrency + prefetch asked for at once
    assert held.running == 0 and len(held) == 0


async def test_an_idle_producer_polls_with_one_claim_not_two() -> None:
    db = MemoryDatabase()
    db.add()
    producer = Producer(
        MemoryConnection(db),
        HeldJobs(10),
        SETTINGS,
        EVENTS,
        queues=["default"],
        start=lambda jobs: None,
        more=[MemoryConnection(db)],
    )
    task = asyncio.create_task(producer.claim_loop())
    await until(lambda: db.jobs[1]["state"] == "running")
    claims = len(db.sent("job_claim"))
    await asyncio.sleep(SETTINGS.poll_interval_seconds * 4.5)
    producer.stop()
    await asyncio.wait_for(task, 5)
    assert len(db.sent("job_claim")) - claims <= 5  # one per poll interval


def test_a_worker_with_hung_threads_claims_nothing_ahead() -> None:
    hung = [0]
    held = HeldJobs(2, hung_threads=lambda: hung[0], prefetch=5)
    held.ahead = 5
    assert held.free_slots() == 7
    hung[0] = 1
    assert held.free_slots() == 1  # the one slot it can start a job in now
    hung[0] = 2
    assert held.free_slots() == 0


def test_jobs_held_first_start_before_the_prefetched_ones_in_claim_order() -> None:
    db = MemoryDatabase()
    held = HeldJobs(1, prefetch=10)
    running, *ahead = claimed(db, 4)
    quick = claimed(db, 2)
    entry = held.hold(running)
    for job in ahead:
        held.hold(job)
    for job in quick:
        assert held.hold(job, first=True).stage is Stage.PREFETCHED  # the one slot is busy
    order = []
    held.handler_finished(entry)
    while (entry := held.next_ready()) is not None:
        order.append(entry.job.id)
        held.handler_finished(entry)
    assert order == [job.id for job in quick + ahead]


def test_a_job_held_first_starts_at_once_when_a_slot_is_free() -> None:
    """Even with prefetched jobs waiting (their runner has not come for them
    yet): a job held first waits behind none of them."""
    db = MemoryDatabase()
    held = HeldJobs(1, prefetch=10)
    jobs = claimed(db, 4)
    first = held.hold(jobs[0])
    assert held.hold(jobs[1]).stage is Stage.PREFETCHED
    held.handler_finished(first)  # a slot is free, its runner not yet back
    assert held.hold(jobs[2]).stage is Stage.PREFETCHED  # behind the waiting one
    assert held.hold(jobs[3], first=True).stage is Stage.RUNNING


def test_jobs_that_wait_for_a_runner_beside_free_slots_are_not_claimed_ahead() -> None:
    """A large claim's jobs that have slots but wait for a runner
    (JobRunners.start) are not jobs claimed ahead: the producer's next claim
    does not wait for them to start."""
    held = HeldJobs(4, prefetch=10)
    jobs = claimed(MemoryDatabase(), 6)
    held.hold(jobs[0])
    for job in jobs[1:]:
        assert held.hold(job, start=False).stage is Stage.PREFETCHED
    assert held.running == 1 and held.prefetched == 5 and held.beyond_slots == 2
    assert held.next_ready() is not None and held.beyond_slots == 2  # one more slot taken
