"""Schemathesis against the app's own OpenAPI schema, over real HTTP.

One uvicorn on loopback serves a database of its own for the whole module.
Each operation gets positive and negative examples (wrong types, missing and
extra fields, out-of-range numbers, NUL characters...). Every response must
not be a 5xx and must match the schema: its status documented, its body
of the documented shape.

``positive_data_acceptance`` is left out: two rules cannot be written in the
schema (delay_seconds and run_at together; run_at before 1970 or more than
ten years ahead), so a few schema-valid bodies are rightly refused with 422.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from pgqueue import Settings
from pgqueue.api import create_app
from pgqueue.db.embedded import EmbeddedPostgres
from tests.support import LiveServer

TOKEN = "schema-test-admin-token"
SETTINGS = Settings(
    database_url="postgresql://unused", api_tokens=(TOKEN,), api_max_batch=4,
    api_max_body_bytes=256 * 1024, pool_timeout_seconds=2.0,
)  # fmt: skip

# GET /health/details waits its window_seconds (up to a minute) on every
# call, and GET /events is a stream that ends only when the client leaves:
# both are left out here (test_api_health_details.py and test_api_events.py
# read them).
schema = (
    schemathesis.openapi.from_dict(create_app(SETTINGS).openapi())
    .exclude(path="/health/details")
    .exclude(path="/events")
)
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    with_security_parameters=False,  # the real token is sent instead
)


@pytest.fixture(scope="module")
def live_url(pg_server: EmbeddedPostgres) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE pgqueue_template")
    url = pg_server.url.rsplit("/", 1)[0] + "/" + name
    # A few jobs in every state, so that ids the generator draws sometimes exist.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgqueue_jobs (task, state, attempts, finished_at) "
            "SELECT 't', s, 1, CASE WHEN s IN ('queued', 'running') THEN NULL ELSE now() END "
            "FROM unnest(ARRAY['queued','running','succeeded','dead','cancelled']) s, "
            "generate_series(1, 4)"
        )
    try:
        with LiveServer(create_app(SETTINGS.replace(database_url=url), url=url)) as server:
            yield server.url
    finally:
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_no_5xx_and_every_response_matches_the_schema(
    case: schemathesis.Case, live_url: str
) -> None:
    case.call_and_validate(
        base_url=live_url,
        headers={"Authorization": f"Bearer {TOKEN}"},
        excluded_checks=[positive_data_acceptance],
        timeout=10,
    )
