"""Runtime schedules against a real PostgreSQL: created, changed, deleted
and run now from the library, over HTTP (a live server, a real HTTP client)
and on the command line; fired by the same guarded statement as the
schedules declared in code; kept apart from what a worker's code writes;
and every bad input refused with nothing written."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import (
    AsyncQueue,
    InvalidSchedule,
    Job,
    Queue,
    Schedule,
    ScheduleConflict,
    ScheduleNotFound,
    Settings,
)
from pgqueue.api import create_app
from pgqueue.cli import app
from pgqueue.core import runtime_schedules as rt
from pgqueue.core import schedules as s
from pgqueue.worker import AsyncWorker, TaskRegistry
from tests.support import LiveServer, until

runner = CliRunner()
# Bodiless POSTs too: the API takes writes as JSON only (a form cannot send them).
HEADERS = {"Host": "localhost", "Content-Type": "application/json"}

SNAPSHOT = "SELECT to_jsonb(s) - 'updated_at' FROM pgqueue_schedules s ORDER BY name"


def rows(sql: psycopg.Connection[Any]) -> list[Any]:
    return [row[0] for row in sql.execute(SNAPSHOT).fetchall()]


def jobs(sql: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return sql.execute("SELECT id, task, idempotency_key FROM pgqueue_jobs ORDER BY id").fetchall()


def make_due(sql: psycopg.Connection[Any], name: str) -> datetime:
    """Move a schedule's planned tick to the newest tick before now; return it."""
    due: datetime = sql.execute(  # type: ignore[assignment,index]
        "UPDATE pgqueue_schedules SET next_run_at = next_run_at - make_interval(secs => "
        "every_seconds) WHERE name = %s RETURNING next_run_at",
        (name,),
    ).fetchone()[0]
    return due


# -- the library ---------------------------------------------------------------------------


def test_a_runtime_schedule_fires_once_per_tick_and_shows_its_last_run(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    made = queue.create_schedule("cleanup", "purge", every=3600, payload={"days": 7}, queue="ops")
    assert (made.origin, made.task, made.every_seconds, made.status) == (
        "runtime",
        "purge",
        3600,
        "enabled",
    )
    now = sql.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    assert made.next_run_at is not None and 0 < (made.next_run_at - now).total_seconds() <= 3600
    tick = make_due(sql, "cleanup")
    [fired] = queue.run(s.fire_due(5))
    assert [tick for tick, _ in fired.jobs] == [tick]
    assert queue.run(s.fire_due(5)) == []  # nothing due: the tick is not enqueued twice
    [(job_id, task, key)] = jobs(sql)
    assert (task, key) == ("purge", s.key("cleanup", tick))
    [listed] = queue.list_schedules()
    assert (listed.last_job_id, listed.last_job_state, listed.last_tick) == (job_id, "queued", tick)
    sql.execute("UPDATE pgqueue_jobs SET state = 'dead', finished_at = now()")
    assert queue.list_schedules()[0].last_job_state == "dead"  # the last outcome


def test_a_workers_code_neither_overwrites_nor_retires_runtime_schedules(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.create_schedule("nightly", "report", cron="0 3 * * *", tz="Europe/Berlin")
    before = rows(sql)
    declared = [Schedule.create("nightly", task="report", every=30)]
    synced = queue.run(s.sync(declared, ["report"]))
    assert (synced.written, synced.retired, synced.shadowed) == ([], [], ["nightly"])
    assert queue.run(s.sync([], ["report"])).retired == []  # never the code's to retire
    assert rows(sql) == before


def test_a_taken_name_is_a_conflict_and_nothing_is_written(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.run(s.sync([Schedule.create("beat", every=60)], ["beat"]))
    queue.create_schedule("mine", every=60)
    before = rows(sql)
    with pytest.raises(ScheduleConflict, match="declared in a worker's code") as code:
        queue.create_schedule("beat", every=5)
    assert code.value.field == "name"
    with pytest.raises(ScheduleConflict, match=r"taken by a runtime schedule$"):
        queue.create_schedule("mine", cron="* * * * *")
    with pytest.raises(ScheduleConflict, match="declared in a worker's code") as change:
        queue.update_schedule("beat", every=5)
    assert change.value.field == "origin"
    assert rows(sql) == before


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "tz"),
        ({"every": 0}, "every"),
        ({"every": -5}, "every"),
        ({"every": 60, "cron": "* * * * *"}, "cron"),
        ({}, "cron"),
        ({"every": 60, "priority": "high"}, "priority"),
        ({"every": 60, "colour": "red"}, "colour"),
    ],
)
def test_bad_input_to_create_is_refused_naming_the_field(
    queue: Queue, sql: psycopg.Connection[Any], fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidSchedule) as bad:
        queue.create_schedule("x", **fields)
    assert bad.value.field == field
    assert rows(sql) == []


def test_update_changes_the_fields_given_and_a_new_cadence_replans_from_the_database_clock(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    made = queue.create_schedule("sync", cron="0 3 * * *", tz="Asia/Tokyo", priority=1)
    kept = queue.update_schedule("sync", priority=7, payload={"full": True})
    assert (kept.priority, kept.payload, kept.next_run_at) == (7, {"full": True}, made.next_run_at)
    moved = queue.update_schedule("sync", every=60)
    now = sql.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    assert (moved.cron, moved.every_seconds, moved.tz, moved.priority) == (None, 60, "UTC", 7)
    assert moved.next_run_at is not None and 0 < (moved.next_run_at - now).total_seconds() <= 60
    assert moved.next_run_at.timestamp() % 60 == 0
    before = rows(sql)
    with pytest.raises(InvalidSchedule, match="at least one"):
        queue.update_schedule("sync")
    with pytest.raises(InvalidSchedule) as bad:
        queue.update_schedule("sync", cron="nope")
    assert bad.value.field == "cron"
    with pytest.raises(InvalidSchedule):  # a zone is for cron only
        queue.update_schedule("sync", tz="Europe/Paris")
    with pytest.raises(ScheduleNotFound):
        queue.update_schedule("other", priority=1)
    assert rows(sql) == before


def test_run_now_enqueues_once_per_second_and_becomes_the_last_run(
    queue: Queue, db_url: str, sql: psycopg.Connection[Any]
) -> None:
    made = queue.create_schedule("digest", "mail", every=86400, enabled=False)
    # One transaction: now() is one moment, so both calls fall in the same second.
    with psycopg.connect(db_url) as conn:
        first = queue.run(rt.run_now("digest", 3), conn)
        again = queue.run(rt.run_now("digest", 3), conn)
    assert (first.duplicate, again.duplicate, again.id) == (False, True, first.id)
    assert first.idempotency_key == rt.run_key("digest", first.enqueued_at)
    assert first.idempotency_key.startswith("pgqueue:schedule-now:digest@")
    assert (first.task, first.max_attempts) == ("mail", 3)
    [listed] = queue.list_schedules()
    assert (listed.last_job_id, listed.last_job_state, listed.last_tick) == (
        first.id,
        "queued",
        None,
    )
    assert listed.next_run_at == made.next_run_at and not listed.enabled
    assert s.tick_of(first) is None  # not a tick
    with pytest.raises(ScheduleNotFound):
        queue.run_schedule_now("nope")
    assert len(jobs(sql)) == 1


async def test_the_async_queue_creates_changes_runs_and_deletes(
    aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    await aqueue.create_schedule("ping", every=10)
    assert (await aqueue.update_schedule("ping", queue="low")).queue == "low"
    assert (await aqueue.disable_schedule("ping")).status == "disabled"
    job = await aqueue.run_schedule_now("ping")
    assert (job.task, job.queue) == ("ping", "low")
    await aqueue.delete_schedule("ping")
    assert await aqueue.list_schedules() == []
    with pytest.raises(ScheduleNotFound):
        await aqueue.delete_schedule("ping")


async def test_running_workers_fire_it_and_leave_its_name_to_it_when_their_code_declares_it(
    settings: Settings,
    aqueue: AsyncQueue,
    sql: psycopg.Connection[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pgqueue.worker")
    await aqueue.create_schedule("beat", every=1, catch_up="all")
    tasks = TaskRegistry()

    @tasks.task(every=3600)  # the same name in code: the runtime schedule keeps it
    async def beat(job: Job) -> None:
        pass

    fast = settings.replace(poll_interval_seconds=0.2)
    started = [AsyncWorker(tasks, settings=fast, concurrency=2) for _ in range(2)]
    running = [asyncio.create_task(w.run()) for w in started]
    try:
        await until(lambda: len(jobs(sql)) >= 2)
    finally:
        await asyncio.gather(*(w.stop() for w in started))
        await asyncio.gather(*running)
    keys = [key for _, _, key in jobs(sql)]
    assert len(set(keys)) == len(keys) and all(k.startswith("pgqueue:schedule:beat@") for k in keys)
    ticks = sorted(datetime.strptime(k.rpartition("@")[2], "%Y-%m-%dT%H:%M:%SZ") for k in keys)
    assert all((b - a).total_seconds() == 1 for a, b in itertools.pairwise(ticks))
    [row] = await aqueue.list_schedules()
    assert (row.origin, row.every_seconds, row.retired_at) == ("runtime", 1, None)
    shadowed = [r for r in caplog.records if getattr(r, "action", "") == "schedule_shadowed"]
    assert len(shadowed) == 2  # one per worker's start


# -- HTTP ------------------------------------------------------------------------------------


@pytest.fixture
def http(settings: Settings) -> Iterator[httpx.Client]:
    with (
        LiveServer(create_app(settings, url=settings.database_url)) as server,
        httpx.Client(base_url=server.url, headers=HEADERS) as client,
    ):
        yield client


def test_http_create_change_run_and_delete(
    http: httpx.Client, sql: psycopg.Connection[Any]
) -> None:
    made = http.post("/schedules", json={"name": "tidy", "task": "clean", "cron": "*/5 * * * *"})
    assert made.status_code == 201, made.text
    assert (made.json()["origin"], made.json()["spec"]) == ("runtime", "*/5 * * * *")
    changed = http.patch("/schedules/tidy", json={"every": 120, "priority": 3})
    assert changed.status_code == 200, changed.text
    assert (changed.json()["every_seconds"], changed.json()["priority"]) == (120, 3)
    ran = http.post("/schedules/tidy/run")
    assert ran.status_code == 201 and ran.json()["task"] == "clean"
    listed = http.get("/schedules").json()["schedules"]
    assert listed[0]["last_job_id"] == ran.json()["id"]
    assert listed[0]["last_job_state"] == "queued" and listed[0]["last_run_at"] is not None
    assert http.delete("/schedules/tidy").status_code == 204
    assert rows(sql) == [] and len(jobs(sql)) == 1  # its job stays


def test_http_bad_input_answers_422_404_409_and_writes_nothing(
    http: httpx.Client, sql: psycopg.Connection[Any]
) -> None:
    http.post("/schedules", json={"name": "taken", "every": 60}).raise_for_status()
    before = rows(sql)
    cases: list[tuple[str, str, Any, int, str | None]] = [
        ("POST", "/schedules", {"name": "a", "cron": "bad cron"}, 422, "cron"),
        ("POST", "/schedules", {"name": "a", "cron": "* * * * *", "tz": "No/Where"}, 422, "tz"),
        ("POST", "/schedules", {"name": "a", "every": 0}, 422, "every"),
        ("POST", "/schedules", {"name": "a", "every": "60"}, 422, "every"),
        ("POST", "/schedules", {"name": "a b", "every": 60}, 422, "name"),
        ("POST", "/schedules", {"every": 60}, 422, "name"),
        ("POST", "/schedules", {"name": "a", "every": 60, "colour": 1}, 422, "colour"),
        ("POST", "/schedules", {"name": "taken", "every": 5}, 409, "name"),
        ("PATCH", "/schedules/taken", {}, 422, "body"),
        ("PATCH", "/schedules/taken", {"cron": "* * *"}, 422, "cron"),
        ("PATCH", "/schedules/nope", {"every": 5}, 404, None),
        ("POST", "/schedules/nope/run", None, 404, None),
    ]
    for method, path, body, status, field in cases:
        answer = http.request(method, path, json=body)
        assert answer.status_code == status, (method, path, body, answer.text)
        assert answer.json()["field"] == field, (body, answer.json())
    assert rows(sql) == before and jobs(sql) == []


# -- the command line ------------------------------------------------------------------------


def cli(db_url: str, *args: str, code: int = 0) -> Any:
    result = runner.invoke(app, ["--database-url", db_url, *args], env={"COLUMNS": "200"})
    assert result.exit_code == code, result.output
    return result


def test_cli_create_update_run_and_the_list(db_url: str, sql: psycopg.Connection[Any]) -> None:
    out = cli(db_url, "schedules", "create", "tidy", "--task", "clean", "--every", "5m").stdout
    assert "schedule tidy created: every 300 s, task clean" in out
    made = json.loads(
        cli(db_url, "schedules", "update", "tidy", "--cron", "0 4 * * *", "--tz",
            "Europe/Berlin", "--payload", '{"deep": true}', "--json").stdout
    )  # fmt: skip
    assert (made["cron"], made["tz"], made["payload"]) == (
        "0 4 * * *",
        "Europe/Berlin",
        {"deep": True},
    )
    ran = json.loads(cli(db_url, "schedules", "run", "tidy", "--json").stdout)
    assert (ran["task"], ran["duplicate"]) == ("clean", False)
    table = cli(db_url, "schedules").stdout
    assert "runtime" in table and "0 4 * * * (Europe/Berlin)" in table and "queued" in table
    [(job_id, _, _)] = jobs(sql)
    assert job_id == ran["id"]


def test_cli_bad_input_exits_1_and_writes_nothing(
    db_url: str, sql: psycopg.Connection[Any]
) -> None:
    cli(db_url, "schedules", "create", "tidy", "--every", "60")
    before = rows(sql)
    for args, said in [
        (("create", "x", "--cron", "99 * * * *"), "cron"),
        (("create", "x", "--every", "0"), "every"),
        (("create", "x", "--cron", "* * * * *", "--tz", "Nowhere/Land"), "unknown time zone"),
        (("create", "tidy", "--every", "5"), "is taken"),
        (("update", "tidy"), "at least one"),
        (("update", "nope", "--every", "5"), "does not exist"),
        (("run", "nope"), "does not exist"),
    ]:
        assert said in cli(db_url, "schedules", *args, code=1).output
    assert "not valid JSON" in cli(db_url, "schedules", "create", "y", "--every", "60",
                                   "--payload", "{", code=2).output  # fmt: skip
    assert rows(sql) == before and jobs(sql) == []
