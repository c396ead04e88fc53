"""pgqueue.integrations.fastapi: the queue opened with the app and handed to
routes, and a worker in the app's process, supervised, through a real HTTP
client against a real PostgreSQL. (No ``from __future__ import
annotations``: FastAPI reads the route's annotations, which name a local.)"""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends, FastAPI

from pgqueue import AsyncQueue, Job, JobState, Settings, WorkerFailed
from pgqueue.integrations.fastapi import PgQueue
from pgqueue.worker import AsyncWorker, TaskRegistry


def _app(pgq: PgQueue) -> FastAPI:
    app = FastAPI(lifespan=pgq.lifespan)

    @app.post("/signup/{email}")
    async def signup(
        email: str, queue: Annotated[AsyncQueue, Depends(pgq.queue)]
    ) -> dict[str, int]:
        job = await queue.enqueue("welcome", {"email": email})
        return {"job": job.id}

    return app


@contextlib.asynccontextmanager
async def _client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http,
    ):
        yield http


def _tasks(seen: list[str]) -> TaskRegistry:
    registry = TaskRegistry()

    @registry.task
    async def welcome(job: Job) -> dict[str, Any]:
        seen.append(job.payload["email"])
        return {"sent": True}

    return registry


async def test_a_route_enqueues_and_the_in_app_worker_runs_the_job(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    seen: list[str] = []
    pgq = PgQueue(settings, worker=_tasks(seen), worker_concurrency=4)
    async with _client(_app(pgq)) as http:
        answer = await http.post("/signup/ada@example.com")
        assert answer.status_code == 200
        done = await aqueue.wait(answer.json()["job"], timeout=30)
    assert done.state is JobState.SUCCEEDED and seen == ["ada@example.com"]


async def test_without_a_worker_the_app_only_produces(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    async with _client(_app(PgQueue(settings))) as http:
        job_id = (await http.post("/signup/bob@example.com")).json()["job"]
        await asyncio.sleep(0.3)
    assert (await aqueue.get(job_id)).state is JobState.QUEUED


async def test_a_failed_in_app_worker_is_started_again(
    settings: Settings, aqueue: AsyncQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first run fails as a crashed part would; the supervisor logs it
    and starts a new worker, which runs the job."""
    real_run = AsyncWorker.run
    runs = 0

    async def fails_once(worker: AsyncWorker) -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise WorkerFailed(worker.name, "claims", RuntimeError("boom"))
        await real_run(worker)

    monkeypatch.setattr(AsyncWorker, "run", fails_once)
    monkeypatch.setattr("pgqueue.integrations.fastapi.RESTART_MIN_SECONDS", 0.05)
    seen: list[str] = []
    pgq = PgQueue(settings, worker=_tasks(seen))
    async with _client(_app(pgq)) as http:
        job_id = (await http.post("/signup/cy@example.com")).json()["job"]
        assert (await aqueue.wait(job_id, timeout=30)).state is JobState.SUCCEEDED
    assert pgq.restarts == 1 and seen == ["cy@example.com"]


async def test_the_dependency_says_when_the_lifespan_is_missing(settings: Settings) -> None:
    pgq = PgQueue(settings)
    with pytest.raises(RuntimeError, match=r"lifespan=pgq\.lifespan"):
        await pgq.queue()


async def test_bad_handlers_stop_the_apps_start(settings: Settings) -> None:
    pgq = PgQueue(settings, worker={"welcome": 42})
    with pytest.raises(TypeError, match="not callable"):
        async with _client(_app(pgq)):
            pass
