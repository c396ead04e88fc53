"""GET /dead-letters: dead jobs grouped by task and kind of error (its first
line, ids and numbers replaced), the biggest group
first, each with the filter that a bulk action (POST /jobs/bulk/retry or
/delete) takes to act on the whole group. Bounded: the newest dead jobs are
grouped (``scanned`` says how many), and ``limit`` groups returned."""

# No "from __future__ import annotations": FastAPI reads the signatures at run time.

from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from ..core import bulk
from .http_errors import documented_errors

__all__ = ["router"]

router = APIRouter(tags=["jobs"])


class DeadGroupOut(BaseModel):
    task: str
    error: str = Field(
        description="The kind of the jobs' last error: its first line with ids replaced "
        f"by <id> and numbers by <n>, cut to {bulk.DEAD_ERROR_CHARS} characters (empty: no "
        "error recorded)."
    )
    jobs: int
    queues: list[str]
    first_at: datetime = Field(description="When the group's first job died.")
    last_at: datetime = Field(description="When its latest job died.")
    latest_id: int = Field(description="Its latest job, to look at one.")
    filter: dict[str, Any] = Field(
        description="The body of a bulk action on the group (add dry_run: true to count "
        "first): the task's dead jobs whose error is of this kind."
    )


class DeadLettersOut(BaseModel):
    groups: list[DeadGroupOut]
    scanned: int = Field(
        description=f"Dead jobs grouped: every one, or the newest {bulk.DEAD_SCAN:,}."
    )
    group_count: int = Field(description="Groups among them (more than listed: raise limit).")


@router.get(
    "/dead-letters",
    response_model=DeadLettersOut,
    responses=documented_errors(),
    summary="Dead jobs grouped by task and error, the biggest group first",
)
async def dead_letters(
    request: Request, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> DeadLettersOut:
    found = await request.app.state.queue.run(bulk.dead_letters(limit=limit))
    return DeadLettersOut(
        groups=[DeadGroupOut(**asdict(g), filter=_body(g.where())) for g in found.groups],
        scanned=found.scanned,
        group_count=found.group_count,
    )


def _body(where: bulk.JobFilter) -> dict[str, Any]:
    return {
        name: getattr(where, name)
        for name in ("task", "state", "error_kind")
        if getattr(where, name) is not None
    }
