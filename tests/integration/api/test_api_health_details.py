"""GET /health/details over a real HTTP socket: the doctor's report as
JSON, behind the API's tokens (a read token may ask), the options checked,
and /healthz left as it was (no token, the same answer)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import psycopg
import pytest

from pgqueue import Queue, Settings
from pgqueue.api import create_app
from tests.support import LiveServer

ADMIN = "admin-doctor-0123"
READ = "read-doctor-4567"


@pytest.fixture
def live(settings: Settings) -> Iterator[LiveServer]:
    app = create_app(settings.replace(api_tokens=(ADMIN,), api_read_tokens=(READ,)))
    with LiveServer(app) as server:
        yield server


def test_the_details_need_a_token_and_answer_the_doctors_report(
    live: LiveServer, queue: Queue, sql: psycopg.Connection
) -> None:
    queue.enqueue("a")
    [job] = queue.claim(worker="gone")
    sql.execute(
        "UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 hour' WHERE id = %s",
        [job.id],
    )
    with httpx.Client(base_url=live.url, timeout=30) as client:
        refused = client.get("/health/details")
        assert refused.status_code == 401
        assert refused.json()["error"] == "unauthorized"
        wrong = client.get("/health/details", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        answer = client.get(
            "/health/details",
            params={"window_seconds": 0.1, "cores": 4},
            headers={"Authorization": f"Bearer {READ}"},
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["status"] == "warn" and body["window_seconds"] >= 0.1
        checks = {check["name"]: check for check in body["checks"]}
        assert checks["stuck_jobs"]["status"] == "warn" and checks["stuck_jobs"]["value"] == 1
        assert checks["durability"]["status"] == "ok"
        assert checks["rate"]["unit"] == "jobs/s" and checks["rate"]["source"]
        assert set(checks["cost"]) == {
            "name", "status", "finding", "advice", "source", "value", "unit"
        }  # fmt: skip
        # /healthz stays public, and says what it said.
        health = client.get("/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok"}


BAD = [
    ({"window_seconds": 0}, "window_seconds"),
    ({"window_seconds": 61}, "window_seconds"),
    ({"long_transaction_seconds": 0}, "long_transaction_seconds"),
    ({"cores": 0}, "cores"),
    ({"cores": "many"}, "cores"),
]


def test_bad_options_are_422_naming_the_field(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as client:
        for params, field in BAD:
            answer = client.get(
                "/health/details", params=params, headers={"Authorization": f"Bearer {ADMIN}"}
            )
            assert answer.status_code == 422, params
            assert answer.json()["field"] == field
