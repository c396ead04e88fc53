"""Schedules (periodic jobs) over HTTP (admin: every write is).

    GET    /schedules               every schedule: next run, last run, last outcome
    POST   /schedules               create a runtime schedule (201; 409 when the
                                    name is taken, by code or at run time)
    PATCH  /schedules/{name}        change some fields of a runtime schedule
                                    (409 for one declared in code)
    DELETE /schedules/{name}        delete a schedule; its jobs stay
    POST   /schedules/{name}/enable, /disable    switch it on or off
    POST   /schedules/{name}/run    enqueue one job now (201; 200 with the job
                                    already enqueued by the same request within
                                    the same second)

Schedules are declared in workers' code (TaskRegistry.periodic,
``@task(cron=...)``) or created here (core/runtime_schedules.py says how the
two share the names). Bodies are judged by ``Schedule.create``, as in the
library and the command line: a bad value is a 422 naming it, and nothing is
written.
"""

# No "from __future__ import annotations": FastAPI reads the route signatures
# at run time.

import dataclasses
from datetime import datetime
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from ..core import schedules
from ..core.errors import InvalidSchedule, ScheduleNotFound
from ..core.flows import Flow
from ..core.jobs import JobState
from ..core.redaction import Redaction
from ..core.schedules import Origin, ScheduleRecord, Status
from ..core.ticks import CatchUp
from ..queue import AsyncQueue
from .http_errors import ERROR_RESPONSES
from .models import TASK_PATTERN, ErrorBody, JobOut

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
    last_run_at: datetime | None = Field(
        description="When its last job was enqueued (a tick, or a run now)."
    )
    last_job_id: int | None
    last_job_state: JobState | None = Field(
        description="The state of its last job (the last outcome); null once the job was pruned."
    )
    retired_at: datetime | None
    origin: Origin = Field(
        description="code: declared in a worker's code (change it there); runtime: created "
        "over HTTP, on the command line or by Queue.create_schedule."
    )
    priority: int
    max_attempts: int | None = Field(description="Null: the firing worker's default.")
    timeout_seconds: float | None

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


# -- runtime schedules -----------------------------------------------------------------

_VALUE = "Judged by Schedule.create, as in the library and the command line."
_WRITE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    404: {"model": ErrorBody, "description": "No schedule has this name."},
    409: {
        "model": ErrorBody,
        "description": "The name is taken (create), or the schedule is declared in a "
        "worker's code (change).",
    },
}


class _Fields(BaseModel):
    """The fields of a schedule; values are judged by Schedule.create."""

    model_config = ConfigDict(extra="forbid")

    task: Any = Field(None, description="The task each job runs (default: the name).")
    cron: Any = Field(
        None, description="A cron expression (5 fields, or 6 with seconds first); or every."
    )
    every: Any = Field(None, description="Every N whole seconds (from 1970 UTC); or cron.")
    tz: Any = Field(None, description="The IANA zone of cron (default UTC).")
    payload: Any = Field(None, description="Each job's payload (a JSON object).")
    queue: Any = Field("default", description=_VALUE)
    priority: Any = Field(0, description=_VALUE)
    max_attempts: Any = Field(None, description="Null: the firing worker's default.")
    timeout: Any = Field(None, description="Each job's timeout in seconds.")
    catch_up: Any = Field("last", description="none, last or all: ticks missed while down.")
    catch_up_limit: Any = Field(100, description="The most ticks caught up with all.")

    def given(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class ScheduleCreate(_Fields):
    """A runtime schedule to create."""

    name: Any = Field(description="Its name (as a task name); unique among all schedules.")
    enabled: Any = Field(True, description="false: created switched off.")


class ScheduleChange(_Fields):
    """The fields to change (at least one); the others stay."""


def _redaction(request: Request) -> Redaction:
    redaction: Redaction = request.app.state.redaction
    return redaction


@router.post(
    "",
    status_code=201,
    response_model=ScheduleOut,
    responses=_WRITE_RESPONSES,
    summary="Create a runtime schedule",
    description="It starts at its first tick after now and fires with the schedules declared "
    "in code (same scheduler, same exactly-once keys). 409 if any schedule has the name; "
    "the task need not be handled by a running worker yet.",
)
async def create_schedule(body: ScheduleCreate, request: Request) -> ScheduleOut:
    fields = body.given()
    name = fields.pop("name")
    record = await _queue(request).create_schedule(name, **fields)
    return ScheduleOut.of(record)


@router.patch(
    "/{name}",
    response_model=ScheduleOut,
    responses=_WRITE_RESPONSES,
    summary="Change a runtime schedule",
    description="A JSON merge patch: each field given changes, the others stay (a new cron "
    "or every replaces the timing). A changed timing starts from its first tick after now. "
    "422 with no field; 409 for a schedule declared in code.",
)
async def update_schedule(
    name: ScheduleName, body: ScheduleChange, request: Request
) -> ScheduleOut:
    changes = body.given()
    if not changes:
        raise InvalidSchedule(name, "body", "give at least one field to change")
    return ScheduleOut.of(await _queue(request).update_schedule(name, **changes))


@router.post(
    "/{name}/run",
    status_code=201,
    response_model=JobOut,
    responses={
        200: {
            "model": JobOut,
            "description": "The same request within the same second enqueued this job already; "
            "nothing was written.",
        },
        **_WRITE_RESPONSES,
    },
    summary="Run a schedule now",
    description="Enqueue one job of the schedule now (enabled or not), with the key "
    "pgqueue:schedule-now:NAME@SECOND: it becomes the schedule's last run; its next tick "
    "does not move.",
)
async def run_schedule_now(name: ScheduleName, request: Request, response: Response) -> JobOut:
    job = await _queue(request).run_schedule_now(name)
    if job.duplicate:
        response.status_code = 200
    return JobOut.of(job, _redaction(request))
