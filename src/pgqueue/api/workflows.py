"""Workflows over HTTP: ``POST /workflows`` (jobs named by the client, with
the names of the jobs each depends on), ``GET /workflows/{id}`` (every job
with its state, and the edges), ``POST /workflows/{id}/cancel`` and
``/retry``. The writes need an admin token (the middleware's rule for every
POST). A bad workflow (a cycle, an unknown or repeated name, a bad job
field) is refused with 422 naming the field, and nothing is written: the
jobs go in one transaction, as ``/jobs/batch``'s do."""

# No "from __future__ import annotations": FastAPI reads the route signature
# at run time.

from typing import TYPE_CHECKING, Any, Literal
from uuid import UUID

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, create_model

from ..core.dependencies import WorkflowJobs
from ..core.job_spec import JOB_FIELDS
from ..core.jobs import JobState
from ..core.redaction import Redaction
from ..core.workflows import MAX_WORKFLOW_JOBS
from ..queue import AsyncQueue
from .http_errors import documented_errors
from .models import JobOut, field_schema

__all__ = ["WorkflowOut", "WorkflowRequest", "router"]

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


@router.get(
    "/workflows/{workflow_id}",
    response_model=WorkflowOut,
    responses=documented_errors(404),
    summary="A workflow: every job with its state, and the edges",
)
async def get_workflow(workflow_id: str, request: Request) -> WorkflowOut:
    queue: AsyncQueue = request.app.state.queue
    return WorkflowOut.of(await queue.workflow(workflow_id), request.app.state.redaction)


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
    return WorkflowOut.of(await queue.workflow(workflow_id, action), request.app.state.redaction)
