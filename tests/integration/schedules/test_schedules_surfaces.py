"""Schedules over HTTP and on the command line, against a real PostgreSQL:
what GET /schedules and ``pgqueue schedules`` show, switching on and off,
deleting, and the errors (unknown name, bad name, read-only token)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import Queue, Settings
from pgqueue.cli import app
from pgqueue.core import schedules as s
from tests.support import api_client

ADMIN = "admin-secret-0123"
READ = "read-secret-4567"
runner = CliRunner()
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def declared(queue: Queue, sql: psycopg.Connection[Any]) -> list[s.Schedule]:
    """Two schedules, as a worker writes them when it starts; "nightly" ran once."""
    found = [
        s.Schedule.create(
            "nightly", task="report", cron="30 2 * * *", tz="Europe/Berlin",
            payload={"kind": "daily"}, queue="reports",
        ),
        s.Schedule.create("beat", every=60, catch_up="none"),
    ]  # fmt: skip
    queue.run(s.sync(found, []))
    sql.execute(  # due since 2026-01-01 02:30 CET: the newest tick is caught up
        "UPDATE pgqueue_schedules SET next_run_at = '2026-01-01 01:30+00' WHERE name = 'nightly'"
    )
    queue.run(s.fire_due(5))
    return found


@pytest.fixture
async def http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings, headers=JSON) as client:
        yield client


def cli(db_url: str, *args: str) -> Any:
    wide = {"COLUMNS": "160"}  # one line per schedule, whatever the times' widths
    result = runner.invoke(app, ["--database-url", db_url, *args], env=wide)
    assert result.exit_code == 0, result.output
    return result


# -- HTTP -----------------------------------------------------------------------------------


async def test_get_schedules_shows_next_run_last_run_last_job_and_status(
    declared: list[s.Schedule], http: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    answer = await http.get("/schedules")
    assert answer.status_code == 200
    beat, nightly = answer.json()["schedules"]
    assert (beat["name"], beat["status"], beat["spec"], beat["catch_up"]) == (
        "beat",
        "enabled",
        "every 60 s",
        "none",
    )
    assert beat["last_job_id"] is None and beat["last_run_at"] is None
    job_id, state = sql.execute("SELECT id, state FROM pgqueue_jobs").fetchone()  # type: ignore[misc]
    assert nightly["last_job_id"] == job_id and nightly["last_job_state"] == state == "queued"
    assert (nightly["task"], nightly["queue"], nightly["payload"]) == (
        "report",
        "reports",
        {"kind": "daily"},
    )
    assert (nightly["cron"], nightly["tz"], nightly["enabled"]) == (
        "30 2 * * *",
        "Europe/Berlin",
        True,
    )
    assert nightly["next_run_at"] > nightly["last_run_at"]


async def test_disable_and_enable_over_http(
    declared: list[s.Schedule], http: httpx.AsyncClient
) -> None:
    off = await http.post("/schedules/beat/disable")
    assert off.status_code == 200 and off.json()["status"] == "disabled"
    assert not off.json()["enabled"]
    on = await http.post("/schedules/beat/enable")
    assert on.status_code == 200 and on.json()["status"] == "enabled"
    again = await http.post("/schedules/beat/enable")  # already on: nothing moves
    assert again.json()["next_run_at"] == on.json()["next_run_at"]


async def test_unknown_and_bad_names_and_a_read_only_token(
    declared: list[s.Schedule], settings: Settings
) -> None:
    async with api_client(settings, headers=JSON) as http:
        missing = await http.post("/schedules/nope/enable")
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"
        assert "nope" in missing.json()["message"]
        bad = await http.post("/schedules/no%20spaces/disable")
        assert bad.status_code == 422 and bad.json()["field"] == "name"
        assert (await http.delete("/schedules/nope")).status_code == 404
        assert (await http.get("/schedules/beat")).status_code in (404, 405)
    tokens = settings.replace(api_tokens=(ADMIN,), api_read_tokens=(READ,))
    async with api_client(tokens, headers={**JSON, "Authorization": f"Bearer {READ}"}) as http:
        assert (await http.get("/schedules")).status_code == 200
        refused = await http.post("/schedules/beat/disable")
        assert refused.status_code == 403
    async with api_client(tokens, headers={**JSON, "Authorization": f"Bearer {ADMIN}"}) as http:
        assert (await http.post("/schedules/beat/disable")).status_code == 200


async def test_a_timing_this_server_cannot_plan_is_a_409_not_a_500(
    declared: list[s.Schedule], http: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    sql.execute(
        "UPDATE pgqueue_schedules SET tz = 'Mars/Olympus', enabled = false WHERE name = 'nightly'"
    )
    answer = await http.post("/schedules/nightly/enable")
    assert answer.status_code == 409 and "unknown time zone" in answer.json()["message"]
    assert (await http.get("/schedules")).status_code == 200


async def test_delete_over_http(declared: list[s.Schedule], http: httpx.AsyncClient) -> None:
    gone = await http.delete("/schedules/beat")
    assert gone.status_code == 204 and gone.content == b""
    names = [x["name"] for x in (await http.get("/schedules")).json()["schedules"]]
    assert names == ["nightly"]


# -- the command line ---------------------------------------------------------------------


def test_schedules_lists_them(declared: list[s.Schedule], db_url: str) -> None:
    table = cli(db_url, "schedules").stdout
    assert "30 2 * * * (Europe/Berlin)" in table and "every 60 s" in table
    assert "queued" in table  # nightly's last job
    listed = json.loads(cli(db_url, "schedules", "--json").stdout)["schedules"]
    assert [x["name"] for x in listed] == ["beat", "nightly"]
    assert listed[1]["last_job_state"] == "queued" and listed[0]["status"] == "enabled"


def test_schedules_fit_80_columns_one_line_each(declared: list[s.Schedule], db_url: str) -> None:
    result = runner.invoke(app, ["--database-url", db_url, "schedules"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(len(line) <= 80 for line in lines), lines
    assert [line.split()[0] for line in lines[1:]] == ["beat", "nightly"]
    assert "enabled" in lines[1] and "enabled" in lines[2]


def test_schedules_when_none(db_url: str) -> None:
    assert "no schedules" in cli(db_url, "schedules").stdout
    assert json.loads(cli(db_url, "schedules", "--json").stdout) == {"schedules": []}


def test_schedules_enable_disable_delete(
    declared: list[s.Schedule], db_url: str, sql: psycopg.Connection[Any]
) -> None:
    assert "beat is disabled" in cli(db_url, "schedules", "disable", "beat").stdout
    enabled_col = "SELECT enabled FROM pgqueue_schedules WHERE name = 'beat'"
    assert sql.execute(enabled_col).fetchone() == (False,)
    sql.execute(  # off for a day: switched on, it starts from its next tick
        "UPDATE pgqueue_schedules SET next_run_at = next_run_at - interval '1 day' "
        "WHERE name = 'beat'"
    )
    on = json.loads(cli(db_url, "schedules", "enable", "beat", "--json").stdout)
    assert on["status"] == "enabled"
    row = sql.execute(
        "SELECT next_run_at - now() FROM pgqueue_schedules WHERE name = 'beat'"
    ).fetchone()
    assert row is not None and timedelta(0) < row[0] <= timedelta(seconds=60)
    assert "deleted" in cli(db_url, "schedules", "delete", "beat").stdout
    assert sql.execute("SELECT count(*) FROM pgqueue_schedules").fetchone() == (1,)


@pytest.mark.parametrize("command", ["enable", "disable", "delete"])
def test_an_unknown_schedule_is_one_line(db_url: str, command: str) -> None:
    result = runner.invoke(app, ["--database-url", db_url, "schedules", command, "nope"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.strip() == "error: schedule 'nope' does not exist"
