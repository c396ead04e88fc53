"""Workflows over HTTP: ``POST /workflows`` (jobs named by the client, with
the names of the jobs each depends on), ``GET /workflows/{id}`` (every job
with its state, and the edges), ``POST /workflows/{id}/cancel`` and
``/retry``. The writes need an admin token (the middleware's rule for every
POST). ``GET /workflows`` lists them newest first, each with its jobs
counted by state, a page at a time. A bad workflow (a cycle, an unknown or repeated name, a bad job
field) is refused with 422 naming the field, and nothing is written: the
jobs go in one transaction, as ``/jobs/batch``'s do."""

# No "from __future__ import annotations": FastAPI reads the route signature
# at run time.

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, create_model

from ..core.dependencies import WorkflowJobs
from ..core.job_spec import JOB_FIELDS
from ..core.jobs import JobState
from ..core.redaction import Redaction
from ..core.workflows import LIST_STATES, MAX_LIST, MAX_WORKFLOW_JOBS, WorkflowSummary
from ..queue import AsyncQueue
from .access import shown_to
from .http_errors import documented_errors
from .models import MAX_JOB_ID, JobOut, field_schema

__all__ = ["WorkflowList", "WorkflowOut", "WorkflowRequest", "router"]

router = APIRouter(tags=["workflows"])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _job_model() -> type[_Strict]:
    # Any: the values are judged by JobSpec.from_fields and workflows.by_name.
    fields: dict[str, Any] = {
        f.name: (Any, field_schema(f)) for f in JOB_FIELDS if f.name not in ("depends_on", "batch")
    }
    fields |= {f.alias: (Any, field_schema(f, alias=True)) for f in JOB_FIELDS if f.alias}
    return create_model(
        "WorkflowJobRequest",
        __base__=_Strict,
        __doc__="One job of a workflow: a job's fields, its name, and the names it depends on.",
        name=(Any, Field(description="The job's name in this request (1 to 200 characters).")),
        depends_on=(
            Any,
            Field(
                default=None,
                description="Names of jobs of this workflow that this one waits for; its "
                "handler gets their results as job.parents, in this order.",
                json_schema_extra={"type": "array", "items": {"type": "string"}},
            ),
        ),
        **fields,
    )


if TYPE_CHECKING:  # the model is made at import time; checkers see its base
    WorkflowJobRequest = _Strict
else:
    WorkflowJobRequest = _job_model()


class WorkflowRequest(_Strict):
    jobs: list[WorkflowJobRequest] = Field(min_length=1, max_length=MAX_WORKFLOW_JOBS)


class Edge(BaseModel):
    parent: int
    child: int = Field(description="Waits for `parent`.")


class WorkflowOut(BaseModel):
    workflow_id: UUID
    counts: dict[JobState, int] = Field(description="How many of its jobs are in each state.")
    jobs: list[JobOut] = Field(description="Every job of the workflow, in id order.")
    edges: list[Edge]

    @classmethod
    def of(cls, workflow: WorkflowJobs, redaction: Redaction) -> "WorkflowOut":
        return cls(
            workflow_id=workflow.id,
            counts={JobState(state): n for state, n in workflow.counts().items()},
            jobs=[JobOut.of(job, redaction) for job in workflow.jobs],
            edges=[Edge(parent=p, child=c) for p, c in workflow.edges()],
        )


class CreatedJob(BaseModel):
    name: str
    id: int
    state: JobState = Field(description="waiting, queued, or cancelled (a dependency had failed).")


class WorkflowCreated(BaseModel):
    workflow_id: UUID
    jobs: list[CreatedJob] = Field(description="One entry per job of the request, in order.")


@router.post(
    "/workflows",
    status_code=201,
    response_model=WorkflowCreated,
    responses=documented_errors(403),
    summary="Enqueue a workflow: jobs and their dependencies, by name",
    description="All jobs in one transaction: a cycle, an unknown or repeated name or a bad "
    "field writes nothing (422 naming it, e.g. jobs[2].depends_on). Jobs of a workflow have "
    "no idempotency key. Admin tokens only.",
)
async def create_workflow(body: WorkflowRequest, request: Request) -> WorkflowCreated:
    queue: AsyncQueue = request.app.state.queue
    jobs = [job.model_dump(exclude_unset=True) for job in body.jobs]
    made = await queue.enqueue_workflow(jobs)
    return WorkflowCreated(
        workflow_id=made.id,
        jobs=[
            CreatedJob(name=fields["name"], id=job.id, state=job.state)
            for fields, job in zip(jobs, made.jobs, strict=True)
        ],
    )


class WorkflowListed(BaseModel):
    workflow_id: UUID
    jobs: int = Field(description="How many jobs it has (those pruned no longer count).")
    counts: dict[JobState, int] = Field(description="How many of its jobs are in each state.")
    finished: bool = Field(description="Every job ended: succeeded, dead or cancelled.")
    created_at: datetime = Field(description="When its first job (still kept) was enqueued.")
    last_finished_at: datetime | None = Field(description="When one of its jobs ended last.")
    first_task: str = Field(
        description="The task of its first job: a workflow has no name of its own."
    )

    @classmethod
    def of(cls, workflow: WorkflowSummary) -> "WorkflowListed":
        return cls(
            workflow_id=workflow.id,
            jobs=workflow.jobs,
            counts={JobState(state): n for state, n in workflow.counts.items()},
            finished=workflow.finished,
            created_at=workflow.created_at,
            last_finished_at=workflow.last_finished_at,
            first_task=workflow.first_task,
        )


class WorkflowList(BaseModel):
    workflows: list[WorkflowListed] = Field(description="Newest first.")
    next_cursor: int | None = Field(
        description="Pass it as cursor for the next page; null on the last page."
    )


@router.get(
    "/workflows",
    response_model=WorkflowList,
    responses=documented_errors(),
    summary="List workflows, newest first, with their jobs counted by state",
    description="Each page walks an index of the workflows (newest first) and reads each "
    "listed workflow's jobs once (a range of the jobs' primary key); a state filter reads "
    "the workflows it skips too.",
)
async def list_workflows(
    request: Request,
    state: Annotated[
        str | None,
        Query(
            description="running: a job not ended yet (waiting, queued or running); "
            "finished: every job ended; succeeded: every job succeeded; dead: a dead job; "
            "cancelled: a cancelled job.",
            json_schema_extra={"enum": list(LIST_STATES)},
        ),
    ] = None,
    cursor: Annotated[
        int | None,
        Query(
            ge=1,
            le=MAX_JOB_ID,
            description="next_cursor of the previous page (keyset: older workflows).",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 50,
) -> WorkflowList:
    queue: AsyncQueue = request.app.state.queue
    found = await queue.list_workflows(state=state, before=cursor, limit=limit)
    return WorkflowList(
        workflows=[WorkflowListed.of(workflow) for workflow in found],
        next_cursor=found[-1].first_job if len(found) == limit else None,
    )


@router.get(
    "/workflows/{workflow_id}",
    response_model=WorkflowOut,
    responses=documented_errors(404),
    summary="A workflow: every job with its state, and the edges",
)
async def get_workflow(workflow_id: str, request: Request) -> WorkflowOut:
    queue: AsyncQueue = request.app.state.queue
    return WorkflowOut.of(await queue.workflow(workflow_id), shown_to(request))


@router.post(
    "/workflows/{workflow_id}/{action}",
    response_model=WorkflowOut,
    responses=documented_errors(403, 404),
    summary="Cancel a workflow, or retry its failed steps",
    description="cancel: every job that has not ended (running jobs' leases are revoked and "
    "their handlers stopped); "
    "retry: its dead and cancelled jobs, with fresh budgets, each waiting again for those "
    "of its parents that run again. Admin tokens only.",
)
async def act_on_workflow(
    workflow_id: str, action: Literal["cancel", "retry"], request: Request
) -> WorkflowOut:
    queue: AsyncQueue = request.app.state.queue
    return WorkflowOut.of(await queue.workflow(workflow_id, action), shown_to(request))
