"""job.progress(): reported by handlers (sync and async), written by the
worker at most once a second per job, fenced by the token, shown by
GET /jobs/{id} and `pgqueue jobs show`, and heard by wait(on_progress=)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import AsyncQueue, InvalidJob, Job, JobState, NotInHandler, Queue, Settings
from pgqueue.cli import app
from pgqueue.core.jobs import MAX_PROGRESS_INFO_BYTES
from pgqueue.core.transitions import Report, report_progress
from pgqueue.db.driver import drive_on
from pgqueue.worker import AsyncWorker, TaskRegistry
from tests.support import api_client, running, take_over, until


def reporter(release: threading.Event) -> dict[str, Any]:
    """Handlers that report 10 %, 20 %, ... 90 % at once (only the last
    counts), then wait for ``release``."""

    def sync_handler(job: Job) -> str:
        for tenth in range(1, 10):
            job.progress(tenth / 10, {"step": tenth})
        release.wait(30)
        return "done"

    async def async_handler(job: Job) -> str:
        for tenth in range(1, 10):
            job.progress(tenth / 10, {"step": tenth})
        await until(release.is_set, 30)
        return "done"

    return {"sync": sync_handler, "async": async_handler}


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_the_latest_report_is_stored_on_the_job_and_shown_by_the_api_and_the_cli(
    settings: Settings, aqueue: AsyncQueue, db_url: str, kind: str
) -> None:
    release = threading.Event()
    job = await aqueue.enqueue("p")
    async with running(AsyncWorker({"p": reporter(release)[kind]}, settings=settings)):
        await until(lambda: _fraction(db_url, job.id) is not None, 10)
        read = await aqueue.get(job.id)
        assert (read.state, read.progress_fraction, read.progress_info) == (
            JobState.RUNNING,
            0.9,
            {"step": 9},
        )
        assert read.progress_at is not None
        async with api_client(settings) as client:
            shown = (await client.get(f"/jobs/{job.id}")).json()
        assert (shown["progress_fraction"], shown["progress_info"]) == (0.9, {"step": 9})
        result = await asyncio.to_thread(
            CliRunner().invoke, app, ["--database-url", db_url, "jobs", "show", str(job.id)]
        )
        assert result.exit_code == 0, result.output
        assert "90%" in result.output and '"step": 9' in result.output
        release.set()
        done = await aqueue.wait(job.id, 30)
    # Kept when the job ends: its last report.
    assert (done.state, done.progress_fraction) == (JobState.SUCCEEDED, 0.9)


def _fraction(db_url: str, job_id: int) -> float | None:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT progress_fraction FROM pgqueue_jobs WHERE id = %s", (job_id,)
        ).fetchone()
    return None if row is None else row[0]


async def test_reports_are_written_at_most_once_a_second_per_job(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    """A handler reporting in a tight loop for 2.5 s: its job's row is
    written at most 3 times (a report a second, the first after 1 s), not
    once per report."""
    sql.execute(
        "CREATE TABLE writes (at timestamptz);"
        "CREATE FUNCTION count_write() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN INSERT INTO writes VALUES (now()); RETURN NEW; END $$;"
        "CREATE TRIGGER progress_writes AFTER UPDATE OF progress_fraction ON pgqueue_jobs"
        " FOR EACH ROW EXECUTE FUNCTION count_write()"
    )
    reports = 0

    async def busy(job: Job) -> None:
        nonlocal reports
        loop = asyncio.get_running_loop()
        end = loop.time() + 2.5
        while loop.time() < end:
            job.progress(min(1.0, reports / 10_000))
            reports += 1
            await asyncio.sleep(0.001)

    job = await aqueue.enqueue("b")
    async with running(AsyncWorker({"b": busy}, settings=settings)):
        await aqueue.wait(job.id, 30)
    [[writes]] = sql.execute("SELECT count(*) FROM writes").fetchall()
    assert reports > 100 and 1 <= writes <= 3


async def test_bad_reports_are_refused_with_a_clear_error_and_nothing_is_kept(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    refused: list[str] = []
    bad: list[tuple[Any, Any]] = [
        (-0.1, None),
        (1.01, None),
        (float("nan"), None),
        ("half", None),
        (True, None),
        (0.5, {"x": float("inf")}),
        (0.5, {"x": object()}),
        (0.5, "x" * MAX_PROGRESS_INFO_BYTES),
    ]

    def reports_badly(job: Job) -> None:
        for fraction, info in bad:
            try:
                job.progress(fraction, info)
            except InvalidJob as exc:
                refused.append(str(exc))

    job = await aqueue.enqueue("bad")
    async with running(AsyncWorker({"bad": reports_badly}, settings=settings)) as worker:
        done = await aqueue.wait(job.id, 30)
        assert worker.handles.reported == {}  # nothing kept to write
    assert len(refused) == len(bad)
    assert all(message.startswith("progress") for message in refused), refused
    assert "from 0 to 1" in refused[0] and "bytes" in refused[-1]
    assert (await aqueue.get(job.id)).progress_fraction is None
    assert done.state is JobState.SUCCEEDED


def test_a_job_outside_its_handler_cannot_report(queue: Queue) -> None:
    job = queue.enqueue("r")
    with pytest.raises(NotInHandler, match=r"job\.progress\(\) works only inside the handler"):
        job.progress(0.5)


def refused_in_a_child(job: Job) -> str:
    """An isolated handler (module level: the child imports it by name)."""
    try:
        job.progress(0.5)
    except NotInHandler:
        return "refused"
    return "reported"


async def test_an_isolated_handler_is_told_its_child_cannot_reach_the_worker(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    tasks = TaskRegistry()
    tasks.add("iso", refused_in_a_child, isolated=True)
    job = await aqueue.enqueue("iso")
    async with running(AsyncWorker(tasks, settings=settings)):
        done = await aqueue.wait(job.id, 60)
    assert (done.state, done.result) == (JobState.SUCCEEDED, "refused")


def test_a_stale_attempts_report_matches_nothing(
    queue: Queue, sql: psycopg.Connection[Any], db_url: str
) -> None:
    job = queue.enqueue("s")
    [first] = queue.claim(1, worker="first")
    taken = take_over(queue, job.id)
    assert first.lease_token is not None and taken.lease_token is not None
    with psycopg.connect(db_url, autocommit=True) as conn:
        stale = drive_on(
            conn, report_progress([Report(job.id, first.lease_token, 0.5, None)]), transaction=True
        )
        assert stale == set()
        assert queue.get(job.id).progress_fraction is None
        fresh = report_progress([Report(job.id, taken.lease_token, 0.25, '{"n": 1}')])
        assert drive_on(conn, fresh, transaction=True) == {job.id}
    read = queue.get(job.id)
    assert (read.progress_fraction, read.progress_info) == (0.25, {"n": 1})


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_wait_hears_each_new_report_through_on_progress(
    settings: Settings, aqueue: AsyncQueue, queue: Queue, face: str
) -> None:
    steps = [threading.Event() for _ in range(3)]
    heard: list[float | None] = []

    def on_progress(job: Job) -> None:
        heard.append(job.progress_fraction)
        steps[len(heard) - 1].set()

    async def stepwise(job: Job) -> str:
        for n, step in enumerate(steps, 1):
            job.progress(n / 3)
            await until(step.is_set, 30)  # the waiter heard this one
        return "done"

    job = await aqueue.enqueue("w")
    async with running(AsyncWorker({"w": stepwise}, settings=settings)):
        if face == "sync":
            done = await asyncio.to_thread(queue.wait, job.id, 30, on_progress=on_progress)
        else:
            done = await aqueue.wait(job.id, 30, on_progress=on_progress)
    assert done.state is JobState.SUCCEEDED
    assert heard == [1 / 3, 2 / 3, 1.0]


def test_the_info_round_trips_as_json(queue: Queue, sql: psycopg.Connection[Any]) -> None:
    info = {"file": "a.csv", "rows": [1, 2], "note": "é"}
    job = queue.enqueue("i")
    [claimed] = queue.claim(1)
    assert claimed.lease_token is not None
    report = Report(job.id, claimed.lease_token, 1, json.dumps(info))
    with psycopg.connect(queue.url, autocommit=True) as conn:
        drive_on(conn, report_progress([report]), transaction=True)
    assert queue.get(job.id).progress_info == info
