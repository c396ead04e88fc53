"""Schedules (periodic jobs) against a real PostgreSQL: each tick enqueued
exactly once by many schedulers and across worker restarts, catch-up after
downtime, daylight saving time through the database's clock, disable and
enable, and how the code's schedules are written to the table."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from pgqueue import Job, Queue, Settings
from pgqueue.core import schedules as s
from pgqueue.core import ticks as tk
from pgqueue.worker import AsyncWorker, TaskRegistry
from tests.support import until

BEAT_KEYS = "pgqueue:schedule:beat@%"


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return settings.replace(poll_interval_seconds=0.2)


def registry(**schedule: Any) -> TaskRegistry:
    """Handlers for "beat" and a schedule "beat" that runs it."""
    tasks = TaskRegistry()

    @tasks.task(**schedule)
    async def beat(job: Job) -> None:
        pass

    return tasks


def ticks(sql: psycopg.Connection[Any], like: str = BEAT_KEYS) -> list[datetime]:
    """The tick of every job a schedule enqueued, in order, one per job."""
    rows = sql.execute(
        "SELECT idempotency_key FROM pgqueue_jobs WHERE idempotency_key LIKE %s ORDER BY 1",
        (like,),
    ).fetchall()
    keys = [row[0] for row in rows]
    return [datetime.strptime(k.rpartition("@")[2], "%Y-%m-%dT%H:%M:%SZ") for k in keys]


def consecutive(found: list[datetime], step: timedelta = timedelta(seconds=1)) -> bool:
    return all(b - a == step for a, b in itertools.pairwise(found))


def db_now(sql: psycopg.Connection[Any]) -> datetime:
    row = sql.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0].astimezone(UTC)  # type: ignore[no-any-return]


def has_row(sql: psycopg.Connection[Any], name: str = "beat") -> bool:
    found = sql.execute("SELECT 1 FROM pgqueue_schedules WHERE name = %s", (name,)).fetchone()
    return found is not None


def schedule_row(sql: psycopg.Connection[Any], name: str = "beat") -> dict[str, Any]:
    cur = sql.execute("SELECT * FROM pgqueue_schedules WHERE name = %s", (name,))
    names = [c.name for c in cur.description or []]
    row = cur.fetchone()
    assert row is not None
    return dict(zip(names, row, strict=True))


@contextlib.asynccontextmanager
async def workers(
    handlers: Any, settings: Settings, count: int
) -> AsyncIterator[list[AsyncWorker]]:
    started = [AsyncWorker(handlers, settings=settings, concurrency=4) for _ in range(count)]
    tasks = [asyncio.create_task(w.run()) for w in started]
    try:
        yield started
    finally:
        await asyncio.gather(*(w.stop() for w in started))
        await asyncio.gather(*tasks)


# -- exactly once ---------------------------------------------------------------------------


async def test_four_workers_and_restarts_enqueue_each_tick_exactly_once(
    fast: Settings, sql: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgqueue.worker")
    tasks = registry(every=1, catch_up="all")
    async with workers(tasks, fast, 4) as first:
        await asyncio.sleep(2.5)
        # Two of them restart while the other two go on.
        await asyncio.gather(first[0].stop(), first[1].stop())
        async with workers(tasks, fast, 2):
            await asyncio.sleep(2.5)
    # Every worker down for 2.5 s, then all four start at once: the missed
    # ticks are caught up ("all"), once.
    await asyncio.sleep(2.5)
    async with workers(tasks, fast, 4):
        await asyncio.sleep(2.5)
    found = ticks(sql)
    assert len(found) >= 9 and len(set(found)) == len(found)
    assert consecutive(found), found  # no tick lost, none twice
    fired = [r for r in caplog.records if getattr(r, "action", "") == "schedule_fire"]
    assert len(fired) == len(found)  # each enqueued by one scheduler, none refused by its key
    assert not [r for r in caplog.records if getattr(r, "action", "") == "schedule_duplicate"]
    row = schedule_row(sql)
    assert row["last_tick"].replace(tzinfo=None) == found[-1]
    assert sql.execute("SELECT max(id) FROM pgqueue_jobs").fetchone() == (row["last_job_id"],)


def test_many_schedulers_racing_on_a_backlog_move_it_once(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    """Eight threads fire the same due schedule at once, over and over: each
    tick is enqueued by exactly one, and the guard (not the unique key) is
    what stops the others: no fire ever finds its tick's job already there."""
    queue.run(s.sync([s.Schedule.create("beat", every=1, catch_up="all", catch_up_limit=1000)], []))
    sql.execute(
        "UPDATE pgqueue_schedules SET next_run_at = date_trunc('second', now()) - interval '300 s'"
    )
    barrier = threading.Barrier(8)
    results: list[s.Fired] = []
    lock = threading.Lock()

    def fire_for(seconds: float) -> None:
        with Queue(queue.url, settings=queue.settings) as mine:
            barrier.wait()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                fired = mine.run(s.fire_due(5))
                with lock:
                    results.extend(fired)

    threads = [threading.Thread(target=fire_for, args=(3.0,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    found = ticks(sql)
    assert len(found) >= 302 and consecutive(found)
    moved = [f for f in results if f.moved]
    assert sum(len(f.jobs) for f in moved) == len(found)
    assert not [f for f in results if f.already]
    # The backlog (301 ticks), by one thread. A fire after it moves the ticks
    # that came due since the last one: one, or a few after a stall of the
    # machine (a fresh clone's CI saw two at once), never the backlog again.
    sizes = sorted(len(f.jobs) for f in moved)
    assert sizes[-1] >= 301 and sizes[-2] < 10, sizes[-3:]


# -- catch-up --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("catch_up", "limit", "expected"),
    [("none", 100, 0), ("last", 100, 1), ("all", 3, 3), ("all", 100, 10)],
)
async def test_catch_up_after_every_worker_was_down(
    fast: Settings,
    sql: psycopg.Connection[Any],
    caplog: pytest.LogCaptureFixture,
    catch_up: tk.CatchUp,
    limit: int,
    expected: int,
) -> None:
    tasks = registry(every=3600, catch_up=catch_up, catch_up_limit=limit)
    async with workers(tasks, fast, 1):
        await until(lambda: has_row(sql))
    # Ten hourly ticks passed while no worker ran, the newest more than
    # ON_TIME_SECONDS ago (in the first minute of an hour, wait that out).
    now = db_now(sql)
    if now.minute == 0 and now.second < 5 + tk.ON_TIME_SECONDS:
        await asyncio.sleep(5 + tk.ON_TIME_SECONDS - now.second)
    newest = db_now(sql).replace(minute=0, second=0, microsecond=0)
    sql.execute("UPDATE pgqueue_schedules SET next_run_at = %s", (newest - timedelta(hours=9),))

    def missed() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "action", "") == "schedule_missed"]

    async with workers(tasks, fast, 2):
        # The scheduler says what it missed once its fire has committed:
        # stopping the workers as soon as the row moves could cut that short.
        await until(
            lambda: schedule_row(sql)["next_run_at"] > newest and (expected == 10 or missed())
        )
    assert ticks(sql) == [
        (newest - timedelta(hours=i)).replace(tzinfo=None) for i in reversed(range(expected))
    ]
    assert schedule_row(sql)["next_run_at"] == newest + timedelta(hours=1)
    assert len(missed()) == (0 if expected == 10 else 1)


# -- daylight saving time, through the database ------------------------------------------


def test_a_daily_0230_in_berlin_across_both_changes_of_2026(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    """A year of ticks planned from the database's clock: the schedule was
    due on 2026-03-27 (02:30 CET) and is caught up in full now, so that every
    day since is a tick, the two days of change included."""
    for expr, name in (("30 2 * * *", "nightly"), ("0 30 2 * * *", "nightly6")):
        schedule = s.Schedule.create(
            name, task="report", cron=expr, tz="Europe/Berlin", catch_up="all",
            catch_up_limit=10_000,
        )  # fmt: skip
        queue.run(s.sync([schedule], []))
    sql.execute("UPDATE pgqueue_schedules SET next_run_at = '2026-03-27 01:30:00+00'")
    queue.run(s.fire_due(5))
    berlin = ZoneInfo("Europe/Berlin")
    daily = [t.replace(tzinfo=UTC) for t in ticks(sql, "pgqueue:schedule:nightly@%")]
    days = [t.astimezone(berlin).date() for t in daily]
    assert days == sorted(set(days)) and (days[-1] - days[0]).days + 1 == len(days)
    spring = [t for t in daily if t.date() == datetime(2026, 3, 29).date()]
    autumn = [t for t in daily if t.date() == datetime(2026, 10, 25).date()]
    assert spring == [datetime(2026, 3, 29, 1, 0, tzinfo=UTC)]  # 03:00 CEST: 02:30 is skipped
    assert autumn == [datetime(2026, 10, 25, 0, 30, tzinfo=UTC)]  # the first 02:30 only
    six = [t.replace(tzinfo=UTC) for t in ticks(sql, "pgqueue:schedule:nightly6@%")]
    assert not [t for t in six if t.date() == datetime(2026, 3, 29).date()]
    assert [t for t in six if t.date() == datetime(2026, 10, 25).date()] == [
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
        datetime(2026, 10, 25, 1, 30, tzinfo=UTC),
    ]


# -- switching off, and what the code declares ---------------------------------------------


def count(sql: psycopg.Connection[Any]) -> int:
    return len(ticks(sql))


async def test_disable_stops_it_and_enable_resumes_without_catching_up(
    fast: Settings, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    tasks = registry(every=1, catch_up="all")
    async with workers(tasks, fast, 2):
        await asyncio.sleep(1.5)
        off = await asyncio.to_thread(queue.run, s.set_enabled("beat", False))
        assert off.status == "disabled"
        stopped_at = count(sql)
        await asyncio.sleep(2.5)
        assert count(sql) == stopped_at
        on = await asyncio.to_thread(queue.run, s.set_enabled("beat", True))
        assert on.status == "enabled" and on.next_run_at is not None
        await asyncio.sleep(1.5)
    found = ticks(sql)
    assert len(found) > stopped_at
    resumed = found[stopped_at]
    assert resumed.replace(tzinfo=UTC) >= on.next_run_at  # the gap is not caught up
    # A restart keeps it as the operators left it.
    queue.run(s.set_enabled("beat", False))
    async with workers(tasks, fast, 1):
        await asyncio.sleep(1.5)
    assert schedule_row(sql)["enabled"] is False and count(sql) == len(found)


async def test_a_schedule_removed_from_the_code_is_retired_and_reported(
    fast: Settings, sql: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    old = registry(every=1)
    async with workers(old, fast, 1):
        await asyncio.sleep(1.2)
    new = TaskRegistry()  # still handles "beat", no longer schedules it
    new.add("beat", old["beat"])
    async with workers(new, fast, 1):
        before = count(sql)
        await asyncio.sleep(1.5)
        assert count(sql) == before
    retired = [r for r in caplog.records if getattr(r, "action", "") == "schedule_retired"]
    assert len(retired) == 1 and "beat" in retired[0].getMessage()
    assert schedule_row(sql)["retired_at"] is not None
    # A worker of plain handlers declares nothing and retires nothing; a
    # worker whose code declares it again brings it back.
    async with workers(old, fast, 1):
        await asyncio.sleep(1.5)
    assert schedule_row(sql)["retired_at"] is None and count(sql) > before
    async with workers({"beat": old["beat"]}, fast, 1):
        await asyncio.sleep(0.5)
    assert schedule_row(sql)["retired_at"] is None


async def test_a_changed_timing_starts_afresh_and_a_worker_of_other_tasks_leaves_it(
    fast: Settings, sql: psycopg.Connection[Any]
) -> None:
    async with workers(registry(cron="0 3 * * *"), fast, 1):
        await until(lambda: has_row(sql))
    first = schedule_row(sql)
    async with workers(registry(cron="0 4 * * *"), fast, 1):
        await until(lambda: schedule_row(sql)["cron"] == "0 4 * * *")
    second = schedule_row(sql)
    # One hour later in the day (between 03:00 and 04:00 UTC the next 03:00
    # is tomorrow's and the next 04:00 today's: 23 hours earlier).
    assert (second["next_run_at"] - first["next_run_at"]) % timedelta(days=1) == timedelta(hours=1)
    others = TaskRegistry()
    others.periodic("other", task="other", every=3600)
    others.add("other", lambda job: None)
    async with workers(others, fast, 1):
        await until(lambda: has_row(sql, "other"))
    assert schedule_row(sql)["retired_at"] is None  # "beat" is not a task it handles


def test_a_schedule_deleted_and_declared_again_never_enqueues_a_tick_twice(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    beat = s.Schedule.create("beat", every=3600)
    queue.run(s.sync([beat], []))
    planned = schedule_row(sql)["next_run_at"]
    sql.execute("UPDATE pgqueue_schedules SET next_run_at = %s", (planned - timedelta(hours=1),))
    [first] = queue.run(s.fire_due(5))
    assert len(first.jobs) == 1
    queue.run(s.delete("beat"))
    queue.run(s.sync([beat], []))  # declared again: starts afresh at its next tick
    assert schedule_row(sql)["next_run_at"] == planned
    # Had its row been put back at the tick already enqueued, the key refuses it.
    sql.execute("UPDATE pgqueue_schedules SET next_run_at = %s", (planned - timedelta(hours=1),))
    [again] = queue.run(s.fire_due(5))
    assert again.moved and again.jobs == [] and again.already == [first.jobs[0][0]]
    assert len(ticks(sql)) == 1


async def test_a_timing_this_worker_cannot_read_is_unplanned_and_said_not_fatal(
    fast: Settings, sql: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A row written by a worker whose tz database knows a zone that this
    one does not: this worker leaves it unplanned, says so, and works on."""
    sql.execute(
        "INSERT INTO pgqueue_schedules (name, task, cron, tz, next_run_at) "
        "VALUES ('elsewhere', 'other', '0 3 * * *', 'Mars/Olympus', now() - interval '1 s')"
    )
    async with workers(registry(every=1), fast, 1) as [worker]:
        await until(lambda: schedule_row(sql, "elsewhere")["next_run_at"] is None)
        await until(lambda: count(sql) >= 2)
        assert not worker.degraded
    unplanned = [r for r in caplog.records if getattr(r, "action", "") == "schedule_unplanned"]
    assert unplanned and "unknown time zone 'Mars/Olympus'" in unplanned[0].getMessage()
    assert unplanned[0].levelno == logging.ERROR
