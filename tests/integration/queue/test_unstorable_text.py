"""Text PostgreSQL cannot store: a lone surrogate ("\\ud800", which JSON can
escape and json.loads turns into a Python string) is refused before anything
is written, on every surface, naming the field; NUL stays refused as well.
A handler's result or error text that holds one is a failed attempt with a
readable error."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import AsyncQueue, Job, JobState, Queue, Settings
from pgqueue.cli import app as cli
from pgqueue.worker import AsyncWorker
from tests.input_support import count_jobs, refusals

LONE = "\ud800"

# (fields of one job, the field the error names)
BAD_JOBS: list[tuple[dict[str, Any], str]] = [
    ({"task": "t", "payload": {"x": LONE}}, "payload"),
    ({"task": "t", "payload": {LONE: 1}}, "payload"),
    ({"task": "t", "payload": {"a": [1, {"b": "ok" + LONE}]}}, "payload"),
    ({"task": "t", "payload": {"x": "\udcff"}}, "payload"),  # as surrogateescape makes
    ({"task": "t", "idempotency_key": "key" + LONE}, "idempotency_key"),
    ({"task": "t" + LONE}, "task"),
    ({"task": "t", "queue": LONE}, "queue"),
    ({"task": "t", "payload": {"x": "a\x00b"}}, "payload"),
]
IDS = [f"{field}-{i}" for i, (_, field) in enumerate(BAD_JOBS)]


def as_json(value: Any) -> bytes:
    """JSON text with surrogates as \\u escapes, as a client in another language sends them."""
    return json.dumps(value, ensure_ascii=True).encode()


# -- the library ------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "field"), BAD_JOBS, ids=IDS)
async def test_the_library_refuses_it_naming_the_field(
    queue: Queue,
    aqueue: AsyncQueue,
    sql: psycopg.Connection[Any],
    fields: dict[str, Any],
    field: str,
) -> None:
    sync, async_, batch = await refusals(queue, aqueue, fields)
    assert sync.field == async_.field == field and batch.field == f"jobs[1].{field}"
    str(sync).encode("utf-8")  # the message can itself be printed, logged and sent
    assert count_jobs(sql) == 0


def test_a_result_or_an_error_text_with_a_lone_surrogate_is_a_failed_attempt(
    queue: Queue,
) -> None:
    queue.enqueue_many([{"task": "t", "max_attempts": 3}, {"task": "u", "max_attempts": 1}])
    returned, raised = sorted(queue.claim(2, worker="w"), key=lambda job: job.id)
    assert queue.ack(returned, {"x": LONE}) is JobState.QUEUED
    failed = queue.get(returned.id)
    assert failed.result is None and failed.last_error is not None
    assert "cannot store" in failed.last_error and "lone surrogate (\\ud800)" in failed.last_error
    assert queue.fail(raised, f"could not open {LONE}.txt") is JobState.DEAD
    assert queue.get(raised.id).last_error == "could not open \\ud800.txt"


async def test_a_worker_records_such_results_and_exceptions_and_carries_on(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    async def returns_it(job: Job) -> dict[str, str]:
        return {"name": "\udcff"}

    def raises_it(job: Job) -> None:
        raise FileNotFoundError(f"no such file: {LONE}")

    async def fine(job: Job) -> str:
        return "ok"

    handlers = {"returns_it": returns_it, "raises_it": raises_it, "fine": fine}
    jobs = [await aqueue.enqueue(task, max_attempts=1) for task in handlers]
    worker = AsyncWorker(handlers, settings=settings)
    run = asyncio.create_task(worker.run())
    try:
        done = [await aqueue.wait(job.id, 10) for job in jobs]
    finally:
        await worker.stop()
        await run
    assert [j.state for j in done] == [JobState.DEAD, JobState.DEAD, JobState.SUCCEEDED]
    assert "lone surrogate (\\udcff)" in (done[0].last_error or "")
    assert "FileNotFoundError: no such file: \\ud800" in (done[1].last_error or "")
    assert done[2].result == "ok"


# -- HTTP, over a real socket -----------------------------------------------------------


@pytest.mark.parametrize(("fields", "field"), BAD_JOBS, ids=IDS)
def test_http_answers_422_naming_the_field(
    http: httpx.Client, sql: psycopg.Connection[Any], fields: dict[str, Any], field: str
) -> None:
    headers = {"content-type": "application/json"}
    one = http.post("/jobs", content=as_json(fields), headers=headers)
    assert one.status_code == 422, one.text
    assert one.json()["field"] == field and one.json()["error"] == "invalid_input"
    batch = http.post(
        "/jobs/batch", content=as_json({"jobs": [{"task": "ok"}, fields]}), headers=headers
    )
    assert batch.status_code == 422, batch.text
    assert batch.json()["field"] == f"jobs[1].{field}"
    assert count_jobs(sql) == 0


def test_http_refuses_a_field_name_that_is_not_valid_unicode(
    http: httpx.Client, sql: psycopg.Connection[Any]
) -> None:
    headers = {"content-type": "application/json"}
    one = http.post("/jobs", content=as_json({"task": "t", LONE: 1}), headers=headers)
    assert one.status_code == 422, one.text
    assert one.json()["field"] == "body" and "lone surrogate" in one.json()["message"]
    body = as_json({"jobs": [{"task": "t"}, {"task": "t", LONE: 1}]})
    batch = http.post("/jobs/batch", content=body, headers=headers)
    assert batch.status_code == 422, batch.text
    assert batch.json()["field"] == "jobs[1]"
    assert count_jobs(sql) == 0


# -- the command line -------------------------------------------------------------------


def test_enqueue_file_writes_the_good_lines_and_reports_each_bad_one(
    db_url: str, queue: Queue, tmp_path: Path
) -> None:
    lines = [as_json({"task": "echo", "payload": {"n": 1}}).decode()]
    lines += [as_json(fields).decode() for fields, _ in BAD_JOBS]
    lines += [as_json({"task": "echo", "payload": {"n": 2}}).decode()]
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(
        cli, ["--database-url", db_url, "enqueue-file", str(path), "--json"]
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["created"] == 2 and report["not_written"] is None
    rejected = {r["line"]: r["reason"] for r in report["rejected"]}
    assert sorted(rejected) == list(range(2, 2 + len(BAD_JOBS)))
    for line, (_, field) in enumerate(BAD_JOBS, 2):
        assert rejected[line].startswith(f"{field}:"), rejected[line]
    assert "lone surrogate (\\ud800)" in rejected[2]
    assert sorted(j.payload["n"] for j in queue.list_jobs()) == [1, 2]


def test_enqueue_says_so_in_one_line(db_url: str, sql: psycopg.Connection[Any]) -> None:
    args = ["--database-url", db_url, "enqueue", "t", "--payload", '{"x": "\\ud800"}']
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == (
        "error: invalid job: payload: contains a lone surrogate (\\ud800), "
        "which is not valid Unicode text"
    )
    assert count_jobs(sql) == 0
