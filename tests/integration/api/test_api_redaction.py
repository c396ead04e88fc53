"""Sensitive payload fields (Settings.redacted_fields) are hidden wherever
people see jobs (the HTTP API, so the dashboard, and the command line) and
kept as they are where the work is done (the stored row, a claim)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from typer.testing import CliRunner

from pgqueue import Queue, Settings, chain
from pgqueue.cli import app
from pgqueue.core.redaction import REDACTED
from tests.support import api_client

FIELDS = ("password", "charge:card.number")
PAYLOAD = {"password": "hunter2", "card": {"number": "4242424242424242", "exp": "12/30"}}
SHOWN = {"password": REDACTED, "card": {"number": REDACTED, "exp": "12/30"}}


@pytest.fixture
def redacting(settings: Settings) -> Settings:
    return settings.replace(redacted_fields=FIELDS)


@pytest.fixture
async def api(redacting: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(redacting) as client:
        yield client


async def test_the_api_shows_every_job_with_its_redacted_fields_hidden(
    api: httpx.AsyncClient, queue: Queue
) -> None:
    job = queue.enqueue("charge", PAYLOAD)
    other = queue.enqueue("refund", PAYLOAD)
    assert (await api.get(f"/jobs/{job.id}")).json()["payload"] == SHOWN
    listed = {j["id"]: j["payload"] for j in (await api.get("/jobs")).json()["jobs"]}
    assert listed[job.id] == SHOWN
    assert listed[other.id] == {**PAYLOAD, "password": REDACTED}  # charge's field only on charge
    cancelled = await api.post(f"/jobs/{job.id}/cancel", json={})
    assert cancelled.json()["payload"] == SHOWN


async def test_a_workflows_jobs_are_shown_redacted(api: httpx.AsyncClient, queue: Queue) -> None:
    workflow = queue.enqueue_workflow(chain({"task": "charge", "payload": PAYLOAD}, {"task": "t"}))
    body = (await api.get(f"/workflows/{workflow.id}")).json()
    assert body["jobs"][0]["payload"] == SHOWN


def test_the_command_line_shows_them_redacted(redacting: Settings, queue: Queue) -> None:
    job = queue.enqueue("charge", PAYLOAD)
    env = {"PGQUEUE_REDACTED_FIELDS": ",".join(FIELDS)}
    url = ["--database-url", redacting.database_url]
    shown = CliRunner().invoke(app, [*url, "jobs", "show", str(job.id), "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["payload"] == SHOWN
    listed = CliRunner().invoke(app, [*url, "jobs", "list", "--json"], env=env)
    assert json.loads(listed.stdout)[0]["payload"] == SHOWN
    table = CliRunner().invoke(app, [*url, "jobs", "show", str(job.id)], env=env)
    assert "4242424242424242" not in table.stdout and "hunter2" not in table.stdout


def test_the_stored_job_and_a_claim_keep_the_payload(redacting: Settings) -> None:
    with Queue(redacting.database_url, settings=redacting) as queue:
        job = queue.enqueue("charge", PAYLOAD)
        assert queue.get(job.id).payload == PAYLOAD
        [claimed] = queue.claim(1, worker="w")
        assert claimed.payload == PAYLOAD
