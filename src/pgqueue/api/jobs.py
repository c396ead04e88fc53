"""The jobs: producers enqueue (one, or a batch in one transaction);
operators read one, list them, cancel and retry.

    POST /jobs                 enqueue a job (200 when its idempotency key
                               already belonged to it)
    POST /jobs/batch           enqueue many in one transaction
    GET  /jobs/{id}            one job
    GET  /jobs/{id}/dependents the jobs that depend on it
    GET  /jobs                 jobs newest first, filtered, a page at a time
    POST /jobs/{id}/cancel     cancel a queued or running job
    POST /jobs/{id}/retry      retry a dead or cancelled job
    POST /jobs/{id}/signals/{name}
                               send a signal (the body: its payload) to a
                               job's job.wait_for_signal()

The batch's size limit is a setting, so its route is made per app
(``batch_router``); the others are ``router``'s.
"""

# No "from __future__ import annotations": FastAPI reads the route signatures
# at run time, and the batch body's model is made per app.

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Query, Request, Response
from pydantic import BaseModel, Field
from starlette.convertors import StringConvertor, register_url_convertor

from ..core import reads
from ..core.dependencies import MAX_DEPENDENTS
from ..core.jobs import JobState
from ..core.redaction import Redaction
from ..core.sleeps import MAX_SIGNAL_NAME, SIGNAL_NAME
from ..queue import AsyncQueue
from .access import shown_to
from .http_errors import documented_errors
from .models import (
    MAX_JOB_ID,
    QUEUE_PATTERN,
    TASK_PATTERN,
    BatchEnqueued,
    BatchItem,
    EnqueuedJobOut,
    EnqueueRequest,
    ErrorBody,
    JobList,
    JobOut,
    JobSummary,
    batch_request_model,
    enqueue_outcome,
)

__all__ = ["batch_router", "router"]


class _JobIdSegment(StringConvertor):
    """Any path segment but "batch" and "bulk": /jobs/batch and /jobs/bulk/…
    are resources of their own, so that GET /jobs/batch is a 405, not a job
    id that is not a number. Other segments reach the route, where a
    non-integer is a 422 naming job_id."""

    regex = r"(?!(?:batch|bulk)(?:/|$))[^/]+"


register_url_convertor("pgqueue_job_id", _JobIdSegment())


class _SignalNameSegment(StringConvertor):
    """Any path segment, the empty one too: a signal's name is judged by
    its rule (core/sleeps.py), so that an empty or bad name is a 422 naming
    ``name``, not a 404 for a route that does not exist."""

    regex = r"[^/]*"


register_url_convertor("pgqueue_signal_name", _SignalNameSegment())

JobId = Annotated[int, Path(ge=1, le=MAX_JOB_ID, description="A job id.")]

router = APIRouter(tags=["jobs"])

# A job that joins a batch (its field `batch`) it cannot join.
_BATCH_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "batch: no batch has this id; nothing was written."},
    409: {
        "model": ErrorBody,
        "description": "batch: the batch was closed, no job can join it; nothing was written.",
    },
}


def _queue(request: Request) -> AsyncQueue:
    queue: AsyncQueue = request.app.state.queue
    return queue


def _redaction(request: Request) -> Redaction:
    return shown_to(request)


# -- producers ---------------------------------------------------------------


@router.post(
    "/jobs",
    status_code=201,
    response_model=EnqueuedJobOut,
    responses={
        200: {
            "model": EnqueuedJobOut,
            "description": "The key already belonged to this job: no job was written (the "
            "job was changed if its outcome is replaced or extended: on_conflict).",
        },
        **documented_errors(403),
        **_BATCH_ERRORS,
    },
    summary="Enqueue a job",
)
async def enqueue(body: EnqueueRequest, request: Request, response: Response) -> EnqueuedJobOut:
    job = await _queue(request).enqueue(**body.fields())
    if job.duplicate:
        response.status_code = 200
    shown = JobOut.of(job, _redaction(request))
    outcome = enqueue_outcome(not job.duplicate, job.debounced)
    return EnqueuedJobOut(**dict(shown), outcome=outcome)


def batch_router(max_batch: int) -> APIRouter:
    """POST /jobs/batch, whose body takes at most ``max_batch`` jobs: the
    model (and the schema that documents it) is made per app."""
    batch = APIRouter(tags=["jobs"])
    batch_model = batch_request_model(max_batch)

    @batch.post(
        "/jobs/batch",
        status_code=201,
        response_model=BatchEnqueued,
        responses={
            200: {"model": BatchEnqueued, "description": "Every job already existed."},
            **documented_errors(403),
            **_BATCH_ERRORS,
        },
        summary="Enqueue many jobs in one transaction",
        description=f"Up to {max_batch} jobs (setting api_max_batch). All are "
        "validated first: one bad job writes nothing. 201 when at least one job was created.",
    )
    async def enqueue_batch(
        body: Annotated[batch_model, Body()],  # type: ignore[valid-type]
        request: Request,
        response: Response,
    ) -> BatchEnqueued:
        jobs: list[EnqueueRequest] = body.jobs  # type: ignore[attr-defined]
        results = await _queue(request).enqueue_many([job.fields() for job in jobs])
        if not any(r.created for r in results):
            response.status_code = 200
        return BatchEnqueued(
            jobs=[
                BatchItem(id=r.id, outcome=enqueue_outcome(r.created, r.debounced)) for r in results
            ]
        )

    return batch


# -- operators -----------------------------------------------------------------


@router.get(
    "/jobs/{job_id:pgqueue_job_id}",
    response_model=JobOut,
    responses=documented_errors(404),
    summary="One job",
)
async def get_job(job_id: JobId, request: Request) -> JobOut:
    return JobOut.of(await _queue(request).get(job_id), _redaction(request))


class Dependents(BaseModel):
    job_id: int
    dependents: list[int] = Field(
        description="The jobs that depend on this one (their depends_on names it), by id: "
        f"the first {MAX_DEPENDENTS}."
    )


@router.get(
    "/jobs/{job_id:pgqueue_job_id}/dependents",
    response_model=Dependents,
    responses=documented_errors(404),
    summary="The jobs that depend on a job",
)
async def get_dependents(job_id: JobId, request: Request) -> Dependents:
    return Dependents(job_id=job_id, dependents=await _queue(request).dependents(job_id))


@router.get(
    "/jobs",
    response_model=JobList,
    responses=documented_errors(),
    summary="List jobs, newest first",
)
async def list_jobs(
    request: Request,
    state: Annotated[
        str | None,
        Query(
            description="A job state, or scheduled (queued, run_at in the future) or "
            "retrying (queued after a failed attempt).",
            json_schema_extra={"enum": [*JobState, *reads.LIST_VIEWS]},
        ),
    ] = None,
    queue_name: Annotated[str | None, Query(alias="queue", pattern=QUEUE_PATTERN)] = None,
    task: Annotated[str | None, Query(pattern=TASK_PATTERN)] = None,
    error_contains: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=reads.MAX_ERROR_SEARCH,
            description="Only jobs whose last error contains this text (case-sensitive).",
        ),
    ] = None,
    error_kind: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=reads.MAX_ERROR_SEARCH,
            description="Only jobs whose last error is of this kind: its first line with ids "
            "as <id> and numbers as <n> (a group of GET /dead-letters).",
        ),
    ] = None,
    payload_contains: Annotated[
        str | None,
        Query(
            max_length=reads.MAX_SEARCH_BYTES,
            description="Only jobs whose payload contains this JSON object (jsonb @>): "
            '{"order": 42} finds every job whose payload has "order": 42 among its keys. '
            "See docs/api.md for an index that makes it fast on a large table.",
        ),
    ] = None,
    metadata_contains: Annotated[
        str | None,
        Query(
            max_length=reads.MAX_SEARCH_BYTES,
            description="Only jobs whose metadata contains this JSON object (jsonb @>).",
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
            description="summary: every field but payload, result, last_error, errors, "
            "metadata, progress_info and last_checkpoint, "
            "which can be large (for listings that refresh often; GET /jobs/{id} "
            "has them all)."
        ),
    ] = "full",
) -> JobList:
    queue = _queue(request)
    filters: dict[str, Any] = {
        "state": state,
        "queue": queue_name,
        "task": task,
        "error_contains": error_contains,
        "error_kind": error_kind,
        "payload_contains": payload_contains,
        "metadata_contains": metadata_contains,
        "before_id": cursor,
        "limit": limit,
    }
    jobs: list[JobOut | JobSummary]
    if fields == "summary":
        rows = await queue.run(reads.list_summaries(**filters))
        jobs = [JobSummary.model_validate(row) for row in rows]
    else:
        jobs = [JobOut.of(job, _redaction(request)) for job in await queue.list_jobs(**filters)]
    next_cursor = jobs[-1].id if len(jobs) == limit else None
    return JobList(jobs=jobs, next_cursor=next_cursor)


@router.post(
    "/jobs/{job_id:pgqueue_job_id}/cancel",
    response_model=JobOut,
    responses=documented_errors(403, 404, 409),
    summary="Cancel a queued or running job",
    description="A running job's lease is revoked and its worker told to stop the handler: "
    "its result is refused. 409 if the job already finished.",
)
async def cancel_job(job_id: JobId, request: Request) -> JobOut:
    return JobOut.of(await _queue(request).cancel(job_id), _redaction(request))


@router.post(
    "/jobs/{job_id:pgqueue_job_id}/retry",
    response_model=JobOut,
    responses=documented_errors(403, 404, 409),
    summary="Retry a dead or cancelled job",
    description="Back to queued with a fresh attempt budget; 409 for any other state.",
)
async def retry_job(job_id: JobId, request: Request) -> JobOut:
    return JobOut.of(await _queue(request).retry(job_id), _redaction(request))


@router.post(
    "/jobs/{job_id:pgqueue_job_id}/signals/{name:pgqueue_signal_name}",
    response_model=JobOut,
    responses=documented_errors(403, 404, 409),
    summary="Send a signal to a job",
    description="The JSON body (any JSON; none: null) is the signal's payload, which a "
    "handler's job.wait_for_signal(name, ...) receives; each signal is consumed once. "
    "A job asleep waiting for it runs at once. Returns the job as it is then. 422 for a "
    "bad name or payload, 409 if the job already finished (nothing is stored).",
)
async def signal_job(
    job_id: JobId,
    name: Annotated[
        str,
        Path(
            description=f"The signal's name: 1 to {MAX_SIGNAL_NAME} letters, digits and "
            "_ . : - (not starting with . : -).",
            json_schema_extra={"pattern": f"^{SIGNAL_NAME.pattern}$"},
        ),
    ],
    request: Request,
    payload: Annotated[Any, Body(description="The signal's payload: any JSON.")] = None,
) -> JobOut:
    job = await _queue(request).signal(job_id, name, payload)
    return JobOut.of(job, _redaction(request))
