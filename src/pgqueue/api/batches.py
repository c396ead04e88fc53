"""Batches over HTTP: ``POST /batches`` (open one, with its callback jobs),
``GET /batches/{id}`` (its state, counters and jobs by state),
``POST /batches/{id}/close``. Jobs join a batch by ``POST /jobs`` (or
``/jobs/batch``) with its id in ``batch``: an unknown batch is a 404 and a
closed one a 409, both naming the field, and nothing is written. The writes
need an admin token (the middleware's rule for every POST)."""

# No "from __future__ import annotations": FastAPI reads the route signature
# at run time.

from datetime import datetime
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from ..core.batches import Batch, BatchState
from ..core.jobs import JobState
from ..queue import AsyncQueue
from .http_errors import documented_errors
from .models import EnqueueRequest

__all__ = ["BatchOpenRequest", "BatchOut", "router"]

router = APIRouter(tags=["batches"])


class BatchOpenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    on_success: EnqueueRequest | None = Field(
        default=None, description="The job to enqueue once every job of the batch succeeded."
    )
    on_death: EnqueueRequest | None = Field(
        default=None, description="The job to enqueue once they ended, when at least one died."
    )
    on_finish: EnqueueRequest | None = Field(
        default=None, description="The job to enqueue once they ended, however they ended."
    )
    metadata: Any = Field(
        default=None,
        description="A JSON object given to the callbacks (their metadata's batch.metadata).",
    )


class BatchOut(BaseModel):
    id: UUID
    state: BatchState = Field(
        description="open (jobs may join), closed (no more; the callbacks wait for its last "
        "job), finished (its callbacks were enqueued)."
    )
    total: int = Field(description="How many jobs joined it.")
    pending: int = Field(description="How many of them have not ended.")
    succeeded: int
    dead: int
    cancelled: int
    counts: dict[JobState, int] = Field(
        description="Its jobs by state now (pruned jobs are not counted here; they are above)."
    )
    callbacks: dict[str, Any] = Field(description="The callback jobs' fields, by when they run.")
    callback_jobs: dict[str, int] = Field(
        description="The ids of the callback jobs enqueued (once finished), by when they ran."
    )
    metadata: Any = None
    created_at: datetime | None = None
    closed_at: datetime | None = None
    finished_at: datetime | None = None

    @classmethod
    def of(cls, batch: Batch) -> "BatchOut":
        return cls(
            id=batch.id,
            state=batch.state,
            total=batch.total,
            pending=batch.pending,
            succeeded=batch.succeeded,
            dead=batch.dead,
            cancelled=batch.cancelled,
            counts={JobState(state): n for state, n in batch.counts.items()},
            callbacks=batch.callbacks,
            callback_jobs=batch.callback_jobs,
            metadata=batch.metadata,
            created_at=batch.created_at,
            closed_at=batch.closed_at,
            finished_at=batch.finished_at,
        )


def _queue(request: Request) -> AsyncQueue:
    queue: AsyncQueue = request.app.state.queue
    return queue


@router.post(
    "/batches",
    status_code=201,
    response_model=BatchOut,
    responses=documented_errors(403),
    summary="Open a batch, with the jobs to enqueue once it is closed and its jobs ended",
    description="Jobs join it by POST /jobs with its id in `batch`, until POST "
    "/batches/{id}/close. Each callback is a job's fields (no idempotency key, run_at, "
    "depends_on or batch); a bad one is a 422 naming it (on_success.priority), and nothing "
    "is written. Admin tokens only.",
)
async def open_batch(body: BatchOpenRequest, request: Request) -> BatchOut:
    batch = await _queue(request).open_batch(
        on_success=body.on_success.fields() if body.on_success else None,
        on_death=body.on_death.fields() if body.on_death else None,
        on_finish=body.on_finish.fields() if body.on_finish else None,
        metadata=body.metadata,
    )
    return BatchOut.of(batch)


@router.get(
    "/batches/{batch_id}",
    response_model=BatchOut,
    responses=documented_errors(404),
    summary="A batch: its state, counters, jobs by state and callback jobs",
)
async def get_batch(batch_id: str, request: Request) -> BatchOut:
    return BatchOut.of(await _queue(request).get_batch(batch_id))


@router.post(
    "/batches/{batch_id}/close",
    response_model=BatchOut,
    responses=documented_errors(403, 404),
    summary="Close a batch: no more jobs may join it",
    description="If every job of it has ended, its callbacks are enqueued now; otherwise "
    "when its last job ends. Closing a closed batch changes nothing. Admin tokens only.",
)
async def close_batch(batch_id: str, request: Request) -> BatchOut:
    return BatchOut.of(await _queue(request).close_batch(batch_id))
