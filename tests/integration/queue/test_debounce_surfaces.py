"""on_conflict on the other faces: POST /jobs, POST /jobs/batch and
``pgqueue enqueue --on-conflict``; bad values refused naming the field."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import Queue, Settings
from pgqueue.api import create_app
from pgqueue.cli import app as cli_app

TOKEN = "debounce-admin-token-0123456789"


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.replace(api_tokens=(TOKEN,)), url=settings.database_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://localhost",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as client,
    ):
        yield client


def _jobs(sql: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return sql.execute("SELECT id, payload FROM pgqueue_jobs ORDER BY id").fetchall()


async def test_post_jobs_says_what_happened(
    api: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    body = {"task": "t", "idempotency_key": "k", "delay_seconds": 60}
    first = await api.post("/jobs", json={**body, "payload": {"n": 1}})
    assert first.status_code == 201 and first.json()["outcome"] == "created"
    ignored = await api.post("/jobs", json={**body, "payload": {"n": 2}})
    assert ignored.status_code == 200 and ignored.json()["outcome"] == "existing"
    replaced = await api.post("/jobs", json={**body, "payload": {"n": 3}, "on_conflict": "replace"})
    assert replaced.status_code == 200
    assert replaced.json()["outcome"] == "replaced" and replaced.json()["payload"] == {"n": 3}
    extended = await api.post(
        "/jobs", json={**body, "payload": {"n": 4}, "on_conflict": "extend", "delay_seconds": 120}
    )
    assert extended.json()["outcome"] == "extended"
    assert extended.json()["run_at"] > first.json()["run_at"]
    assert _jobs(sql) == [(first.json()["id"], {"n": 4})]


async def test_post_jobs_batch_outcomes(
    api: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    jobs = [
        {"task": "t", "payload": {"n": 1}, "idempotency_key": "k", "delay": 60},
        {"task": "t", "payload": {"n": 2}, "idempotency_key": "k", "on_conflict": "replace"},
        {"task": "t", "payload": {"n": 3}, "idempotency_key": "k", "on_conflict": "extend"},
        {"task": "t", "payload": {"n": 4}, "idempotency_key": "k"},
    ]
    response = await api.post("/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 201, response.text
    outcomes = [item["outcome"] for item in response.json()["jobs"]]
    assert outcomes == ["created", "replaced", "extended", "existing"]
    assert [row[1] for row in _jobs(sql)] == [{"n": 3}]


@pytest.mark.parametrize(
    "extra", [{"idempotency_key": "k", "on_conflict": "newest"}, {"on_conflict": "replace"}]
)
async def test_bad_on_conflict_is_422_naming_the_field(
    api: httpx.AsyncClient, sql: psycopg.Connection[Any], extra: dict[str, Any]
) -> None:
    one = await api.post("/jobs", json={"task": "t", **extra})
    assert one.status_code == 422 and one.json()["field"] == "on_conflict", one.text
    batch = await api.post("/jobs/batch", json={"jobs": [{"task": "t"}, {"task": "t", **extra}]})
    assert batch.status_code == 422 and "on_conflict" in batch.json()["field"], batch.text
    assert _jobs(sql) == []


def test_cli_enqueue_on_conflict(db_url: str, queue: Queue) -> None:
    runner = CliRunner()

    def enqueue(*args: str) -> Any:
        result = runner.invoke(
            cli_app, ["--database-url", db_url, "enqueue", "t", "--idempotency-key", "k", *args]
        )
        return result

    first = enqueue("--payload", '{"n": 1}', "--delay", "60", "--json")
    assert first.exit_code == 0, first.output
    out = enqueue("--payload", '{"n": 2}', "--on-conflict", "extend", "--delay", "90", "--json")
    assert out.exit_code == 0, out.output
    shown = json.loads(out.stdout)
    assert (shown["duplicate"], shown["debounced"]) == (True, "extended")
    assert queue.get(json.loads(first.stdout)["id"]).payload == {"n": 2}
    human = enqueue("--payload", '{"n": 3}', "--on-conflict", "replace")
    assert human.exit_code == 0 and "replaced" in human.stdout
    bad = enqueue("--on-conflict", "later")
    assert bad.exit_code == 1 and "on_conflict" in bad.stderr and "Traceback" not in bad.output
