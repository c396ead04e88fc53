"""GET /workers: the workers registry (which worker processes are alive,
where, holding what, and which of them stalled)."""

# No "from __future__ import annotations": FastAPI reads the signatures at run time.

from datetime import datetime

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from ..core import workers
from ..core.workers import WorkerRow
from .http_errors import documented_errors

__all__ = ["router"]

router = APIRouter(tags=["monitoring"])


class WorkerOut(BaseModel):
    name: str
    host: str
    pid: int
    version: str
    queues: list[str] | None = Field(description="The queues it claims from; null: every queue.")
    concurrency: int
    started_at: datetime
    last_seen_at: datetime = Field(description="Its last heartbeat (database clock).")
    last_seen_seconds: float
    alive: bool = Field(
        description=f"It heartbeated within the last {workers.EXPIRY_HEARTBEATS} heartbeat "
        "intervals; a killed worker's row stays, not alive, until maintenance prunes it."
    )
    stalled: bool = Field(
        description="Alive with free slots, yet it has not claimed since a job of its queues "
        f"became runnable {workers.STALL_SECONDS:g} s ago or more."
    )
    held: int = Field(description="Jobs it holds a lease on (running, or being acked).")
    running: int
    hung: int = Field(description="Slots held by sync handlers that run on past their job.")
    claimed: int = Field(description="Jobs it claimed since it started.")
    last_claim_at: datetime | None

    @classmethod
    def of(cls, row: WorkerRow) -> "WorkerOut":
        return cls(**{name: getattr(row, name) for name in cls.model_fields})


class WorkerList(BaseModel):
    workers: list[WorkerOut]


@router.get(
    "/workers",
    response_model=WorkerList,
    responses=documented_errors(),
    summary="The workers registry: every worker process, alive or recently gone",
)
async def list_workers(request: Request) -> WorkerList:
    rows = await request.app.state.queue.run(workers.list_workers())
    return WorkerList(workers=[WorkerOut.of(row) for row in rows])
