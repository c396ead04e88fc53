"""A database without pgqueue's schema (or with an older one) is a 503 that
says to run `pgqueue migrate`, on /healthz and on every endpoint; never a
500 and never a green health check."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import psycopg
import pytest

from pgqueue import Settings, migrate
from pgqueue.sql import migration_versions
from tests.support import api_client


@pytest.fixture
async def api(empty_db: str) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(Settings(database_url=empty_db)) as client:
        yield client


def assert_not_migrated(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["error"] == "schema_not_migrated"
    assert body["message"].startswith("schema not migrated")
    assert "pgqueue migrate" in body["message"]


async def test_healthz_is_503_until_the_schema_is_migrated(
    api: httpx.AsyncClient, empty_db: str
) -> None:
    health = await api.get("/healthz")
    assert_not_migrated(health)
    assert all(v in health.json()["message"] for v in migration_versions())
    migrate(empty_db)
    assert (await api.get("/healthz")).json() == {"status": "ok"}


async def test_every_endpoint_says_to_migrate(api: httpx.AsyncClient) -> None:
    json = {"Content-Type": "application/json"}
    for method, path, body in (
        ("GET", "/jobs", None),
        ("GET", "/jobs?fields=summary", None),
        ("GET", "/jobs/1", None),
        ("POST", "/jobs", {"task": "t"}),
        ("POST", "/jobs/batch", {"jobs": [{"task": "t"}]}),
        ("POST", "/jobs/1/cancel", None),
        ("POST", "/jobs/1/retry", None),
        ("GET", "/queues", None),
        ("GET", "/metrics", None),
    ):
        response = await api.request(method, path, json=body, headers=json)
        assert_not_migrated(response)


async def test_a_schema_older_than_the_code_is_not_healthy(db_url: str) -> None:
    newest = migration_versions()[-1]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DELETE FROM pgqueue_migrations WHERE version = %s", (newest,))
    async with api_client(Settings(database_url=db_url)) as api:
        health = await api.get("/healthz")
        assert_not_migrated(health)
        assert f"(missing: {newest})" in health.json()["message"]
