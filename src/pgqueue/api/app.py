"""The FastAPI application: one ``AsyncQueue``, the middleware, the routers.

Every route is a thin translation: validate (models.py), call the queue
(``app.state.queue``), shape the answer. The routes are ``APIRouter``s, one
module per group (jobs.py, queues.py, monitoring.py...). Errors become JSON
by http_errors.py; authentication and the body size limit run before any of
this (middleware.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from ..core.settings import Settings
from ..db.connections import listen_url
from ..queue import AsyncQueue
from . import (
    access,
    batches,
    bulk,
    dead,
    events,
    history,
    jobs,
    monitoring,
    queues,
    schedules,
    workers,
    workflows,
)
from .http_errors import install_handlers
from .middleware import BearerAuth, BodyLimit, HeadAsGet, SameOrigin, TokenSet
from .pages import install_pages
from .tracing import add_trace_context

__all__ = ["create_app"]

log = logging.getLogger("pgqueue.api")


def create_app(settings: Settings | None = None, *, url: str | None = None) -> FastAPI:
    """The API over the database at ``url`` (default: settings.database_url,
    or the embedded server). The pool opens at startup without waiting for a
    connection and closes at shutdown, so the app starts while the database
    is down (and /healthz says so)."""
    settings = settings or Settings.load()
    tokens = TokenSet(settings.api_tokens, settings.api_read_tokens)
    if not tokens.enabled:
        log.warning(
            "the API has no token configured: anyone who can reach it may use it",
            extra={"action": "api_no_auth"},
        )
    queue = AsyncQueue(
        url or settings.database_url,
        settings=settings,
        group_commit=settings.api_group_commit,  # POST /jobs: group_commit.py
    )

    hub = events.EventHub()  # GET /events: one listening connection, opened by its first client

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await queue.open()
        # Behind a transaction-mode pooler without a direct URL: no LISTEN,
        # the fingerprint only (db/changes.py).
        direct = listen_url(settings, queue.url)
        hub.url, hub.listen = direct or queue.url, direct is not None
        try:
            yield
        finally:
            await hub.close()
            await queue.close()

    app = FastAPI(
        title="pgqueue",
        summary="A durable job queue whose only infrastructure is PostgreSQL.",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served by pages.py, behind auth
    )
    app.state.queue = queue
    app.state.events = hub
    app.state.settings = settings
    app.state.redaction = settings.redaction
    app.state.read_redaction = (
        settings.redaction
        if settings.api_read_tracebacks
        else settings.redaction.without_tracebacks()
    )
    install_handlers(app)
    # Added last runs first: auth (or, without tokens, the same-origin
    # checks), then the body limit, then HEAD as GET, then the request's
    # trace context (tracing on), then routing.
    add_trace_context(app, settings)
    app.add_middleware(HeadAsGet)
    app.add_middleware(BodyLimit, max_bytes=settings.api_max_body_bytes)
    if tokens.enabled:
        app.add_middleware(BearerAuth, tokens=tokens)
    else:
        app.add_middleware(
            SameOrigin, allowed_hosts=settings.api_allowed_hosts, bound_host=settings.api_host
        )

    app.include_router(jobs.router)
    app.include_router(jobs.batch_router(settings.api_max_batch))
    app.include_router(monitoring.router)
    app.include_router(workers.router)
    app.include_router(schedules.router)
    app.include_router(bulk.router)
    app.include_router(queues.router)
    app.include_router(dead.router)
    app.include_router(access.router)
    app.include_router(workflows.router)
    app.include_router(batches.router)
    app.include_router(history.router)
    app.include_router(events.router)
    install_pages(app)
    return app
