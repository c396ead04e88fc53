"""Rows already stored that pgqueue would not write today (by SQL, or by a
version before the depth limit) read on every path without an error: the
library, the worker, the HTTP API (the dashboard shows GET /jobs/{id}) and
the command line. A value nested deeper than MAX_READ_DEPTH levels reads
with its deeper containers replaced by the string TOO_DEEP; a number Python
cannot read, as a string saying so; a payload that is not an object, as it is.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import AsyncQueue, Job, JobState, Queue, Settings
from pgqueue.cli import app as cli
from pgqueue.core.json_text import MAX_READ_DEPTH, TOO_DEEP
from pgqueue.core.workflows import chain
from pgqueue.worker import AsyncWorker
from tests.support import running

# Deeper than a job may be written; the second deeper than Python's json
# reads (PostgreSQL stores it under its default max_stack_depth).
DEPTHS = [MAX_READ_DEPTH + 1, 100, 1_500]
JSON = {"content-type": "application/json"}
TOO_LONG = "1" + "0" * 5_000  # jsonb keeps it; int() refuses more than 4,300 digits


def nested_text(levels: int, leaf: str = "1") -> str:
    return '{"a": ' * levels + leaf + "}" * levels


def nested(levels: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


def read_as(levels: int) -> Any:
    """What ``nested_text(levels)`` reads back as."""
    if levels <= MAX_READ_DEPTH:
        return nested(levels, 1)
    return nested(MAX_READ_DEPTH, TOO_DEEP)


def insert(
    sql: psycopg.Connection[Any],
    payload: str,
    *,
    metadata: str | None = None,
    result: str | None = None,
    task: str = "t",
) -> int:
    row = sql.execute(
        "INSERT INTO pgqueue_jobs (task, payload, metadata, result) "
        "VALUES (%s, %s::jsonb, %s::jsonb, %s::jsonb) RETURNING id",
        (task, payload, metadata, result),
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def stored(sql: psycopg.Connection[Any]) -> dict[int, int]:
    """Jobs whose payload, metadata and result nest DEPTHS levels: id -> levels."""
    return {
        insert(sql, nested_text(n), metadata=nested_text(n), result=nested_text(n)): n
        for n in DEPTHS
    }


# -- the library ------------------------------------------------------------------------


async def test_the_library_reads_each_stored_row(
    queue: Queue, aqueue: AsyncQueue, stored: dict[int, int]
) -> None:
    for job_id, levels in stored.items():
        for job in (queue.get(job_id), await aqueue.get(job_id)):
            assert job.payload == job.metadata == job.result == read_as(levels)
    listed = {job.id: job for job in queue.list_jobs()}
    assert {i: listed[i].payload for i in stored} == {i: read_as(n) for i, n in stored.items()}


def test_a_number_too_long_for_python_reads_as_a_string(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    job_id = insert(sql, f'{{"n": {TOO_LONG}, "m": 2}}')
    assert queue.get(job_id).payload == {
        "n": f"[a number of {len(TOO_LONG)} characters, too long to read]",
        "m": 2,
    }


# -- the worker ------------------------------------------------------------------------------


async def test_the_worker_runs_such_a_job_and_carries_on(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    seen: list[Any] = []

    async def t(job: Job) -> str:
        seen.append(job.payload)
        return "ran"

    ids = [insert(sql, nested_text(n)) for n in DEPTHS]
    after = await aqueue.enqueue("t", {"n": 1})
    async with running(AsyncWorker({"t": t}, settings=settings, concurrency=1)):
        done = [await aqueue.wait(job_id, 10) for job_id in [*ids, after.id]]
    assert [job.state for job in done] == [JobState.SUCCEEDED] * (len(DEPTHS) + 1)
    assert seen == [*(read_as(n) for n in DEPTHS), {"n": 1}]


# -- HTTP, over a real socket ------------------------------------------------------------------


def test_every_http_read_of_such_a_job_answers(http: httpx.Client, stored: dict[int, int]) -> None:
    for job_id, levels in stored.items():
        one = http.get(f"/jobs/{job_id}")  # also what the dashboard's detail shows
        assert one.status_code == 200, one.text
        body = one.json()
        assert body["payload"] == body["metadata"] == body["result"] == read_as(levels)
        assert http.head(f"/jobs/{job_id}").status_code == 200
    for fields in ("full", "summary"):
        page = http.get("/jobs", params={"fields": fields, "limit": 1000})
        assert page.status_code == 200, page.text
        assert {job["id"] for job in page.json()["jobs"]} >= set(stored)
    for job_id, levels in stored.items():
        cancelled = http.post(f"/jobs/{job_id}/cancel", headers=JSON)
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["payload"] == read_as(levels)
        retried = http.post(f"/jobs/{job_id}/retry", headers=JSON)
        assert retried.status_code == 200, retried.text


def test_http_shows_a_payload_or_metadata_that_is_not_an_object_as_stored(
    http: httpx.Client, sql: psycopg.Connection[Any]
) -> None:
    stored = {
        insert(sql, "[1, 2]", metadata='"m"'): ([1, 2], "m"),
        insert(sql, "5", metadata="[]"): (5, []),
        insert(sql, f'{{"n": {TOO_LONG}}}'): (
            {"n": f"[a number of {len(TOO_LONG)} characters, too long to read]"},
            None,
        ),
    }
    for job_id, (payload, metadata) in stored.items():
        one = http.get(f"/jobs/{job_id}")
        assert one.status_code == 200, one.text
        assert (one.json()["payload"], one.json()["metadata"]) == (payload, metadata)
    page = http.get("/jobs")
    assert page.status_code == 200, page.text
    assert {job["id"] for job in page.json()["jobs"]} == set(stored)


# -- the command line -----------------------------------------------------------------------


def test_the_command_line_shows_and_lists_such_jobs(db_url: str, stored: dict[int, int]) -> None:
    base = ["--database-url", db_url, "jobs"]
    for job_id, levels in stored.items():
        shown = CliRunner().invoke(cli, [*base, "show", str(job_id), "--json"])
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.stdout)["payload"] == read_as(levels)
        text = CliRunner().invoke(cli, [*base, "show", str(job_id)])
        assert text.exit_code == 0, text.output
        assert "payload" in text.stdout and "result" in text.stdout
    for extra in ([], ["--json"]):
        listed = CliRunner().invoke(cli, [*base, "list", *extra])
        assert listed.exit_code == 0, listed.output


def test_each_branch_of_a_wide_value_is_cut_at_the_same_depth(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    branch = nested_text(200)
    job_id = insert(sql, "[" + ", ".join([branch] * 1_000) + "]")
    # The list is the first level: each branch keeps the next 64.
    assert queue.get(job_id).payload == [nested(MAX_READ_DEPTH - 1, TOO_DEEP)] * 1_000


def test_failed_attempts_pgqueue_did_not_write_read_as_such(
    http: httpx.Client, queue: Queue, sql: psycopg.Connection[Any], db_url: str
) -> None:
    job_id = insert(sql, "{}")
    odd = {
        '[{"oops": 1}, 7]': ['{"oops": 1}', "7"],
        '{"error": 1, "attempt": "x"}': ['{"error": 1, "attempt": "x"}'],  # jsonb's key order
        '[{"attempt": 1, "error": "boom", "worker": 5, "at": "2030-01-01T00:00:00+00:00"}]': [],
    }
    for stored, shown in odd.items():
        sql.execute("UPDATE pgqueue_jobs SET errors = %s::jsonb WHERE id = %s", (stored, job_id))
        errors = queue.get(job_id).errors
        if shown:
            assert [(e.attempt, e.error) for e in errors] == [
                (0, f"[not a failed attempt as pgqueue writes one: {text}]") for text in shown
            ]
        else:
            assert [(e.attempt, e.error, e.worker) for e in errors] == [(1, "boom", "5")]
        one = http.get(f"/jobs/{job_id}")
        assert one.status_code == 200, one.text
        assert len(one.json()["errors"]) == len(errors)
        shown_by_cli = CliRunner().invoke(
            cli, ["--database-url", db_url, "jobs", "show", str(job_id)]
        )
        assert shown_by_cli.exit_code == 0, shown_by_cli.output


def test_a_workflow_holding_such_a_job_shows(
    http: httpx.Client, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    made = queue.enqueue_workflow(chain({"task": "a"}, {"task": "b"}))
    first = made.jobs[0].id
    sql.execute(
        "UPDATE pgqueue_jobs SET payload = %s::jsonb WHERE id = %s", (nested_text(1_500), first)
    )
    shown = {job.id: job.payload for job in queue.workflow(made.id).jobs}
    assert shown[first] == read_as(1_500)
    answer = http.get(f"/workflows/{made.id}")
    assert answer.status_code == 200, answer.text
    assert {job["id"]: job["payload"] for job in answer.json()["jobs"]}[first] == read_as(1_500)
