"""The dashboard follows pushed changes (GET /events) in a real headless
Chromium against a real uvicorn and database: with the fallback poll set to
an hour (#poll=3600), a job enqueued behind the page's back shows in the
overview and in the jobs list within seconds, so only an event can have
brought it (the stream read with a read token in its Authorization header).
When the stream is refused, the page says it polls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from pgqueue import Queue, Settings
from pgqueue.api import create_app
from tests.acceptance.test_dashboard_views import show, until
from tests.browser import DevTools
from tests.support import LiveServer

HOUR = 3600


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    with DevTools("about:blank", tmp_path_factory.mktemp("chromium-live")) as browser:
        browser.viewport(1280, 900)
        yield browser


def refreshes(page: DevTools) -> int:
    return int(page.run("window.pgqueueLive.lastRefresh"))  # type: ignore[call-overload]


def test_the_overview_and_the_jobs_list_follow_an_enqueue_made_behind_their_back(
    settings: Settings, queue: Queue, page: DevTools
) -> None:
    # Tokens on: the stream is read with the page's token in its header.
    app = create_app(settings.replace(api_tokens=("live-admin",), api_read_tokens=("live-read",)))
    with LiveServer(app) as server:
        page.goto(f"{server.url}/dashboard#token=live-read&poll={HOUR}")
        until(page, 'document.getElementById("live").dataset.mode === "live"')
        # ready, then the resync of the hub's first client (it listens now),
        # and the refresh that followed: from here on, only a change refreshes.
        until(
            page,
            "window.pgqueueLive.events >= 2 && window.pgqueueLive.pending === null "
            "&& !window.pgqueueLive.refreshing",
        )
        until(page, 'document.getElementById("status").textContent.startsWith("Updated")')
        assert page.run("window.pgqueueLive.fallbackMs") == HOUR * 1000
        before = page.run("window.pgqueueLive.events")

        queue.enqueue("send_email", queue="pushed")
        until(page, 'document.querySelector("#queues-body tr[data-queue=\\"pushed\\"]")')
        assert page.run("window.pgqueueLive.events") > before  # type: ignore[operator]

        show(page, "jobs")
        job = queue.enqueue("send_email", queue="pushed-again")
        until(page, f'document.querySelector("#jobs-body tr[data-job-id=\\"{job.id}\\"]")')
        assert page.run('document.getElementById("live").dataset.mode') == "live"
        page.goto("about:blank")  # the stream ends before the server does


def test_a_refused_stream_falls_back_to_polling(
    settings: Settings, page: DevTools, tmp_path: Path
) -> None:
    app = create_app(settings)

    @app.middleware("http")
    async def refuse_events(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.url.path == "/events":
            return JSONResponse({"error": "unavailable"}, status_code=503)
        return await call_next(request)

    with LiveServer(app) as server:
        page.goto(f"{server.url}/dashboard#poll=1")
        until(page, 'document.getElementById("status").textContent.startsWith("Updated")')
        assert page.run('document.getElementById("live").dataset.mode') == "polling"
        first = refreshes(page)
        until(page, f"window.pgqueueLive.lastRefresh > {first}")  # the poll, every second
        page.goto("about:blank")
