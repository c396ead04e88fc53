"""GET /queues/{name}/history: a queue's last minutes, one point each, from
the per-minute snapshots of its counters (history.py), never from the jobs.
Read access, like GET /queues."""

# No "from __future__ import annotations": FastAPI reads the signatures at run time.

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field

from ..core import history
from .http_errors import documented_errors
from .models import QUEUE_PATTERN

__all__ = ["router"]

router = APIRouter(tags=["queues"])


class PointOut(BaseModel):
    minute: str = Field(
        description="The minute's start, ISO 8601 in UTC (database clock): "
        "2026-11-30T19:00:00+00:00."
    )
    enqueued: int = Field(description="Jobs enqueued.")
    succeeded: int
    failed: int = Field(description="Failed attempts (a lease that expired is one).")
    dead: int
    started: int = Field(description="Attempts started (claims).")
    latency_p50: float | None = Field(
        description="Median wait from runnable to started, in seconds, estimated from the "
        "start-latency histogram; null: nothing started."
    )
    latency_p95: float | None = Field(description="95th percentile of the same.")


class HistoryOut(BaseModel):
    queue: str
    minutes: int
    points: list[PointOut] = Field(
        description="One per minute, oldest first; the last is the current minute so far. "
        "A minute in which no worker ran has zeros: what happened then counts in the last "
        "minute before it that a worker snapshotted."
    )


@router.get(
    "/queues/{name}/history",
    response_model=HistoryOut,
    responses=documented_errors(),
    summary="A queue's last minutes: enqueued, succeeded, failed, dead, started, latency",
)
async def queue_history(
    request: Request,
    name: Annotated[str, Path(pattern=QUEUE_PATTERN, description="The queue's name.")],
    minutes: Annotated[
        int,
        Query(ge=1, le=history.MAX_MINUTES, description="How many minutes, the current one last."),
    ] = 60,
) -> HistoryOut:
    queue = request.app.state.queue
    found = await queue.run(
        history.queue_history(name, minutes, queue.settings.latency_buckets), transaction=True
    )
    return HistoryOut.model_validate(found.to_dict())
