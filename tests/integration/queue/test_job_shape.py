"""One job shape on every surface: the canonical field names, the aliases
``delay`` and ``timeout``, a name given with its alias, a misspelt field, and
an HTTP schema built from the same table as the validator."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import AsyncQueue, InvalidJob, Job, Queue, Settings
from pgqueue.cli import app as cli
from pgqueue.core.job_spec import FIELD_ALIASES, JOB_FIELDS, JobSpec
from pgqueue.core.jobs import MAX_PRIORITY
from tests.input_support import count_jobs, refusals
from tests.support import api_client

CANONICAL = [
    "task",
    "payload",
    "queue",
    "priority",
    "delay_seconds",
    "run_at",
    "max_attempts",
    "timeout_seconds",
    "idempotency_key",
    "unique_scope",
    "unique_period_seconds",
    "on_conflict",
    "concurrency_key",
    "depends_on",
    "on_dependency_failure",
    "metadata",
    "batch",
]


def delay_of(job: Job) -> float:
    return (job.run_at - job.enqueued_at).total_seconds()


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings) as client:
        yield client


def test_the_fields_are_the_columns_names() -> None:
    assert [f.name for f in JOB_FIELDS] == CANONICAL
    assert FIELD_ALIASES == {"delay": "delay_seconds", "timeout": "timeout_seconds"}


# -- the library ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"delay_seconds": 60, "timeout_seconds": 2.5},
        {"delay": 60, "timeout": 2.5},
        {"delay": timedelta(minutes=1), "timeout_seconds": timedelta(seconds=2.5)},
    ],
)
async def test_canonical_names_and_aliases_make_the_same_job(
    queue: Queue, aqueue: AsyncQueue, fields: dict[str, Any]
) -> None:
    jobs = [queue.enqueue("t", **fields), await aqueue.enqueue("t", **fields)]
    [many] = queue.enqueue_many([{"task": "t", **fields}])
    jobs.append(queue.get(many.id))
    for job in jobs:
        assert job.timeout_seconds == 2.5 and abs(delay_of(job) - 60) < 0.01


@pytest.mark.parametrize(
    ("fields", "field", "problem"),
    [
        (
            {"delay": 1, "delay_seconds": 2},
            "delay_seconds",
            "give delay or delay_seconds, not both",
        ),
        (
            {"timeout_seconds": 1, "timeout": 2},
            "timeout_seconds",
            "give timeout_seconds or timeout",
        ),
        ({"delay_seconds": 1, "run_at": "2030-01-01T00:00:00Z"}, "run_at", "not both"),
        ({"delay": 1, "run_at": "2030-01-01T00:00:00Z"}, "run_at", "give delay or run_at"),
    ],
)
async def test_a_name_with_its_alias_or_delay_with_run_at_is_refused(
    queue: Queue,
    aqueue: AsyncQueue,
    sql: psycopg.Connection[Any],
    fields: dict[str, Any],
    field: str,
    problem: str,
) -> None:
    sync, async_, batch = await refusals(queue, aqueue, {"task": "t", **fields})
    assert sync.field == async_.field == field and problem in sync.problem
    assert batch.field == f"jobs[1].{field}"
    assert count_jobs(sql) == 0


async def test_a_misspelt_keyword_is_invalid_job_not_type_error(
    queue: Queue, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    with pytest.raises(InvalidJob) as sync:
        queue.enqueue("t", {}, priorty=1)
    assert sync.value.field == "priorty"
    assert sync.value.problem == "unknown field 'priorty' (did you mean 'priority'?)"
    with pytest.raises(InvalidJob) as async_:
        await aqueue.enqueue("t", {}, colour="red")
    assert async_.value.field == "colour" and "task, payload, queue" in async_.value.problem
    with pytest.raises(InvalidJob) as batch:
        queue.enqueue_many([{"task": "t"}, {"task": "t", "dealy": 5}])
    assert batch.value.field == "jobs[1].dealy" and "'delay'" in batch.value.problem
    with pytest.raises(InvalidJob) as not_a_job:
        queue.enqueue_many([{"task": "t"}, ["t"]])
    assert not_a_job.value.field == "jobs[1]"
    assert count_jobs(sql) == 0


def test_errors_name_the_field_as_the_caller_spelt_it(queue: Queue) -> None:
    for name in ("delay", "delay_seconds", "timeout", "timeout_seconds"):
        with pytest.raises(InvalidJob) as raised:
            queue.enqueue("t", **{name: -1})
        assert raised.value.field == name


def test_run_at_may_be_an_iso_8601_string_with_a_zone(queue: Queue) -> None:
    when = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    job = queue.enqueue("t", run_at=when.isoformat().replace("+00:00", "Z"))
    assert job.run_at == when
    for text in ("2030-01-01T00:00:00", "2030-01-01", "20300101T000000Z", "2030-02-30T00:00:00Z"):
        with pytest.raises(InvalidJob) as raised:
            queue.enqueue("t", run_at=text)
        assert raised.value.field == "run_at"


def test_job_spec_build_keeps_its_keyword_arguments() -> None:
    spec = JobSpec.build("t", {"a": 1}, queue="q", priority=2, delay=3, timeout=4)
    assert (spec.task, spec.payload_json, spec.queue, spec.priority) == ("t", '{"a":1}', "q", 2)
    assert (spec.delay_seconds, spec.timeout_seconds, spec.max_attempts) == (3.0, 4.0, 5)
    assert JobSpec.from_fields({"task": "t"}, default_max_attempts=9).max_attempts == 9


# -- HTTP -----------------------------------------------------------------------------------


async def test_http_takes_the_aliases_too(api: httpx.AsyncClient) -> None:
    response = await api.post("/jobs", json={"task": "t", "delay": 60, "timeout": 2.5})
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["timeout_seconds"] == 2.5
    run_at = datetime.fromisoformat(job["run_at"])
    assert abs((run_at - datetime.fromisoformat(job["enqueued_at"])).total_seconds() - 60) < 0.01


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"task": "t", "delay": 1, "delay_seconds": 2}, "delay_seconds"),
        ({"task": "t", "timeout": 1, "timeout_seconds": 2}, "timeout_seconds"),
        ({"task": "t", "delay": -1}, "delay"),
        ({"task": "t", "timeout": "5"}, "timeout"),
        ({"task": "t", "delay": 1, "run_at": "2030-01-01T00:00:00Z"}, "run_at"),
    ],
)
async def test_http_names_the_field_as_sent(
    api: httpx.AsyncClient, sql: psycopg.Connection[Any], body: dict[str, Any], field: str
) -> None:
    one = await api.post("/jobs", json=body)
    assert one.status_code == 422 and one.json()["field"] == field, one.text
    batch = await api.post("/jobs/batch", json={"jobs": [{"task": "a"}, body]})
    assert batch.status_code == 422 and batch.json()["field"] == f"jobs[1].{field}", batch.text
    assert count_jobs(sql) == 0


async def test_the_http_schema_is_built_from_the_job_fields(api: httpx.AsyncClient) -> None:
    schema = (await api.get("/openapi.json")).json()["components"]["schemas"]["EnqueueRequest"]
    properties = schema["properties"]
    assert list(properties) == [*CANONICAL, *FIELD_ALIASES]
    assert schema["required"] == ["task"] and schema["additionalProperties"] is False
    for job_field in JOB_FIELDS:
        documented = properties[job_field.name]
        value_schema = documented["anyOf"][0] if job_field.nullable else documented
        rule = job_field.rule.json_schema()
        assert {key: value_schema[key] for key in rule} == rule, job_field.name
        # A default a null field takes is said in words (api/models.py field_schema).
        said = job_field.nullable and job_field.default is not None
        default = f" Default: {json.dumps(job_field.default)}." if said else ""
        assert documented["description"] == job_field.description + default
    assert properties["priority"]["maximum"] == MAX_PRIORITY
    for alias, name in FIELD_ALIASES.items():
        assert properties[alias]["anyOf"] == properties[name]["anyOf"]
        assert properties[alias]["description"].startswith(f"Alias of `{name}`")


# -- the command line -------------------------------------------------------------------


def test_enqueue_file_takes_both_vocabularies(db_url: str, queue: Queue, tmp_path: Path) -> None:
    lines = [
        {"task": "a", "delay_seconds": 60, "timeout_seconds": 2},
        {"task": "b", "delay": 60, "timeout": 2},
        {"task": "c", "delay": 60, "delay_seconds": 60},
        {"task": "d", "priorty": 1},
    ]
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = CliRunner().invoke(
        cli, ["--database-url", db_url, "enqueue-file", str(path), "--json"]
    )
    report = json.loads(result.stdout)
    assert report["created"] == 2
    assert report["rejected"] == [
        {"line": 3, "reason": "delay_seconds: give delay or delay_seconds, not both"},
        {"line": 4, "reason": "priorty: unknown field 'priorty' (did you mean 'priority'?)"},
    ]
    for job in queue.list_jobs():
        assert job.timeout_seconds == 2 and abs(delay_of(job) - 60) < 0.01
