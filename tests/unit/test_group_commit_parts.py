"""The group committer's batching (group_commit.py) over the in-memory database:
the window, the size cap, one caller's error against the group's, the
supervision of its tasks and the shutdown. What the database does with a
group is proven against PostgreSQL in tests/integration/queue/test_group_commit.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

import psycopg
import pytest

from pgqueue.core.enqueue import CallKey
from pgqueue.core.errors import DatabaseUnavailable, EnqueueOutcomeUnknown
from pgqueue.core.flows import Flow
from pgqueue.core.job_spec import JobSpec
from pgqueue.core.jobs import Job
from pgqueue.core.settings import Settings
from pgqueue.db import driver
from pgqueue.db.group_commit import GroupCommitter
from pgqueue.db.pools import AsyncPool
from pgqueue.db.retrying import Retrying
from tests.unit.memory import MemoryDatabase, MemorySession

T = TypeVar("T")


class Writer(Retrying):
    """A queue's ``Retrying`` over the in-memory database: each call drives
    one attempt of the flow, after ``gate`` opens; ``calls`` records
    (what, transaction) per call."""

    def __init__(self, db: MemoryDatabase) -> None:
        super().__init__(Settings())
        self.db = db
        self.calls: list[tuple[str, bool]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def drive_async(
        self,
        pool: AsyncPool,
        url: str,
        flow: Callable[[], Flow[T]],
        what: str,
        transaction: bool,
        call: CallKey | None = None,
    ) -> T:
        self.calls.append((what, transaction))
        await self.gate.wait()
        return await self.attempt(flow, what, transaction, call)

    async def attempt(
        self, flow: Callable[[], Flow[T]], what: str, transaction: bool, call: CallKey | None
    ) -> T:
        return await driver.drive_async(flow(), MemorySession(self.db))


# The writers over the in-memory database use no pool.
NO_POOL = cast(AsyncPool, None)


def committer(
    db: MemoryDatabase,
    window: float = 0.001,
    max_jobs: int = 100,
    writer: type[Writer] = Writer,
) -> GroupCommitter:
    settings = Settings(group_commit_max_jobs=max_jobs)
    group = GroupCommitter(writer(db), NO_POOL, "", settings)
    group.window = window  # longer than a setting may be: a window no test outlives
    return group


def writer(group: GroupCommitter) -> Writer:
    return group._retrying  # type: ignore[return-value]


# A group of plain jobs goes in by one statement that returns them, with no
# transaction; a group with keys by enqueue_many's INSERT in a transaction.
# The tests of what the committer does around the insert run both ways.
WAYS = pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])


def insert_of(keyed: bool) -> str:
    return "job_enqueue_many" if keyed else "job_enqueue_plain_rows"


def spec(n: int, keyed: bool = False, **fields: Any) -> JobSpec:
    if keyed:
        fields.setdefault("idempotency_key", f"key-{n}")
    return JobSpec.build("t", {"n": n}, **fields)


def group_sizes(db: MemoryDatabase) -> list[int]:
    inserts = [s for s in db.statements if s.name in ("job_enqueue_many", "job_enqueue_plain_rows")]
    return [len(s.params["id"]) for s in inserts]


async def enqueue_all(group: GroupCommitter, specs: list[JobSpec]) -> list[Any]:
    return await asyncio.gather(*(group.enqueue(s) for s in specs), return_exceptions=True)


@WAYS
async def test_jobs_arriving_together_go_out_as_one_group_each_caller_its_own_job(
    keyed: bool,
) -> None:
    db = MemoryDatabase()
    group = committer(db)
    jobs = await enqueue_all(group, [spec(n, keyed) for n in range(10)])
    assert group_sizes(db) == [10] and len(db.sent(insert_of(keyed))) == 1
    assert writer(group).calls == [("enqueue", keyed)]  # a transaction for keys only
    assert [job.payload for job in jobs] == [{"n": n} for n in range(10)]
    assert len({job.id for job in jobs}) == 10 and not any(job.duplicate for job in jobs)
    assert sorted(db.jobs) == sorted(job.id for job in jobs)


async def test_a_group_whose_commit_answer_was_lost_tells_each_caller_its_own_job_id() -> None:
    """The group's commit went out and no answer came back (the queue's
    retries gave up: EnqueueOutcomeUnknown with the group's ids): each
    caller hears the outcome of its own job, under the id reserved for it."""
    db = MemoryDatabase()

    class CommitThenLoseTheAnswer(Writer):
        async def attempt(
            self, flow: Callable[[], Flow[T]], what: str, transaction: bool, call: Any
        ) -> T:
            await driver.drive_async(flow(), MemorySession(self.db))
            raise EnqueueOutcomeUnknown(what, call.ids, "no answer came back")

    group = committer(db, writer=CommitThenLoseTheAnswer)
    answers = await enqueue_all(group, [spec(n) for n in range(4)])
    assert all(isinstance(a, EnqueueOutcomeUnknown) for a in answers), answers
    ids = [a.job_ids for a in answers]
    assert sorted(i for [i] in ids) == sorted(db.jobs)  # one each, all of them
    assert [db.jobs[i]["payload"] for [i] in ids] == [{"n": n} for n in range(4)]


@WAYS
async def test_a_full_group_goes_without_waiting_for_the_window(keyed: bool) -> None:
    db = MemoryDatabase()
    group = committer(db, window=60.0, max_jobs=4)
    waiting = [asyncio.ensure_future(group.enqueue(spec(n, keyed))) for n in range(9)]
    done, _ = await asyncio.wait(waiting[:8], timeout=30)  # far below the window
    assert len(done) == 8 and group_sizes(db) == [4, 4]
    assert not waiting[8].done()  # the ninth waits for the window, or more jobs
    await group.close()
    assert group_sizes(db) == [4, 4] and db.sent("job_enqueue")  # written alone at close
    assert waiting[8].result().payload == {"n": 8}


async def test_a_job_waits_out_the_window_for_others_then_goes() -> None:
    db = MemoryDatabase()
    group = committer(db, window=0.2)
    first = asyncio.ensure_future(group.enqueue(spec(0)))
    for _ in range(20):  # many turns of the loop: the window holds it
        await asyncio.sleep(0)
    assert not first.done() and not db.statements
    second = asyncio.ensure_future(group.enqueue(spec(1)))
    await asyncio.gather(first, second)
    assert group_sizes(db) == [2]


async def test_a_group_of_one_is_a_single_enqueue() -> None:
    db = MemoryDatabase()
    group = committer(db)
    job = await group.enqueue(spec(0))
    assert [s.name for s in db.statements] == ["job_reserve_ids", "job_enqueue"]
    assert writer(group).calls == [("enqueue", False)] and db.jobs[job.id]["payload"] == {"n": 0}


async def test_two_callers_with_one_key_in_a_group_get_one_job_created_for_the_first() -> None:
    db = MemoryDatabase()
    group = committer(db)
    first, other, second = await enqueue_all(
        group, [spec(0, idempotency_key="k"), spec(1), spec(2, idempotency_key="k")]
    )
    assert group_sizes(db) == [3]
    assert (first.duplicate, second.duplicate) == (False, True)
    assert second.id == first.id and second.payload == {"n": 0}
    assert len(db.jobs) == 2 and not other.duplicate


@WAYS
async def test_a_job_the_database_refuses_fails_alone_with_the_ids_the_group_reserved(
    keyed: bool,
) -> None:
    db = MemoryDatabase()
    group = committer(db)
    db.fail(insert_of(keyed), psycopg.errors.DataError("refused"))
    db.fail("job_enqueue", psycopg.errors.DataError("refused: the first job"))
    results = await enqueue_all(group, [spec(n, keyed) for n in range(5)])
    assert isinstance(results[0], psycopg.errors.DataError)
    assert [job.payload for job in results[1:]] == [{"n": n} for n in range(1, 5)]
    # The group reserved ids 1-5 (a new database's first); alone, each job
    # keeps its id and reserves none.
    assert len(db.sent("job_reserve_ids")) == 1
    assert [s.params["id"] for s in db.sent("job_enqueue")] == [1, 2, 3, 4, 5]
    assert sorted(db.jobs) == [job.id for job in results[1:]]


@WAYS
async def test_jobs_written_alone_after_a_committed_attempt_of_the_group_find_their_own(
    keyed: bool,
) -> None:
    """The group's first attempt committed (its answer lost) and its retry
    was refused: each job, written alone, finds the one the group wrote
    under its id with the group's key, as its own, and adds none."""
    db = MemoryDatabase()

    class CommittedThenRefused(Writer):
        group_written = False

        async def attempt(
            self, flow: Callable[[], Flow[T]], what: str, transaction: bool, call: Any
        ) -> T:
            if self.group_written:  # a job alone
                return await driver.drive_async(flow(), MemorySession(db))
            self.group_written = True
            await driver.drive_async(flow(), MemorySession(db))
            db.fail(insert_of(keyed), psycopg.errors.DataError("refused"))
            return await driver.drive_async(flow(), MemorySession(db))

    group = committer(db, writer=CommittedThenRefused)
    jobs = await enqueue_all(group, [spec(n, keyed) for n in range(3)])
    assert [(job.id, job.payload, job.duplicate) for job in jobs] == [
        (n + 1, {"n": n}, False) for n in range(3)
    ]
    assert sorted(db.jobs) == [1, 2, 3]
    assert [s.params["id"] for s in db.sent("job_enqueue")] == [1, 2, 3]


@WAYS
async def test_an_error_no_job_caused_is_every_callers(keyed: bool) -> None:
    db = MemoryDatabase()
    group = committer(db)
    down = DatabaseUnavailable("the database did not answer within 5 s")
    db.fail(insert_of(keyed), down)
    results = await enqueue_all(group, [spec(n, keyed) for n in range(3)])
    assert results == [down] * 3 and not db.jobs
    assert not db.sent("job_enqueue")  # not written one by one


@WAYS
async def test_an_unexpected_error_writing_a_group_is_logged_and_every_callers(
    caplog: pytest.LogCaptureFixture, keyed: bool
) -> None:
    db = MemoryDatabase()
    group = committer(db)
    db.fail(insert_of(keyed), ZeroDivisionError("a bug"))
    results = await enqueue_all(group, [spec(n, keyed) for n in range(3)])
    assert all(isinstance(r, ZeroDivisionError) for r in results)
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "group_commit_failed"]
    assert record.exc_info is not None and record.levelno == logging.ERROR


async def test_gathering_restarts_after_a_bug_and_its_waiting_callers_get_the_error(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = MemoryDatabase()
    group = committer(db)
    real = group._write_next
    failures = iter([ZeroDivisionError("a bug")])

    async def broken_once() -> None:
        for exc in failures:
            raise exc
        await real()

    monkeypatch.setattr(group, "_write_next", broken_once)
    results = await enqueue_all(group, [spec(n) for n in range(2)])
    assert all(isinstance(r, ZeroDivisionError) for r in results) and not db.jobs
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "group_commit_failed"]
    assert record.exc_info is not None
    jobs = await asyncio.wait_for(enqueue_all(group, [spec(n) for n in range(2, 4)]), 30)
    assert [job.payload for job in jobs] == [{"n": 2}, {"n": 3}]


async def test_close_writes_every_waiting_job_before_it_returns() -> None:
    db = MemoryDatabase()
    group = committer(db, window=60.0)
    waiting = [asyncio.ensure_future(group.enqueue(spec(n))) for n in range(3)]
    await asyncio.sleep(0)
    writer(group).gate.clear()  # the group is slow to commit
    closing = asyncio.ensure_future(group.close())
    await asyncio.sleep(0.05)
    assert not closing.done()  # it waits for the group being written
    writer(group).gate.set()
    await closing
    assert all(w.done() for w in waiting) and group_sizes(db) == [3]
    assert [w.result().payload for w in waiting] == [{"n": n} for n in range(3)]


async def test_a_caller_that_gave_up_before_its_group_left_writes_nothing() -> None:
    db = MemoryDatabase()
    group = committer(db, window=60.0)
    kept = asyncio.ensure_future(group.enqueue(spec(0)))
    gone = asyncio.ensure_future(group.enqueue(spec(1)))
    await asyncio.sleep(0)
    gone.cancel()
    await group.close()
    job: Job = kept.result()
    assert list(db.jobs) == [job.id] and gone.cancelled()
