"""Job metadata on every surface: what is given is what is stored, shown and
handed to the handler (library sync and async, enqueue_many by COPY and by
INSERT, jobs with dependencies, workflows, POST /jobs, /jobs/batch,
/workflows, enqueue-file, GET /jobs/{id}, jobs show); a bad value is refused
naming the field, and nothing is written."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import AsyncQueue, Job, Queue, Settings, chain, migrate
from pgqueue.cli import app as cli
from pgqueue.core.jobs import MAX_METADATA_BYTES
from pgqueue.tracing import CONTEXT_KEY
from pgqueue.worker import AsyncWorker
from tests.input_support import count_jobs, refusals
from tests.support import api_client, migrated_before, running

JSON = {"Content-Type": "application/json"}
META = {"tenant": "acme", "request_id": "r-1", "nested": {"é": [1, 2.5, None, True]}}


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings) as client:
        yield client


def stored(sql: psycopg.Connection[Any]) -> list[Any]:
    """Each job's metadata column, in id order."""
    return [row[0] for row in sql.execute("SELECT metadata FROM pgqueue_jobs ORDER BY id")]


def given(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """Metadata without the trace context pgqueue adds when a span is
    current (FastAPI makes one per request once an SDK is installed, as the
    tracing tests do for the rest of the session)."""
    kept = {k: v for k, v in (metadata or {}).items() if k != CONTEXT_KEY}
    return kept or None


async def test_the_library_stores_it_on_every_enqueue_path(
    queue: Queue, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    first = queue.enqueue("t", metadata=META)
    assert first.metadata == META
    assert (await aqueue.enqueue("t", metadata=META)).metadata == META
    queue.enqueue_many([{"task": "t", "metadata": META}, {"task": "t"}])  # by COPY
    await aqueue.enqueue_many([{"task": "t", "metadata": META, "delay": 5}])  # by INSERT
    queue.enqueue("t", metadata=META, depends_on=[first.id])  # a graph
    queue.enqueue_workflow(chain({"task": "a", "metadata": META}, {"task": "b"}))
    assert stored(sql) == [META, META, META, None, META, META, META, None]
    assert queue.get(first.id).metadata == META
    assert queue.enqueue("t").metadata is None


async def test_a_callers_asyncpg_connection_reads_it_back_as_json(
    aqueue: AsyncQueue, db_url: str, sql: psycopg.Connection[Any]
) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        job = await aqueue.enqueue("t", metadata=META, connection=conn)
        await aqueue.enqueue_many([{"task": "t", "metadata": META}], connection=conn)
    finally:
        await conn.close()
    assert job.metadata == META
    assert stored(sql) == [META, META]


async def test_the_handler_gets_it_as_job_metadata(aqueue: AsyncQueue, settings: Settings) -> None:
    seen: dict[int, Any] = {}

    async def remember(job: Job) -> None:
        seen[job.id] = job.metadata

    given = await aqueue.enqueue("remember", metadata=META)
    plain = await aqueue.enqueue("remember")
    async with running(AsyncWorker({"remember": remember}, settings=settings)):
        await aqueue.wait(given.id, 10)
        await aqueue.wait(plain.id, 10)
    assert seen == {given.id: META, plain.id: None}


async def test_http_takes_it_on_every_enqueue_route_and_shows_it(
    api: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    one = await api.post("/jobs", json={"task": "t", "metadata": META}, headers=JSON)
    assert one.status_code == 201, one.text
    assert given(one.json()["metadata"]) == META
    batch = await api.post("/jobs/batch", json={"jobs": [{"task": "t", "metadata": META}]})
    assert batch.status_code == 201, batch.text
    flow = {"jobs": [{"name": "a", "task": "a", "metadata": META}, {"name": "b", "task": "b"}]}
    made = await api.post("/workflows", json=flow, headers=JSON)
    assert made.status_code == 201, made.text
    assert list(map(given, stored(sql))) == [META, META, META, None]
    shown = await api.get(f"/jobs/{one.json()['id']}")
    assert given(shown.json()["metadata"]) == META
    listed = (await api.get("/jobs")).json()["jobs"]
    assert [given(job["metadata"]) for job in listed] == [None, META, META, META]
    summary = (await api.get("/jobs", params={"fields": "summary"})).json()["jobs"]
    assert all("metadata" not in job for job in summary)


def test_enqueue_file_takes_it_and_jobs_show_shows_it(
    db_url: str, queue: Queue, sql: psycopg.Connection[Any], tmp_path: Path
) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text(json.dumps({"task": "t", "metadata": META}) + "\n")
    runner = CliRunner()
    result = runner.invoke(cli, ["--database-url", db_url, "enqueue-file", str(path), "--json"])
    assert json.loads(result.stdout)["created"] == 1, result.output
    [job_id] = [row[0] for row in sql.execute("SELECT id FROM pgqueue_jobs")]
    assert stored(sql) == [META]
    shown = runner.invoke(cli, ["--database-url", db_url, "jobs", "show", str(job_id), "--json"])
    assert json.loads(shown.stdout)["metadata"] == META
    table = runner.invoke(cli, ["--database-url", db_url, "jobs", "show", str(job_id)])
    assert table.exit_code == 0, table.output
    assert "metadata" in table.stdout and '"tenant": "acme"' in table.stdout


BAD = [
    ([1, 2], "must be a JSON object (dict), got list"),
    ("text", "must be a JSON object (dict), got str"),
    ({"x": "\ud800"}, "lone surrogate"),
    ({"x": "a\x00b"}, "NUL character"),
    ({"x": float("nan")}, "not JSON-serialisable"),
    ({"x": "y" * MAX_METADATA_BYTES}, f"must be at most {MAX_METADATA_BYTES} bytes"),
]


@pytest.mark.parametrize(("value", "problem"), BAD, ids=[p.split()[0] for _, p in BAD])
async def test_the_library_refuses_a_bad_value_naming_the_field(
    queue: Queue,
    aqueue: AsyncQueue,
    sql: psycopg.Connection[Any],
    value: Any,
    problem: str,
) -> None:
    sync, async_, batch = await refusals(queue, aqueue, {"task": "t", "metadata": value})
    assert sync.field == async_.field == "metadata" and batch.field == "jobs[1].metadata"
    assert all(problem in error.problem for error in (sync, async_, batch))
    assert count_jobs(sql) == 0


@pytest.mark.parametrize(
    "body",
    [
        {"task": "t", "metadata": [1]},
        {"task": "t", "metadata": {"x": "a\u0000b"}},
        {"task": "t", "metadata": {"x": "y" * MAX_METADATA_BYTES}},
    ],
    ids=["list", "nul", "too-big"],
)
async def test_http_answers_422_naming_the_field(
    api: httpx.AsyncClient, sql: psycopg.Connection[Any], body: dict[str, Any]
) -> None:
    one = await api.post("/jobs", json=body, headers=JSON)
    assert one.status_code == 422, one.text
    assert one.json()["field"] == "metadata" and one.json()["error"] == "invalid_input"
    batch = await api.post("/jobs/batch", json={"jobs": [{"task": "ok"}, body]}, headers=JSON)
    assert batch.status_code == 422 and batch.json()["field"] == "jobs[1].metadata", batch.text
    flow = await api.post("/workflows", json={"jobs": [{"name": "a", **body}]}, headers=JSON)
    assert flow.status_code == 422 and "metadata" in flow.json()["field"], flow.text
    assert count_jobs(sql) == 0


def test_enqueue_file_refuses_a_bad_value_naming_the_field(
    db_url: str, sql: psycopg.Connection[Any], tmp_path: Path
) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text(json.dumps({"task": "t", "metadata": [1]}) + "\n")
    result = CliRunner().invoke(
        cli, ["--database-url", db_url, "enqueue-file", str(path), "--json"]
    )
    report = json.loads(result.stdout)
    assert report["rejected"] == [
        {"line": 1, "reason": "metadata: must be a JSON object (dict), got list"}
    ]
    assert count_jobs(sql) == 0


def test_the_migration_adds_a_null_column_to_a_table_that_has_jobs(empty_db: str) -> None:
    """Jobs enqueued before migration 0012 read back with no metadata."""
    migrated_before(empty_db, "0012")
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("INSERT INTO pgqueue_jobs (task) VALUES ('old')")
    assert migrate(empty_db)[0] == "0012_job_metadata"  # and any later ones
    with Queue(empty_db, settings=Settings(database_url=empty_db)) as queue:
        [old] = queue.list_jobs()
        assert old.task == "old" and old.metadata is None
        assert queue.enqueue("new", metadata=META).metadata == META
