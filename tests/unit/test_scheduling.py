"""Schedules without a database: when each timing ticks (daylight saving
time included), which ticks a catch-up enqueues, how a definition is
checked, and the scheduler part over the in-memory database."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from pgqueue import Job, Settings
from pgqueue.core import schedules as s
from pgqueue.core import ticks as tk
from pgqueue.core.errors import InvalidSchedule
from pgqueue.core.schedules import Schedule
from pgqueue.db import driver
from pgqueue.worker import TaskRegistry
from pgqueue.worker.handlers import resolve_schedules
from pgqueue.worker.scheduler import Scheduler
from pgqueue.worker.supervision import EventLog
from tests.unit.memory import MemoryConnection, MemoryDatabase

BERLIN = ZoneInfo("Europe/Berlin")
SETTINGS = Settings(database_url="memory://", poll_interval_seconds=0.05)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def ticks(timing: tk.Cadence, start: datetime, count: int) -> list[datetime]:
    return list(itertools.islice(timing.ticks_after(start), count))


def berlin(expr: str) -> tk.Cadence:
    return tk.cadence("t", expr, None, "Europe/Berlin")


# -- when a timing ticks -----------------------------------------------------------------


def test_an_interval_ticks_on_multiples_of_itself_since_1970() -> None:
    hourly = tk.cadence("t", None, 3600, "UTC")
    assert ticks(hourly, utc(2030, 1, 1, 10, 20), 2) == [utc(2030, 1, 1, 11), utc(2030, 1, 1, 12)]
    # Strictly after: a moment on a tick gives the next one.
    assert ticks(hourly, utc(2030, 1, 1, 11), 1) == [utc(2030, 1, 1, 12)]
    every7 = tk.cadence("t", None, 7, "UTC")
    assert all(t.timestamp() % 7 == 0 for t in ticks(every7, utc(2030, 1, 1), 5))


def test_cron_has_five_fields_or_six_with_seconds_first() -> None:
    quarter = tk.cadence("t", "*/15 * * * *", None, "UTC")
    assert ticks(quarter, utc(2030, 1, 1, 10, 1), 2) == [
        utc(2030, 1, 1, 10, 15),
        utc(2030, 1, 1, 10, 30),
    ]
    twenty = tk.cadence("t", "*/20 * * * * *", None, "UTC")
    assert ticks(twenty, utc(2030, 1, 1, 10, 0, 5), 3) == [
        utc(2030, 1, 1, 10, 0, 20),
        utc(2030, 1, 1, 10, 0, 40),
        utc(2030, 1, 1, 10, 1, 0),
    ]


# Europe/Berlin in 2026: on March 29 the clocks go from 02:00 CET to 03:00
# CEST (02:30 does not exist); on October 25 from 03:00 CEST back to 02:00
# CET (02:30 happens twice, at 00:30 and 01:30 UTC).
@pytest.mark.parametrize(
    ("expr", "start", "expected"),
    [
        # A daily 02:30 (fixed minute and hour) runs once every day: at 03:00
        # CEST, the first minute that exists, on the day the hour is skipped...
        (
            "30 2 * * *",
            utc(2026, 3, 27, 12),
            [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)],
        ),
        # ... and at the first 02:30 only on the day the hour is repeated.
        (
            "30 2 * * *",
            utc(2026, 10, 24, 12),
            [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30), utc(2026, 10, 27, 1, 30)],
        ),
        # Two times in the skipped hour both become 03:00: one tick.
        ("0,30 2 * * *", utc(2026, 3, 28, 12), [utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 0)]),
        # A 6-field expression follows the clock as it runs: no 02:30 on the
        # day it does not exist, two on the day it happens twice.
        (
            "0 30 2 * * *",
            utc(2026, 3, 28, 12),
            [utc(2026, 3, 30, 0, 30), utc(2026, 3, 31, 0, 30)],
        ),
        (
            "0 30 2 * * *",
            utc(2026, 10, 24, 12),
            [utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30), utc(2026, 10, 26, 1, 30)],
        ),
    ],
)
def test_daylight_saving_time(expr: str, start: datetime, expected: list[datetime]) -> None:
    assert ticks(berlin(expr), start, len(expected)) == expected


@pytest.mark.parametrize(("day", "hours"), [((2026, 3, 29), 23), ((2026, 10, 25), 25)])
def test_an_hourly_cron_ticks_once_per_elapsed_hour_on_a_change_day(
    day: tuple[int, int, int], hours: int
) -> None:
    midnight = datetime(*day, tzinfo=BERLIN).astimezone(UTC)
    next_midnight = (datetime(*day, tzinfo=BERLIN) + timedelta(days=1)).astimezone(UTC)
    found = ticks(berlin("0 * * * *"), midnight - timedelta(seconds=1), 30)
    assert len([t for t in found if t < next_midnight]) == hours
    assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(found))


def test_a_tick_is_never_before_the_moment_asked_even_in_the_repeated_hour() -> None:
    # 02:15 CET, the second pass: today's 02:30 (00:30 UTC) is already past.
    second_pass = utc(2026, 10, 25, 1, 15)
    assert ticks(berlin("30 2 * * *"), second_pass, 1) == [utc(2026, 10, 26, 1, 30)]


# -- catch-up ----------------------------------------------------------------------------

FIVE_MINUTES = tk.cadence("t", "*/5 * * * *", None, "UTC")
DUE = utc(2030, 1, 1, 10, 0)  # the planned tick; a scheduler comes back at...
LATER = utc(2030, 1, 1, 10, 47, 30)  # ... 10:47:30: ticks 10:00 to 10:45 are due


@pytest.mark.parametrize(
    ("catch_up", "limit", "enqueued"),
    [
        ("none", 100, []),  # 10:45 is more than ON_TIME_SECONDS late
        ("last", 100, [utc(2030, 1, 1, 10, 45)]),
        ("all", 3, [utc(2030, 1, 1, 10, m) for m in (35, 40, 45)]),
        ("all", 100, [utc(2030, 1, 1, 10, m) for m in range(0, 50, 5)]),
    ],
)
def test_catch_up_after_downtime(
    catch_up: tk.CatchUp, limit: int, enqueued: list[datetime]
) -> None:
    plan = tk.plan(FIVE_MINUTES, DUE, LATER, catch_up, limit)
    assert plan.ticks == enqueued
    assert plan.next_run_at == utc(2030, 1, 1, 10, 50)
    assert plan.missed_from == (None if enqueued and enqueued[0] == DUE else DUE)


@pytest.mark.parametrize("catch_up", tk.CATCH_UP_MODES)
def test_a_tick_found_on_time_is_enqueued_in_every_mode(catch_up: tk.CatchUp) -> None:
    late = DUE + timedelta(seconds=tk.ON_TIME_SECONDS - 1)
    plan = tk.plan(FIVE_MINUTES, DUE, late, catch_up, 100)
    assert (plan.ticks, plan.missed_from) == ([DUE], None)


def test_catch_up_walks_a_bounded_stretch_and_keeps_the_skipped_hour_tick() -> None:
    daily = berlin("30 2 * * *")
    plan = tk.plan(daily, utc(2026, 3, 1, 1, 30), utc(2026, 3, 30, 12), "all", 3)
    assert plan.ticks == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]
    every_second = tk.cadence("t", None, 1, "UTC")
    year_later = tk.plan(every_second, utc(2029, 1, 1), utc(2030, 1, 1), "all", 5)
    assert year_later.ticks[-1] == utc(2030, 1, 1) and len(year_later.ticks) == 5


# -- a definition ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"cron": "61 * * * *"}, "cron", "Bad minute"),
        ({"cron": "* * * *"}, "cron", "Wrong number of fields"),
        ({"cron": "0 0 31 4 *"}, "cron", "Bad day-of-month"),
        ({"cron": "@daily"}, "cron", "Wrong number of fields"),
        ({"cron": ""}, "cron", "1 to 200 characters"),
        ({"cron": 5}, "cron", "must be a string"),
        ({}, "cron", "give cron or every"),
        ({"cron": "* * * * *", "every": 5}, "cron", "not both"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "tz", "unknown time zone"),
        ({"cron": "* * * * *", "tz": "Europe"}, "tz", "unknown time zone"),
        ({"cron": "* * * * *", "tz": "../etc"}, "tz", "unknown time zone"),
        ({"cron": "* * * * *", "tz": 1}, "tz", "must be a string"),
        ({"every": 0}, "every", "whole number of seconds"),
        ({"every": 1.5}, "every", "whole number of seconds"),
        ({"every": True}, "every", "whole number of seconds"),
        ({"every": 60, "tz": "Europe/Berlin"}, "tz", "only for cron"),
        ({"every": 60, "catch_up": "some"}, "catch_up", "none, last, all"),
        ({"every": 60, "catch_up_limit": 0}, "catch_up_limit", "1 to 10000"),
        ({"every": 60, "task": "bad task"}, "task", "not a valid task name"),
        ({"every": 60, "payload": [1]}, "payload", "JSON object"),
        ({"every": 60, "queue": ""}, "queue", "not a valid queue name"),
        ({"every": 60, "max_attempts": 0}, "max_attempts", "between 1 and"),
        ({"every": 60, "timeout": 0}, "timeout", "more than 0"),
    ],
)
def test_a_bad_definition_is_a_clear_error(kwargs: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        Schedule.create("nightly", **kwargs)
    assert (caught.value.schedule, caught.value.field) == ("nightly", field)
    assert words in caught.value.problem
    assert str(caught.value).startswith(f"schedule 'nightly': {field}: ")


def test_a_definition_is_normalised() -> None:
    daily = Schedule.create("daily", cron=" 30  2 * * * ", tz="Europe/Berlin", task="report")
    assert (daily.cron, daily.tz, daily.task, daily.max_attempts) == (
        "30 2 * * *",
        "Europe/Berlin",
        "report",
        None,
    )
    often = Schedule.create("often", every=timedelta(minutes=5), payload={"a": 1})
    assert (often.every_seconds, often.tz, often.task, often.payload_json) == (
        300,
        "UTC",
        "often",
        '{"a":1}',
    )
    with pytest.raises(InvalidSchedule, match="name"):
        Schedule.create("no spaces allowed", every=1)


def test_a_tick_is_named_by_the_job_key() -> None:
    tick = utc(2030, 1, 1, 2, 30)
    key = s.key("a.b:c", tick)
    assert key == "pgqueue:schedule:a.b:c@2030-01-01T02:30:00Z"
    db = MemoryDatabase()
    job = Job.from_row(db.jobs[db.add("t", idempotency_key=key, run_at=tick)])
    assert s.tick_of(job) == tick
    assert s.tick_of(dataclasses.replace(job, idempotency_key="welcome-42")) is None
    assert s.tick_of(dataclasses.replace(job, idempotency_key=None)) is None


def test_the_registry_declares_schedules_with_its_tasks() -> None:
    tasks = TaskRegistry()

    @tasks.task(cron="30 2 * * *", tz="Europe/Berlin", timeout=5)
    def nightly(job: Job) -> None: ...

    tasks.periodic("hourly-report", task="report", every=3600, payload={"kind": "hourly"})
    assert [x.name for x in tasks.schedules()] == ["nightly", "hourly-report"]
    assert tasks.tasks()["nightly"].timeout_seconds == 5 and "report" not in tasks
    with pytest.raises(ValueError, match="declared twice"):
        tasks.periodic("nightly", every=60)
    with pytest.raises(InvalidSchedule, match="cron: Bad minute"):

        @tasks.task(cron="61 * * * *")
        def broken(job: Job) -> None: ...

    assert "broken" not in tasks  # nothing half-registered
    with pytest.raises(ValueError, match=r"gets max_attempts from each job, given at enqueue"):

        @tasks.task(max_attempts=5)
        def fields_of_a_job(job: Job) -> None: ...

    with pytest.raises(ValueError, match=r"unknown option\(s\) timout; a schedule's options"):

        @tasks.task(timout=5)
        def misspelt(job: Job) -> None: ...

    assert "fields_of_a_job" not in tasks and "misspelt" not in tasks
    assert resolve_schedules({"t": nightly}) is None
    assert resolve_schedules(tasks) == tasks.schedules()


# -- the scheduler part, over the in-memory database -------------------------------------


def scheduler(
    db: MemoryDatabase, declared: list[Schedule] | None = None, settings: Settings = SETTINGS
) -> Scheduler:
    tasks = {x.task for x in declared or []}
    return Scheduler(
        MemoryConnection(db), settings, EventLog("unit"), declared=declared, tasks=tasks
    )


async def test_the_scheduler_fires_a_daily_tick_across_daylight_saving_time() -> None:
    db = MemoryDatabase()
    db.clock = utc(2026, 3, 27, 12)
    nightly = Schedule.create("nightly", cron="30 2 * * *", tz="Europe/Berlin")
    # A poll interval of days: each step sleeps until the next tick.
    part = scheduler(db, [nightly], SETTINGS.replace(poll_interval_seconds=1e6))
    await part.sync()
    for _ in range(20):  # it sleeps what it says, on the database's clock
        db.advance(await part.step())
        if db.clock > utc(2026, 3, 31):
            break
    fired = sorted(s.tick_of(Job.from_row(row)) for row in db.jobs.values())  # type: ignore[type-var]
    assert fired == [
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1, 0),
        utc(2026, 3, 30, 0, 30),
    ]


async def test_sync_keeps_an_unchanged_schedule_in_place_and_retires_a_removed_one() -> None:
    db = MemoryDatabase()
    first = Schedule.create("a", every=60)
    await scheduler(db, [first, Schedule.create("b", every=60, task="a")]).sync()
    planned = db.schedules["a"]["next_run_at"]
    db.advance(600)  # downtime: "a" keeps its place, to be caught up
    await scheduler(db, [first]).sync()
    assert db.schedules["a"]["next_run_at"] == planned
    assert db.schedules["b"]["retired_at"] == db.clock  # its task is handled; not declared
    await scheduler(db, [Schedule.create("a", every=30)]).sync()  # re-timed: starts afresh
    assert db.schedules["a"]["next_run_at"] > db.clock


async def test_the_scheduler_waits_out_database_faults_and_lets_bugs_escape() -> None:
    db = MemoryDatabase()
    db.fail("schedule_next_due", psycopg.OperationalError("server closed the connection"), 3)
    part = scheduler(db, [Schedule.create("a", every=1)])
    loop = asyncio.create_task(part.schedule_loop())
    await asyncio.sleep(1.0)
    assert not loop.done() and len(db.sent("schedule_next_due")) > 3
    db.fail("schedule_next_due", RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        await asyncio.wait_for(loop, 5)


async def test_without_schedules_one_read_per_poll_interval() -> None:
    db = MemoryDatabase()
    part = scheduler(db)
    assert await part.step() == SETTINGS.poll_interval_seconds
    assert [x.name for x in db.statements] == ["schedule_next_due"]


def test_the_fire_flow_moves_a_schedule_once() -> None:
    db = MemoryDatabase()
    driver.drive(s.sync([Schedule.create("a", every=60, catch_up="all")], {"a"}), db)
    db.advance(3600)
    first = driver.drive(s.fire_due(5), db)
    again = driver.drive(s.fire_due(5), db)
    assert [len(f.jobs) for f in first] == [60] and again == []
