"""Schedules (periodic jobs) over HTTP: list them, switch them on and off,
delete one. Schedules are declared in workers' code (TaskRegistry.periodic,
``@task(cron=...)``), not over HTTP; see pgqueue/schedules.py."""

# No "from __future__ import annotations": FastAPI reads the route signatures
# at run time.

import dataclasses
from datetime import datetime
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import BaseModel, Field

from ..core import schedules
from ..core.errors import InvalidSchedule, ScheduleNotFound
from ..core.flows import Flow
from ..core.jobs import JobState
from ..core.schedules import ScheduleRecord, Status
from ..core.ticks import CatchUp
from ..queue import AsyncQueue
from .http_errors import ERROR_RESPONSES
from .models import TASK_PATTERN, ErrorBody

__all__ = ["router"]

T = TypeVar("T")

router = APIRouter(prefix="/schedules", tags=["schedules"])

ScheduleName = Annotated[str, Path(pattern=TASK_PATTERN, description="A schedule's name.")]
_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    404: {"model": ErrorBody, "description": "No schedule has this name."},
    409: {"model": ErrorBody, "description": "This server cannot plan the schedule's timing."},
}


class ScheduleOut(BaseModel):
    """A schedule, as stored (times from the database's clock)."""

    name: str
    status: Status = Field(
        description="retired: a worker that handles its task started without declaring it "
        "(it was removed from the code); it fires no more until declared again."
    )
    enabled: bool
    task: str
    queue: str
    payload: dict[str, Any]
    spec: str = Field(description="The cron expression, or `every N s`.")
    cron: str | None
    every_seconds: int | None
    tz: str
    catch_up: CatchUp
    catch_up_limit: int
    next_run_at: datetime | None = Field(description="The next tick; null when none is planned.")
    last_tick: datetime | None = Field(description="The newest tick enqueued.")
    last_run_at: datetime | None = Field(description="When that tick was enqueued.")
    last_job_id: int | None
    last_job_state: JobState | None = Field(description="Null once the job was pruned.")
    retired_at: datetime | None

    @classmethod
    def of(cls, record: ScheduleRecord) -> "ScheduleOut":
        return cls(status=record.status, spec=record.spec, **dataclasses.asdict(record))


class ScheduleList(BaseModel):
    schedules: list[ScheduleOut]


def _queue(request: Request) -> AsyncQueue:
    queue: AsyncQueue = request.app.state.queue
    return queue


async def _drive(request: Request, flow: Flow[T]) -> T:
    """Drive a flow; an unknown name is a 404, and a timing this server cannot
    plan (a zone its tz database lacks) a 409."""
    try:
        return await _queue(request).run(flow)
    except ScheduleNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except InvalidSchedule as exc:
        raise HTTPException(409, str(exc)) from None


@router.get(
    "",
    response_model=ScheduleList,
    responses=ERROR_RESPONSES,
    summary="Every schedule: next run, last run, last job, enabled",
)
async def list_schedules(request: Request) -> ScheduleList:
    records = await _drive(request, schedules.list_schedules())
    return ScheduleList(schedules=[ScheduleOut.of(r) for r in records])


def _switch_route(enabled: bool, summary: str, description: str) -> None:
    """POST /schedules/{name}/enable or /disable."""
    verb = "enable" if enabled else "disable"

    @router.post(
        f"/{{name}}/{verb}",
        response_model=ScheduleOut,
        responses=_RESPONSES,
        summary=summary,
        description=description,
        name=f"{verb}_schedule",
    )
    async def switch(request: Request, name: ScheduleName) -> ScheduleOut:
        return ScheduleOut.of(await _drive(request, schedules.set_enabled(name, enabled)))


_switch_route(
    True,
    "Switch a schedule on",
    "It starts from its first tick after now: the ticks of the time it was off are not caught up.",
)
_switch_route(
    False,
    "Switch a schedule off",
    "No scheduler enqueues its ticks until it is switched on again; worker restarts keep it off.",
)


@router.delete(
    "/{name}",
    status_code=204,
    response_class=Response,
    responses=_RESPONSES,
    summary="Delete a schedule",
    description="For a retired schedule. One that a worker's code still declares is "
    "created again when that worker starts. Its jobs stay.",
)
async def delete_schedule(request: Request, name: ScheduleName) -> Response:
    await _drive(request, schedules.delete(name))
    return Response(status_code=204)
