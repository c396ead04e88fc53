"""Without tokens, only this server's own pages may change jobs, and only
requests that name this server are answered (DNS rebinding). httpx sends
the headers a browser would; tests/acceptance/test_cross_site.py makes a
real browser try the attacks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import psycopg
import pytest

from pgqueue import AsyncQueue, JobState, Settings
from tests.support import api_client

PORT = 8000


@pytest.fixture
async def open_api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """No token configured; `queue.internal` is a configured name."""
    allowed = settings.replace(api_allowed_hosts=("queue.internal",))
    async with api_client(allowed, base_url=f"http://127.0.0.1:{PORT}") as client:
        yield client


def job_count(sql: psycopg.Connection) -> int:
    return sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()[0]  # type: ignore[index]


@pytest.mark.parametrize(
    "host",
    [
        f"127.0.0.1:{PORT}",
        f"[::1]:{PORT}",
        f"192.0.2.7:{PORT}",  # an IP address cannot be rebound
        f"localhost:{PORT}",
        "LOCALHOST",
        "localhost.",
        f"queue.internal:{PORT}",
        "Queue.Internal",
    ],
)
async def test_requests_naming_this_server_are_answered(
    open_api: httpx.AsyncClient, host: str
) -> None:
    assert (await open_api.get("/jobs", headers={"Host": host})).status_code == 200


@pytest.mark.parametrize(
    "host",
    [
        f"attacker.example:{PORT}",
        "queue.internal.attacker.example",
        "localhost.attacker.example",
        "",
    ],
)
async def test_other_names_are_refused_before_anything_runs(
    open_api: httpx.AsyncClient, sql: psycopg.Connection, host: str
) -> None:
    for method, path in (("GET", "/jobs"), ("GET", "/metrics"), ("POST", "/jobs")):
        response = await open_api.request(
            method, path, json={"task": "t"} if method == "POST" else None, headers={"Host": host}
        )
        assert response.status_code == 400, (method, path)
        body = response.json()
        assert body["error"] == "host_not_allowed"
        assert "PGQUEUE_API_ALLOWED_HOSTS" in body["message"]
    assert job_count(sql) == 0


async def test_the_bound_host_name_is_allowed(settings: Settings) -> None:
    async with api_client(settings.replace(api_host="queue.lan"), base_url="http://x") as client:
        assert (await client.get("/healthz", headers={"Host": "queue.lan:8000"})).status_code == 200
        assert (await client.get("/healthz", headers={"Host": "other.lan"})).status_code == 400


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://attacker.example"},
        {"Origin": "null"},  # a sandboxed frame or a file
        {"Origin": f"http://127.0.0.1:{PORT + 1}"},  # same site, another origin
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": f"http://127.0.0.1:{PORT}", "Sec-Fetch-Site": "same-site"},
    ],
)
async def test_writes_from_another_origin_are_refused(
    open_api: httpx.AsyncClient,
    aqueue: AsyncQueue,
    sql: psycopg.Connection,
    headers: dict[str, str],
) -> None:
    job = await aqueue.enqueue("t")
    for path, body in (
        (f"/jobs/{job.id}/cancel", None),
        ("/jobs", {"task": "forged"}),
        ("/jobs/batch", {"jobs": [{"task": "forged"}]}),
    ):
        response = await open_api.post(path, json=body, headers=headers)
        assert response.status_code == 403, (path, headers)
        assert response.json()["error"] == "cross_site"
    assert (await aqueue.get(job.id)).state is JobState.QUEUED
    assert job_count(sql) == 1
    # Reading stays open: a page elsewhere cannot read the answer anyway (no CORS).
    assert (await open_api.get("/jobs", headers=headers)).status_code == 200


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
async def test_writes_must_be_json_which_no_page_elsewhere_can_send(
    open_api: httpx.AsyncClient, aqueue: AsyncQueue, content_type: str | None
) -> None:
    # The content types a page on another origin may send without asking
    # (a "simple" request), and none at all.
    job = await aqueue.enqueue("t")
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = await open_api.post(f"/jobs/{job.id}/cancel", headers=headers)
    assert response.status_code == 415
    body = response.json()
    assert body["error"] == "unsupported_media_type"
    assert "application/json" in body["message"]
    assert (await aqueue.get(job.id)).state is JobState.QUEUED


async def test_this_servers_own_pages_and_plain_clients_may_write(
    open_api: httpx.AsyncClient, aqueue: AsyncQueue
) -> None:
    json_type = {"Content-Type": "application/json; charset=utf-8"}
    own_page = {"Origin": f"http://127.0.0.1:{PORT}", "Sec-Fetch-Site": "same-origin", **json_type}
    behind_proxy = {"Origin": "https://queue.internal", **json_type}  # a configured name
    for headers in (own_page, behind_proxy, json_type):  # the last: curl, a script
        job = await aqueue.enqueue("t")
        response = await open_api.post(f"/jobs/{job.id}/cancel", headers=headers)
        assert response.status_code == 200, (headers, response.text)
        assert response.json()["state"] == "cancelled"
    created = await open_api.post("/jobs", json={"task": "t"}, headers=own_page)
    assert created.status_code == 201


async def test_with_tokens_bearer_auth_does_this_job(settings: Settings) -> None:
    # A page elsewhere cannot send the token, so no Host or Origin rule
    # applies: clients may use any name for the server.
    protected = settings.replace(api_tokens=("admin-token",))
    async with api_client(protected, base_url="http://queue-api.svc") as client:
        job = (await client.post("/jobs", json={"task": "t"}, headers=_bearer())).json()
        forged = await client.post(
            f"/jobs/{job['id']}/cancel", headers={"Origin": "http://attacker.example"}
        )
        assert forged.status_code == 401
        cancelled = await client.post(f"/jobs/{job['id']}/cancel", headers=_bearer())
        assert cancelled.status_code == 200


def _bearer() -> dict[str, str]:
    return {"Authorization": "Bearer admin-token"}
