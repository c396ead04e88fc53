"""The FastAPI application: routes over one ``AsyncQueue``.

Every route is a thin translation: validate (models.py), call the queue,
shape the answer. Errors become JSON by http_errors.py; authentication and
the body size limit run before any of this (middleware.py).
"""

# No "from __future__ import annotations": FastAPI reads the route signatures
# at run time, and the batch body's model is made inside create_app.

import asyncio
import base64
import functools
import hashlib
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Annotated, Any

from fastapi import Body, FastAPI, Path, Query, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from starlette.convertors import StringConvertor, register_url_convertor

from .. import stats
from ..errors import DatabaseUnavailable
from ..jobs import JobState
from ..queue import AsyncQueue
from ..settings import Settings
from . import metrics
from .http_errors import ERROR_RESPONSES, error_response, install_handlers
from .middleware import PUBLIC_PATHS, BearerAuth, BodyLimit, TokenSet
from .models import (
    MAX_JOB_ID,
    QUEUE_PATTERN,
    TASK_PATTERN,
    BatchEnqueued,
    BatchItem,
    EnqueueRequest,
    ErrorBody,
    Health,
    JobList,
    JobOut,
    QueueJobs,
    QueueList,
    QueueOut,
    QueueTotals,
    batch_request_model,
)

__all__ = ["HEALTH_TIMEOUT_SECONDS", "create_app"]

log = logging.getLogger("pgqueue.api")

# /healthz answers within 2 s: its database check gives up after this long.
HEALTH_TIMEOUT_SECONDS = 1.5
PROMETHEUS_TEXT = CONTENT_TYPE_LATEST
# For new pool connections, when the URL does not say (libpq's minimum is 2).
CONNECT_TIMEOUT_SECONDS = 5

JobId = Annotated[int, Path(ge=1, le=MAX_JOB_ID, description="A job id.")]


class _JobIdSegment(StringConvertor):
    """Any path segment but "batch": /jobs/batch is its own resource, so that
    GET /jobs/batch is a 405, not a job id that is not a number. Other
    segments reach the route, where a non-integer is a 422 naming job_id."""

    regex = r"(?!batch(?:/|$))[^/]+"


register_url_convertor("pgqueue_job_id", _JobIdSegment())


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    common = {400, 401, 413, 422, 500, 503}
    return {
        s: ERROR_RESPONSES.get(s) or {"model": ErrorBody, "description": _DESCRIBE[s]}
        for s in sorted(common | set(statuses))
    }


_DESCRIBE = {404: "No job has this id.", 409: "The job's state does not allow this."}


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
    queue = AsyncQueue(_bounded_connect(url or settings.database_url), settings=settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await queue.open()
        try:
            yield
        finally:
            await queue.close()

    app = FastAPI(
        title="pgqueue",
        summary="A durable job queue whose only infrastructure is PostgreSQL.",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served below, behind auth
    )
    app.state.queue = queue
    app.state.settings = settings
    install_handlers(app)
    # Added last runs first: auth, then the body limit, then routing.
    app.add_middleware(BodyLimit, max_bytes=settings.api_max_body_bytes)
    app.add_middleware(BearerAuth, tokens=tokens)

    batch_model = batch_request_model(settings.api_max_batch)

    # -- producers ---------------------------------------------------------------

    @app.post(
        "/jobs",
        tags=["jobs"],
        status_code=201,
        response_model=JobOut,
        responses={
            200: {
                "model": JobOut,
                "description": "The idempotency key already "
                "belonged to this job; nothing was written.",
            },
            **_errors(403),
        },
        summary="Enqueue a job",
    )
    async def enqueue(body: EnqueueRequest, response: Response) -> JobOut:
        job = await queue.enqueue(**body.fields())
        if job.duplicate:
            response.status_code = 200
        return JobOut.of(job)

    @app.post(
        "/jobs/batch",
        tags=["jobs"],
        status_code=201,
        response_model=BatchEnqueued,
        responses={
            200: {"model": BatchEnqueued, "description": "Every job already existed."},
            **_errors(403),
        },
        summary="Enqueue many jobs in one transaction",
        description=f"Up to {settings.api_max_batch} jobs (setting api_max_batch). All are "
        "validated first: one bad job writes nothing. 201 when at least one job was created.",
    )
    async def enqueue_batch(
        body: Annotated[batch_model, Body()],  # type: ignore[valid-type]
        response: Response,
    ) -> BatchEnqueued:
        jobs: list[EnqueueRequest] = body.jobs  # type: ignore[attr-defined]
        fields = [job.fields() for job in jobs]
        for spec in fields:
            if spec["max_attempts"] is None:
                del spec["max_attempts"]  # the settings' default
        results = await queue.enqueue_many(fields)
        if not any(r.created for r in results):
            response.status_code = 200
        return BatchEnqueued(
            jobs=[
                BatchItem(id=r.id, outcome="created" if r.created else "existing") for r in results
            ]
        )

    # -- operators -----------------------------------------------------------------

    @app.get(
        "/jobs/{job_id:pgqueue_job_id}",
        tags=["jobs"],
        response_model=JobOut,
        responses=_errors(404),
        summary="One job",
    )
    async def get_job(job_id: JobId) -> JobOut:
        return JobOut.of(await queue.get(job_id))

    @app.get(
        "/jobs",
        tags=["jobs"],
        response_model=JobList,
        responses=_errors(),
        summary="List jobs, newest first",
    )
    async def list_jobs(
        state: Annotated[JobState | None, Query()] = None,
        queue_name: Annotated[str | None, Query(alias="queue", pattern=QUEUE_PATTERN)] = None,
        task: Annotated[str | None, Query(pattern=TASK_PATTERN)] = None,
        cursor: Annotated[
            int | None,
            Query(
                ge=1,
                le=MAX_JOB_ID,
                description="next_cursor of the previous page (keyset: jobs with a smaller id).",
            ),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> JobList:
        jobs = await queue.list_jobs(
            state=None if state is None else str(state),
            queue=queue_name,
            task=task,
            before_id=cursor,
            limit=limit,
        )
        next_cursor = jobs[-1].id if len(jobs) == limit else None
        return JobList(jobs=[JobOut.of(j) for j in jobs], next_cursor=next_cursor)

    @app.post(
        "/jobs/{job_id:pgqueue_job_id}/cancel",
        tags=["jobs"],
        response_model=JobOut,
        responses=_errors(403, 404, 409),
        summary="Cancel a queued or running job",
        description="A running job's lease is revoked: its worker's result is refused. "
        "409 if the job already finished.",
    )
    async def cancel_job(job_id: JobId) -> JobOut:
        return JobOut.of(await queue.cancel(job_id))

    @app.post(
        "/jobs/{job_id:pgqueue_job_id}/retry",
        tags=["jobs"],
        response_model=JobOut,
        responses=_errors(403, 404, 409),
        summary="Retry a dead or cancelled job",
        description="Back to queued with a fresh attempt budget; 409 for any other state.",
    )
    async def retry_job(job_id: JobId) -> JobOut:
        return JobOut.of(await queue.retry(job_id))

    @app.get(
        "/queues",
        tags=["queues"],
        response_model=QueueList,
        responses=_errors(),
        summary="Per queue: live jobs by state, outcome totals, lag",
    )
    async def list_queues() -> QueueList:
        rows = await queue.run(stats.per_queue(), transaction=True)
        return QueueList(
            queues=[
                QueueOut(
                    queue=name,
                    jobs=QueueJobs(queued=row.queued, scheduled=row.scheduled, running=row.running),
                    totals=QueueTotals(
                        succeeded=row.succeeded,
                        failed_attempts=row.failed,
                        dead=row.dead,
                        cancelled=row.cancelled,
                    ),
                    oldest_runnable_seconds=row.oldest_runnable_seconds,
                )
                for name, row in rows.items()
            ]
        )

    # -- monitoring -----------------------------------------------------------------

    @app.get(
        "/metrics",
        tags=["monitoring"],
        response_class=Response,
        responses={
            200: {
                "content": {PROMETHEUS_TEXT: {"schema": {"type": "string"}}},
                "description": "Prometheus text exposition.",
            },
            **_errors(),
        },
        summary="Prometheus metrics, from one database snapshot",
    )
    async def get_metrics() -> Response:
        snap = await queue.run(metrics.snapshot(), transaction=True)
        return Response(metrics.render(snap, settings.latency_buckets), media_type=PROMETHEUS_TEXT)

    @app.get(
        "/healthz",
        tags=["monitoring"],
        response_model=Health,
        responses={503: ERROR_RESPONSES[503], 500: ERROR_RESPONSES[500]},
        summary="200 when the database answers; 503 within 2 s when it does not",
    )
    async def healthz() -> Health | JSONResponse:
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_SECONDS):
                await queue.read("db_ping")
        except (TimeoutError, DatabaseUnavailable) as exc:
            log.warning(
                "health check failed: %s", exc or "timed out", extra={"action": "api_health_failed"}
            )
            return error_response(
                503,
                "database_unavailable",
                "the database did not answer",
                headers={"Retry-After": "1"},
            )
        return Health(status="ok")

    # -- documentation (behind the same auth as everything else) ------------------------

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            _add_security(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_json() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="pgqueue API")

    # -- dashboard: a static page, no token needed to load it (it holds no data) ----------

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        page, headers = _dashboard_page()
        return HTMLResponse(page, headers=headers)

    return app


@functools.cache
def _dashboard_page() -> tuple[bytes, dict[str, str]]:
    """The page, and headers whose CSP allows only its own inline script and
    style (by hash) and requests to this origin."""
    page = (resources.files(__package__) / "dashboard" / "index.html").read_bytes()
    text = page.decode("utf-8")

    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
        return " ".join(
            f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'"
            for b in blocks
        )

    csp = (
        f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return page, {
        "Content-Security-Policy": csp,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }


def _bounded_connect(url: str | None) -> str | None:
    """The URL with a connect timeout, unless it sets one: without it, a
    database that accepts TCP and then says nothing holds each new pool
    connection for minutes, and recovery after an outage waits for it."""
    if not url or "connect_timeout" in conninfo_to_dict(url):
        return url or None
    return make_conninfo(url, connect_timeout=CONNECT_TIMEOUT_SECONDS)


def _add_security(schema: dict[str, Any]) -> None:
    """Declare the bearer scheme on every operation but the public ones."""
    schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "PGQUEUE_API_TOKENS (admin) or PGQUEUE_API_READ_TOKENS (GET only). "
        "Not required when the server has no token configured.",
    }
    for path, operations in schema.get("paths", {}).items():
        if path in PUBLIC_PATHS:
            continue
        for operation in operations.values():
            operation["security"] = [{"bearer": []}]
