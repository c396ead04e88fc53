"""A job's JSON values must read back as they were written: a payload or
metadata nested deeper than MAX_JSON_DEPTH levels, larger than its byte
limit, or with a key that is not a string is refused before anything is
written, on every surface (the library's single, async and batch enqueues,
workflows, POST /jobs and /jobs/batch and /workflows, enqueue-file), naming
the field; a handler's result that breaks the same rule is a failed
attempt. Before the rule, a payload 256 levels deep was committed, then
POST /jobs answered 500 (after the commit) and so did every read of it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import AsyncQueue, InvalidJob, Job, JobState, Queue, Settings
from pgqueue.api import create_app
from pgqueue.cli import app as cli
from pgqueue.core.jobs import MAX_JSON_BYTES, MAX_JSON_DEPTH, MAX_METADATA_BYTES
from pgqueue.core.workflows import chain
from pgqueue.worker import AsyncWorker
from tests.input_support import count_jobs, refusals
from tests.support import LiveServer, running

JSON = {"content-type": "application/json"}


def nested(levels: int, leaf: Any = 1) -> Any:
    """A value ``levels`` deep: {"a": {"a": ... leaf}}."""
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


# Over HTTP too: (fields of one job, the field the error names, its problem).
TOO_DEEP = f"nested at most {MAX_JSON_DEPTH} levels deep"
HTTP_BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"task": "t", "payload": nested(MAX_JSON_DEPTH + 1)}, "payload", TOO_DEEP),
    ({"task": "t", "payload": nested(256)}, "payload", TOO_DEEP),  # the 500
    ({"task": "t", "payload": {"a": [[[nested(MAX_JSON_DEPTH)]]]}}, "payload", TOO_DEEP),
    ({"task": "t", "metadata": nested(MAX_JSON_DEPTH + 1)}, "metadata", TOO_DEEP),
    ({"task": "t", "metadata": {"m": "x" * MAX_METADATA_BYTES}}, "metadata", "at most 16384 bytes"),
]
# The library only: too deep for json itself, too large, keys JSON cannot keep.
BAD = [
    *HTTP_BAD,
    ({"task": "t", "payload": nested(5_000)}, "payload", TOO_DEEP),
    ({"task": "t", "payload": {"s": "x" * MAX_JSON_BYTES}}, "payload", "at most 16777216 bytes"),
    ({"task": "t", "payload": {1: "a"}}, "payload", "keys must be strings, got the int 1"),
    ({"task": "t", "payload": {"a": [{None: 1}]}}, "payload", "got the NoneType None"),
    ({"task": "t", "metadata": {"m": {True: 1}}}, "metadata", "got the bool True"),
]
IDS = [f"{field}-{i}" for i, (_, field, _) in enumerate(BAD)]
# Fine: as deep as allowed, and string keys that look like numbers.
GOOD = [
    nested(MAX_JSON_DEPTH - 1),
    {"a": [nested(MAX_JSON_DEPTH - 2)] * 3},
    {"1": "a", "-2": [{"true": None, "null": "1"}], "x": ["1", "2"]},
]


# -- the library --------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "field", "problem"), BAD, ids=IDS)
async def test_the_library_refuses_it_naming_the_field(
    queue: Queue,
    aqueue: AsyncQueue,
    sql: psycopg.Connection[Any],
    fields: dict[str, Any],
    field: str,
    problem: str,
) -> None:
    sync, async_, batch = await refusals(queue, aqueue, fields)
    assert sync.field == async_.field == field and batch.field == f"jobs[1].{field}"
    assert problem in sync.problem
    with pytest.raises(InvalidJob) as workflow:
        queue.enqueue_workflow(chain({"task": "fine"}, fields))
    assert workflow.value.field == f"jobs[1].{field}"
    with pytest.raises(InvalidJob) as named:
        queue.enqueue_workflow([{"name": "a", "task": "t"}, {"name": "b", **fields}])
    assert named.value.field == f"jobs[1].{field}"
    assert count_jobs(sql) == 0


def test_what_is_within_the_limits_reads_back_equal(queue: Queue) -> None:
    for payload in GOOD:
        job = queue.enqueue("t", payload, metadata=payload)
        assert queue.get(job.id).payload == queue.get(job.id).metadata == payload


def test_a_result_past_the_limits_is_a_failed_attempt(queue: Queue) -> None:
    queue.enqueue_many([{"task": "t", "max_attempts": 2} for _ in range(3)])
    deep, keyed, fine = sorted(queue.claim(3, worker="w"), key=lambda job: job.id)
    assert queue.ack(deep, nested(MAX_JSON_DEPTH + 1)) is JobState.QUEUED
    assert queue.ack(keyed, {"a": {2: "b"}}) is JobState.QUEUED
    assert queue.ack(fine, nested(MAX_JSON_DEPTH)) is JobState.SUCCEEDED
    for job, problem in ((deep, TOO_DEEP), (keyed, "keys must be strings")):
        failed = queue.get(job.id)
        assert failed.result is None and problem in (failed.last_error or "")
    assert queue.get(fine.id).result == nested(MAX_JSON_DEPTH)


async def test_a_worker_records_a_handler_result_too_deep_and_carries_on(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    async def too_deep(job: Job) -> Any:
        return nested(300)

    async def fine(job: Job) -> str:
        return "ok"

    jobs = [await aqueue.enqueue(task, max_attempts=1) for task in ("too_deep", "fine")]
    async with running(AsyncWorker({"too_deep": too_deep, "fine": fine}, settings=settings)):
        done = [await aqueue.wait(job.id, 10) for job in jobs]
    assert [job.state for job in done] == [JobState.DEAD, JobState.SUCCEEDED]
    assert TOO_DEEP in (done[0].last_error or "")


# -- HTTP, over a real socket -------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "field", "problem"), HTTP_BAD, ids=IDS[: len(HTTP_BAD)])
def test_http_answers_422_naming_the_field(
    http: httpx.Client,
    sql: psycopg.Connection[Any],
    fields: dict[str, Any],
    field: str,
    problem: str,
) -> None:
    one = http.post("/jobs", json=fields)
    assert one.status_code == 422, one.text
    assert one.json()["field"] == field and problem in one.json()["message"]
    batch = http.post("/jobs/batch", json={"jobs": [{"task": "ok"}, fields]})
    assert batch.status_code == 422, batch.text
    assert batch.json()["field"] == f"jobs[1].{field}"
    workflow = http.post(
        "/workflows",
        json={"jobs": [{"name": "a", "task": "ok"}, {"name": "b", **fields}]},
    )
    assert workflow.status_code == 422, workflow.text
    assert workflow.json()["field"] == f"jobs[1].{field}"
    assert count_jobs(sql) == 0


def test_http_refuses_a_payload_over_the_size_limit_when_the_body_limit_allows_it(
    settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    roomy = dataclasses.replace(settings, api_max_body_bytes=2 * MAX_JSON_BYTES)
    with (
        LiveServer(create_app(roomy, url=roomy.database_url)) as server,
        httpx.Client(base_url=server.url, timeout=60) as http,
    ):
        response = http.post("/jobs", json={"task": "t", "payload": {"s": "x" * MAX_JSON_BYTES}})
    assert response.status_code == 422, response.text[:300]
    assert response.json()["field"] == "payload"
    assert count_jobs(sql) == 0


def test_http_accepts_what_is_within_the_limits_and_reads_it_back_equal(
    http: httpx.Client,
) -> None:
    for payload in GOOD:
        made = http.post("/jobs", json={"task": "t", "payload": payload, "metadata": payload})
        assert made.status_code == 201, made.text
        assert made.json()["payload"] == made.json()["metadata"] == payload
        shown = http.get(f"/jobs/{made.json()['id']}")
        assert shown.status_code == 200 and shown.json()["payload"] == payload


# -- the command line ----------------------------------------------------------------------------


def test_enqueue_file_reports_each_line_past_the_limits(
    db_url: str, queue: Queue, tmp_path: Path
) -> None:
    lines = [{"task": "echo", "payload": {"n": 1}}, *(fields for fields, _, _ in HTTP_BAD)]
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = CliRunner().invoke(
        cli, ["--database-url", db_url, "enqueue-file", str(path), "--json"]
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["created"] == 1
    rejected = {r["line"]: r["reason"] for r in report["rejected"]}
    for line, (_, field, problem) in enumerate(HTTP_BAD, 2):
        assert rejected[line].startswith(f"{field}:") and problem in rejected[line]
    assert [job.payload for job in queue.list_jobs()] == [{"n": 1}]


def test_json_text_python_cannot_parse_is_a_clear_error_not_a_traceback(
    db_url: str, queue: Queue, tmp_path: Path
) -> None:
    deep = '{"a": ' * 5_000 + "1" + "}" * 5_000
    long_number = "9" * 5_000
    lines = [
        '{"task": "echo"}',
        f'{{"task": "t", "payload": {deep}}}',
        f'{{"task": "t", "payload": {{"n": {long_number}}}}}',
    ]
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    base = ["--database-url", db_url]
    result = CliRunner().invoke(cli, [*base, "enqueue-file", str(path), "--json"])
    assert result.exit_code == 1, result.output
    rejected = {r["line"]: r["reason"] for r in json.loads(result.stdout)["rejected"]}
    assert rejected[2] == "not valid JSON: nested too deeply to read"
    assert rejected[3].startswith("not valid JSON: a number too long to read")
    for payload in (deep, f'{{"n": {long_number}}}'):
        one = CliRunner().invoke(cli, [*base, "enqueue", "t", "--payload", payload])
        assert one.exit_code == 2 and "not valid JSON" in one.stderr, one.output
        assert "Traceback" not in one.output
    assert [job.task for job in queue.list_jobs()] == ["echo"]


def test_a_result_as_deep_as_allowed_reaches_the_jobs_that_depend_on_it_whole(
    queue: Queue,
) -> None:
    """A dependent gets its parents' results as one array, a level deeper
    than any result: the read cut (MAX_READ_DEPTH) leaves that level."""
    parent = queue.enqueue("parent")
    child = queue.enqueue("child", depends_on=[parent.id])
    [claimed] = queue.claim(1, worker="w")
    assert queue.ack(claimed, nested(MAX_JSON_DEPTH)) is JobState.SUCCEEDED
    [dependent] = queue.claim(1, worker="w")
    assert dependent.id == child.id and dependent.parents == (nested(MAX_JSON_DEPTH),)
