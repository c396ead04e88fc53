"""The FastAPI application: routes over one ``AsyncQueue``.

Every route is a thin translation: validate (models.py), call the queue,
shape the answer. Errors become JSON by http_errors.py; authentication and
the body size limit run before any of this (middleware.py).
"""

# No "from __future__ import annotations": FastAPI reads the route signatures
# at run time, and the batch body's model is made inside create_app.

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import Body, FastAPI, Path, Query, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from starlette.convertors import StringConvertor, register_url_convertor

from .. import stats
from .. import transitions as t
from ..errors import DatabaseReadOnly, DatabaseUnavailable, SchemaNotMigrated
from ..jobs import JobState
from ..queue import AsyncQueue
from ..settings import Settings
from . import access, bulk, dead, history, metrics, queues, schedules, workers, workflows
from .http_errors import (
    ERROR_RESPONSES,
    documented_errors,
    error_response,
    install_handlers,
    read_only,
    schema_not_migrated,
)
from .middleware import BearerAuth, BodyLimit, HeadAsGet, SameOrigin, TokenSet
from .models import (
    MAX_JOB_ID,
    QUEUE_PATTERN,
    TASK_PATTERN,
    BatchEnqueued,
    BatchItem,
    EnqueueRequest,
    Health,
    JobList,
    JobOut,
    JobSummary,
    QueueJobs,
    QueueLimits,
    QueueList,
    QueueOut,
    QueueTotals,
    batch_request_model,
)
from .pages import install_pages
from .tracing import add_trace_context

__all__ = ["HEALTH_TIMEOUT_SECONDS", "create_app"]

log = logging.getLogger("pgqueue.api")

# /healthz answers within 2 s: its database check gives up after this long.
HEALTH_TIMEOUT_SECONDS = 1.5
PROMETHEUS_TEXT = CONTENT_TYPE_LATEST
# For new pool connections, when the URL does not say (libpq's minimum is 2).
CONNECT_TIMEOUT_SECONDS = 5

JobId = Annotated[int, Path(ge=1, le=MAX_JOB_ID, description="A job id.")]


class _JobIdSegment(StringConvertor):
    """Any path segment but "batch" and "bulk": /jobs/batch and /jobs/bulk/…
    are resources of their own, so that GET /jobs/batch is a 405, not a job
    id that is not a number. Other segments reach the route, where a
    non-integer is a 422 naming job_id."""

    regex = r"(?!(?:batch|bulk)(?:/|$))[^/]+"


register_url_convertor("pgqueue_job_id", _JobIdSegment())


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
        _bounded_connect(url or settings.database_url),
        settings=settings,
        group_commit=settings.api_group_commit,  # POST /jobs: grouping.py
    )

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
        openapi_url=None,  # served by pages.py, behind auth
    )
    app.state.queue = queue
    app.state.settings = settings
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
            **documented_errors(403),
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
            **documented_errors(403),
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
        results = await queue.enqueue_many([job.fields() for job in jobs])
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
        responses=documented_errors(404),
        summary="One job",
    )
    async def get_job(job_id: JobId) -> JobOut:
        return JobOut.of(await queue.get(job_id))

    @app.get(
        "/jobs",
        tags=["jobs"],
        response_model=JobList,
        responses=documented_errors(),
        summary="List jobs, newest first",
    )
    async def list_jobs(
        state: Annotated[
            str | None,
            Query(
                description="A job state, or scheduled (queued, run_at in the future) or "
                "retrying (queued after a failed attempt).",
                json_schema_extra={"enum": [*JobState, *t.LIST_VIEWS]},
            ),
        ] = None,
        queue_name: Annotated[str | None, Query(alias="queue", pattern=QUEUE_PATTERN)] = None,
        task: Annotated[str | None, Query(pattern=TASK_PATTERN)] = None,
        error_contains: Annotated[
            str | None,
            Query(
                min_length=1,
                max_length=t.MAX_ERROR_SEARCH,
                description="Only jobs whose last error contains this text (case-sensitive).",
            ),
        ] = None,
        cursor: Annotated[
            int | None,
            Query(
                ge=1,
                le=MAX_JOB_ID,
                description="next_cursor of the previous page (keyset: jobs with a smaller id).",
            ),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        fields: Annotated[
            Literal["full", "summary"],
            Query(
                description="summary: every field but payload, result, last_error, errors "
                "and metadata, "
                "which can be large (for listings that refresh often; GET /jobs/{id} "
                "has them all)."
            ),
        ] = "full",
    ) -> JobList:
        filters: dict[str, Any] = {
            "state": state,
            "queue": queue_name,
            "task": task,
            "error_contains": error_contains,
            "before_id": cursor,
            "limit": limit,
        }
        jobs: list[JobOut | JobSummary]
        if fields == "summary":
            rows = await queue.run(t.list_summaries(**filters))
            jobs = [JobSummary.model_validate(row) for row in rows]
        else:
            jobs = [JobOut.of(job) for job in await queue.list_jobs(**filters)]
        next_cursor = jobs[-1].id if len(jobs) == limit else None
        return JobList(jobs=jobs, next_cursor=next_cursor)

    @app.post(
        "/jobs/{job_id:pgqueue_job_id}/cancel",
        tags=["jobs"],
        response_model=JobOut,
        responses=documented_errors(403, 404, 409),
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
        responses=documented_errors(403, 404, 409),
        summary="Retry a dead or cancelled job",
        description="Back to queued with a fresh attempt budget; 409 for any other state.",
    )
    async def retry_job(job_id: JobId) -> JobOut:
        return JobOut.of(await queue.retry(job_id))

    @app.get(
        "/queues",
        tags=["queues"],
        response_model=QueueList,
        responses=documented_errors(),
        summary="Per queue: live jobs by state, outcome totals, lag",
    )
    async def list_queues() -> QueueList:
        rows = await queue.run(stats.per_queue(), transaction=True)
        return QueueList(
            queues=[
                QueueOut(
                    queue=name,
                    jobs=QueueJobs(
                        queued=row.queued,
                        scheduled=row.scheduled,
                        running=row.running,
                        waiting=row.waiting,
                    ),
                    totals=QueueTotals(
                        succeeded=row.succeeded,
                        failed_attempts=row.failed,
                        dead=row.dead,
                        cancelled=row.cancelled,
                        snoozed=row.snoozed,
                    ),
                    oldest_runnable_seconds=row.oldest_runnable_seconds,
                    paused=row.paused,
                    limits=QueueLimits(**row.limits()),
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
            **documented_errors(),
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
        summary="200 when the database answers, takes writes and its schema is up to date; "
        "503 (within 2 s) when it does not answer, is read-only or is not migrated",
    )
    async def healthz() -> Health | JSONResponse:
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_SECONDS):
                pending = await queue.run(t.health())
        except DatabaseReadOnly as exc:
            return read_only(exc)
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
        if pending:
            return schema_not_migrated(SchemaNotMigrated(pending))
        return Health(status="ok")

    app.include_router(workers.router)
    app.include_router(schedules.router)
    app.include_router(bulk.router)
    app.include_router(queues.router)
    app.include_router(dead.router)
    app.include_router(access.router)
    app.include_router(workflows.router)
    app.include_router(history.router)
    install_pages(app)
    return app


def _bounded_connect(url: str | None) -> str | None:
    """The URL with a connect timeout, unless it sets one: without it, a
    database that accepts TCP and then says nothing holds each new pool
    connection for minutes, and recovery after an outage waits for it."""
    if not url or "connect_timeout" in conninfo_to_dict(url):
        return url or None
    return make_conninfo(url, connect_timeout=CONNECT_TIMEOUT_SECONDS)
