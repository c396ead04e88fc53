"""Bulk actions over HTTP (POST /jobs/bulk/{action}, admin only, dry run
first) and on the command line (pgqueue jobs bulk ..., a confirmation that
shows the count), against a real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from typer.testing import CliRunner, Result

from pgqueue import JobState, Queue, Settings
from pgqueue.cli import app
from tests.support import api_client

ADMIN = "admin-secret-0123"
READ = "read-secret-4567"
runner = CliRunner()


def count(sql: psycopg.Connection[Any], where: str = "true") -> int:
    row = sql.execute(f"SELECT count(*) FROM pgqueue_jobs WHERE {where}").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    with_tokens = settings.replace(api_tokens=(ADMIN,), api_read_tokens=(READ,))
    async with api_client(with_tokens, headers={"Authorization": f"Bearer {ADMIN}"}) as client:
        yield client


@pytest.fixture
def three_in_a(queue: Queue) -> Queue:
    queue.enqueue_many([{"task": "t", "queue": q} for q in ("a", "a", "a", "b")])
    return queue


# -- HTTP ------------------------------------------------------------------------------------


async def test_a_dry_run_then_the_action(
    api: httpx.AsyncClient, three_in_a: Queue, sql: psycopg.Connection[Any]
) -> None:
    dry = await api.post("/jobs/bulk/cancel", json={"queue": "a", "dry_run": True})
    assert dry.status_code == 200
    assert dry.json() == {"action": "cancel", "dry_run": True, "count": 3}
    assert count(sql, "state = 'cancelled'") == 0
    done = await api.post("/jobs/bulk/cancel", json={"queue": "a"})
    assert done.json() == {"action": "cancel", "dry_run": False, "count": 3}
    retried = await api.post("/jobs/bulk/retry", json={"enqueued_before": 0})
    assert retried.json()["count"] == 3
    await api.post("/jobs/bulk/cancel", json={"all": True})
    deleted = await api.post(
        "/jobs/bulk/delete", json={"state": "cancelled", "finished_before": "2999-01-01T00:00:00Z"}
    )
    assert deleted.status_code == 422  # more than 10 years ahead: like run_at
    deleted = await api.post("/jobs/bulk/delete", json={"state": "cancelled"})
    assert deleted.json()["count"] == 4 and count(sql) == 0


async def test_a_read_token_may_not_act(
    api: httpx.AsyncClient, three_in_a: Queue, sql: psycopg.Connection[Any]
) -> None:
    for action in ("cancel", "retry", "delete"):
        refused = await api.post(
            f"/jobs/bulk/{action}",
            json={"dry_run": True},
            headers={"Authorization": f"Bearer {READ}"},
        )
        assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    assert count(sql, "state = 'queued'") == 4


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/jobs/bulk/cancel", {"state": "succeeded"}, "state"),
        ("/jobs/bulk/cancel", {"finished_before": 60}, "finished_before"),
        ("/jobs/bulk/cancel", {"queu": "a"}, "queu"),
        ("/jobs/bulk/cancel", {"queue": 7}, "queue"),
        ("/jobs/bulk/retry", {"dry_run": "yes"}, "dry_run"),
        ("/jobs/bulk/retry", {"enqueued_before": True}, "enqueued_before"),
        ("/jobs/bulk/delete", {"error_contains": "\u0000"}, "error_contains"),
        ("/jobs/bulk/delete", [], "body"),
        ("/jobs/bulk/nuke", {}, "action"),
        ("/jobs/bulk/cancel", {}, "all"),
        ("/jobs/bulk/cancel", {"all": False}, "all"),
        ("/jobs/bulk/cancel", {"all": "yes"}, "all"),
    ],
)
async def test_bad_requests_are_422_naming_the_field_and_change_nothing(
    api: httpx.AsyncClient,
    three_in_a: Queue,
    sql: psycopg.Connection[Any],
    path: str,
    body: Any,
    field: str,
) -> None:
    response = await api.post(path, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field
    assert count(sql, "state = 'queued'") == 4


async def test_an_action_without_a_filter_needs_all_and_a_count_does_not(
    api: httpx.AsyncClient, three_in_a: Queue, sql: psycopg.Connection[Any]
) -> None:
    await api.post("/jobs/bulk/cancel", json={"queue": "a"})
    refused = await api.post("/jobs/bulk/delete", json={})
    assert refused.status_code == 422 and refused.json()["field"] == "all"
    assert "no filter given" in str(refused.json())
    assert count(sql) == 4
    dry = await api.post("/jobs/bulk/delete", json={"dry_run": True})
    assert dry.json() == {"action": "delete", "dry_run": True, "count": 3}
    done = await api.post("/jobs/bulk/delete", json={"all": True})
    assert done.json()["count"] == 3 and count(sql) == 1


async def test_bulk_is_not_a_job_id(api: httpx.AsyncClient) -> None:
    assert (await api.get("/jobs/bulk")).status_code == 404
    assert (await api.get("/jobs/bulk/cancel")).status_code == 405
    assert (await api.post("/jobs/bulk/cancel")).status_code == 422  # a body is required


# -- the command line ---------------------------------------------------------------------------


def run(db_url: str, *args: str, input: str | None = None) -> Result:
    return runner.invoke(app, ["--database-url", db_url, "jobs", "bulk", *args], input=input)


def test_cancel_asks_with_the_count_and_a_no_changes_nothing(
    db_url: str, three_in_a: Queue, sql: psycopg.Connection[Any]
) -> None:
    refused = run(db_url, "cancel", "--queue", "a", input="n\n")
    assert refused.exit_code == 1 and "cancel 3 job(s)? [y/N]" in refused.stderr
    assert "aborted" in refused.stderr and count(sql, "state = 'queued'") == 4
    done = run(db_url, "cancel", "--queue", "a", "--state", "queued", input="y\n")
    assert done.exit_code == 0, done.output
    assert "cancelled 3 job(s)" in done.stdout and count(sql, "state = 'cancelled'") == 3


def test_yes_skips_the_question_and_json_says_what_was_done(db_url: str, three_in_a: Queue) -> None:
    dry = run(db_url, "cancel", "--task", "t", "--dry-run")
    assert dry.exit_code == 0 and "4 job(s) match; nothing was cancelled" in dry.stdout
    done = run(db_url, "cancel", "--task", "t", "--enqueued-before", "0s", "--yes", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {"action": "cancel", "dry_run": False, "count": 4}
    retried = run(
        db_url, "retry", "--queue", "b", "--finished-before", "2000-01-01T00:00:00Z", "-y"
    )
    assert retried.exit_code == 0 and "0 job(s) match; nothing was retried" in retried.stdout
    deleted = run(db_url, "delete", "--error-contains", "nothing like it", "-y")
    assert deleted.exit_code == 0 and "0 job(s) match" in deleted.stdout
    deleted = run(db_url, "delete", "--error-kind", "order <n> lost", "-y")
    assert deleted.exit_code == 0 and "0 job(s) match" in deleted.stdout
    assert three_in_a.get(1).state is JobState.CANCELLED
    retried = run(db_url, "retry", "--id", "1", "--id", "2", "-y")
    assert retried.exit_code == 0 and "retried 2 job(s)" in retried.stdout
    assert three_in_a.get(2).state is JobState.QUEUED


def test_an_action_without_a_filter_needs_all(
    db_url: str, three_in_a: Queue, sql: psycopg.Connection[Any]
) -> None:
    refused = run(db_url, "cancel", "--yes")
    assert refused.exit_code == 2 and "'--all'" in refused.stderr, refused.output
    assert "no filter given" in refused.stderr and count(sql, "state = 'queued'") == 4
    dry = run(db_url, "cancel", "--dry-run")
    assert dry.exit_code == 0 and "4 job(s) match" in dry.stdout
    done = run(db_url, "cancel", "--all", "--yes")
    assert done.exit_code == 0 and count(sql, "state = 'cancelled'") == 4


@pytest.mark.parametrize(
    ("args", "flag", "problem"),
    [
        (
            ["cancel", "--state", "dead"],
            "'--state'",
            "cancel applies to waiting or queued or running",
        ),
        (["cancel", "--finished-before", "1h"], "'--finished-before'", "not finished ones"),
        (["retry", "--enqueued-before", "soon"], "'--enqueued-before'", "neither an age"),
        (["delete", "--queue", "no spaces"], "'--queue'", "not a valid queue name"),
        (["delete", "--state", "nope"], "'--state'", "must be one of"),
    ],
)
def test_bad_options_are_one_usage_line(
    db_url: str,
    three_in_a: Queue,
    sql: psycopg.Connection[Any],
    args: list[str],
    flag: str,
    problem: str,
) -> None:
    result = run(db_url, *args, "--yes")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and flag in line and problem in line, line
    assert count(sql, "state = 'queued'") == 4
