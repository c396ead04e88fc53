"""GET /jobs?fields=summary: the listing without payload, result,
last_error, errors and metadata, which the dashboard polls every 2 s."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from pgqueue import AsyncQueue, Outcome, Settings
from tests.support import api_client

HEAVY = (
    "payload",
    "result",
    "last_error",
    "errors",
    "metadata",
    "progress_info",
    "last_checkpoint",
)
BIG = "x" * 200_000


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings) as client:
        yield client


async def big_jobs(aqueue: AsyncQueue) -> None:
    """Twenty jobs with 200 kB payloads; some with large results or errors."""
    await aqueue.enqueue_many([{"task": "big", "payload": {"blob": BIG}} for _ in range(20)])
    claimed = await aqueue.claim(10, worker="w")
    await aqueue.finish(
        [Outcome.success(job, {"echo": BIG}) for job in claimed[:5]]
        + [Outcome.failure(job, BIG) for job in claimed[5:]]
    )


async def test_summary_leaves_out_the_heavy_fields_and_nothing_else(
    api: httpx.AsyncClient, aqueue: AsyncQueue
) -> None:
    await big_jobs(aqueue)
    full = await api.get("/jobs", params={"limit": 100})
    summary = await api.get("/jobs", params={"limit": 100, "fields": "summary"})
    assert full.status_code == summary.status_code == 200

    assert len(full.content) > 20 * len(BIG)
    assert len(summary.content) < 20_000, len(summary.content)
    full_jobs, light_jobs = full.json()["jobs"], summary.json()["jobs"]
    assert [j["id"] for j in light_jobs] == [j["id"] for j in full_jobs]
    for whole, light in zip(full_jobs, light_jobs, strict=True):
        assert not set(HEAVY) & set(light)
        assert light == {k: v for k, v in whole.items() if k not in HEAVY}
    assert {j["state"] for j in light_jobs} == {"queued", "succeeded"}


async def test_summary_pages_and_filters_like_the_full_listing(
    api: httpx.AsyncClient, aqueue: AsyncQueue
) -> None:
    await aqueue.enqueue_many([{"task": "a" if n % 2 else "b"} for n in range(7)])
    params = {"task": "a", "limit": 2}
    for fields in ("full", "summary"):
        seen, cursor = [], None
        while True:
            page = await api.get(
                "/jobs",
                params={**params, "fields": fields, **({"cursor": cursor} if cursor else {})},
            )
            seen += [j["id"] for j in page.json()["jobs"]]
            if (cursor := page.json()["next_cursor"]) is None:
                break
        assert len(seen) == 3 and seen == sorted(seen, reverse=True), fields


async def test_fields_is_documented_and_checked(api: httpx.AsyncClient) -> None:
    refused = await api.get("/jobs", params={"fields": "payload"})
    assert refused.status_code == 422 and refused.json()["field"] == "fields"
    schema = (await api.get("/openapi.json")).json()
    [param] = [p for p in schema["paths"]["/jobs"]["get"]["parameters"] if p["name"] == "fields"]
    assert param["schema"]["enum"] == ["full", "summary"]
    assert "payload" in param["description"]
