"""Request and response bodies of the HTTP API.

The request model of a job is built from ``jobs.JOB_FIELDS``, the one shape
of a job: the same field names (and the aliases ``delay`` and ``timeout``),
and each field's JSON Schema is the JSON Schema of the rule that checks it.
The checking itself is ``JobSpec.from_fields``, the validator the library
and the command line use too: the model only refuses what is not a job at
all (not an object, no ``task``, an unknown field), so that a value is judged
the same way on every surface. It is as strict as the schema says: numbers
are not read from strings, and booleans are not integers.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, create_model

from ..core.job_spec import JOB_FIELDS, JobField
from ..core.jobs import MAX_ATTEMPT_ERRORS, QUEUE_NAME, TASK_NAME, Job, JobState
from ..core.key_objectives import KeyObjective
from ..core.queue_controls import LIMITS, QueueControls
from ..core.redaction import Redaction

__all__ = [
    "AllKeyObjectives",
    "BatchEnqueued",
    "EnqueueOutcome",
    "EnqueueRequest",
    "EnqueuedJobOut",
    "ErrorBody",
    "Health",
    "JobList",
    "JobOut",
    "JobSummary",
    "KeyObjectiveList",
    "KeyObjectiveOut",
    "Problem",
    "QueueControlsOut",
    "QueueLimits",
    "QueueList",
    "QueueOut",
    "batch_request_model",
    "enqueue_outcome",
    "field_schema",
]

MAX_JOB_ID = 2**63 - 1
TASK_PATTERN = f"^{TASK_NAME.pattern}$"
QUEUE_PATTERN = f"^{QUEUE_NAME.pattern}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Job(_Strict):
    def fields(self) -> dict[str, Any]:
        """The fields the request gave, for ``AsyncQueue.enqueue`` / ``enqueue_many``."""
        return self.model_dump(exclude_unset=True)


def field_schema(job_field: JobField, *, alias: bool = False) -> Any:
    """A pydantic Field for a JobField: its rule's JSON Schema (a value is
    judged by the rule, not by pydantic), its description and its default.

    The schema shows a default only for a field that cannot be null (queue,
    priority...): a client generated from the OpenAPI document sends every
    default the schema shows, and a null field or an alias sent with its
    default would be a field given twice (``delay`` with ``delay_seconds``,
    ``delay_seconds`` with ``run_at``). Their default is in the description
    (tests/integration/api/test_api_generated_client.py)."""
    schema = job_field.rule.json_schema()
    description = job_field.description
    if alias:
        description = f"Alias of `{job_field.name}`; give one or the other. {description}"
    shows_default = not (job_field.nullable or alias or job_field.required)
    if job_field.nullable:
        schema = {"anyOf": [schema, {"type": "null"}]}
        if job_field.default is not None:
            description = f"{description} Default: {json.dumps(job_field.default)}."

    def extra(shown: dict[str, Any]) -> None:
        shown.update(schema)
        if not shows_default:
            shown.pop("default", None)

    return Field(
        default=... if job_field.required else job_field.default,
        description=description,
        json_schema_extra=extra,
    )


def _job_model() -> type[_Job]:
    # Any: the values are judged by JobSpec.from_fields, not by pydantic.
    fields: dict[str, Any] = {f.name: (Any, field_schema(f)) for f in JOB_FIELDS}
    fields |= {f.alias: (Any, field_schema(f, alias=True)) for f in JOB_FIELDS if f.alias}
    return create_model("EnqueueRequest", __base__=_Job, __doc__="One job to add.", **fields)


if TYPE_CHECKING:  # the model is made at import time; checkers see its base
    EnqueueRequest = _Job
else:
    EnqueueRequest = _job_model()


def batch_request_model(max_batch: int) -> type[BaseModel]:
    """The body of POST /jobs/batch; its size limit is a setting, so the
    model (and the schema that documents it) is made per app."""
    return create_model(
        "BatchEnqueueRequest",
        __base__=_Strict,
        jobs=(list[EnqueueRequest], Field(min_length=1, max_length=max_batch)),
    )


class JobSummary(BaseModel):
    """A job without the fields that can be large: what GET /jobs?fields=summary lists."""

    id: int
    queue: str
    task: str
    state: JobState
    priority: int
    attempts: int
    max_attempts: int
    snoozes: int = Field(description="Times its handler asked to run it later (Snooze).")
    run_at: datetime
    timeout_seconds: float | None
    idempotency_key: str | None
    unique_scope: str | None = Field(
        description="While which states the job holds its key (null: it has none)."
    )
    concurrency_key: str | None
    worker: str | None
    lease_expires_at: datetime | None
    enqueued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    workflow_id: UUID | None = Field(default=None, description="The workflow it belongs to.")
    batch_id: UUID | None = Field(default=None, description="The batch it joined.")
    depends_on: list[int] | None = Field(
        default=None, description="The jobs it waits for (their results are its job.parents)."
    )
    progress_fraction: float | None = Field(
        default=None,
        description="How far its handler said it was (job.progress()), from 0 to 1; null "
        "until it reports. Kept after the job ends: its last report.",
    )
    progress_at: datetime | None = Field(
        default=None, description="When its worker wrote that report (database clock)."
    )


class AttemptErrorOut(BaseModel):
    """One failed attempt."""

    attempt: int = Field(description="Which attempt (an operator's retry numbers them from 1).")
    error: str = Field(
        description="The exception and the head of its traceback (or why the "
        "lease expired), its first 2,000 characters."
    )
    worker: str | None = Field(description="The worker that held the attempt.")
    at: datetime = Field(description="When it failed (database clock).")


class JobOut(JobSummary):
    """A job as the API shows it."""

    # Any, not an object: a row written by SQL may hold any JSON value, and
    # every read shows it (jobs.py: what pgqueue itself writes).
    payload: Any = Field(
        description="The job's arguments: the JSON object it was enqueued with (a row "
        "written outside pgqueue may hold another JSON value, shown as it is)."
    )
    last_error: str | None
    errors: list[AttemptErrorOut] = Field(
        description=f"Its failed attempts, oldest first: the last {MAX_ATTEMPT_ERRORS}."
    )
    result: Any = Field(description="What the handler returned (any JSON), once succeeded.")
    metadata: Any = Field(
        default=None,
        description="Facts about the job given at enqueue, a JSON object (null: none); the "
        "key otel holds the trace context of its enqueuer when tracing is on.",
    )
    progress_info: Any = Field(
        default=None, description="The JSON its handler gave with that report (null: none)."
    )
    last_checkpoint: Any = Field(
        default=None,
        description="The JSON its handler saved last with job.checkpoint() (null: none): "
        "where a retry carries on from (docs/howto/durable-steps.md).",
    )

    @classmethod
    def of(cls, job: Job, redaction: Redaction) -> JobOut:
        """The job as people may see it: its payload's redacted fields
        hidden, and its errors' tracebacks unless ``redaction`` shows them."""
        return cls(
            id=job.id,
            queue=job.queue,
            task=job.task,
            state=job.state,
            payload=redaction.payload(job.task, job.payload),
            priority=job.priority,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            snoozes=job.snoozes,
            run_at=job.run_at,
            timeout_seconds=job.timeout_seconds,
            idempotency_key=job.idempotency_key,
            unique_scope=job.unique_scope,
            concurrency_key=job.concurrency_key,
            worker=job.worker,
            lease_expires_at=job.lease_expires_at,
            last_error=redaction.error(job.last_error),
            errors=[
                AttemptErrorOut(**{**dataclasses.asdict(e), "error": redaction.error(e.error)})
                for e in job.errors
            ],
            result=job.result,
            enqueued_at=job.enqueued_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            workflow_id=job.workflow_id,
            batch_id=job.batch_id,
            depends_on=job.depends_on,
            metadata=job.metadata,
            progress_fraction=job.progress_fraction,
            progress_info=job.progress_info,
            progress_at=job.progress_at,
            last_checkpoint=job.last_checkpoint,
        )


EnqueueOutcome = Literal["created", "existing", "replaced", "extended"]
_OUTCOME = (
    "created: this request added the job; existing: its key already belonged to job `id`, "
    "and nothing was written; replaced, extended: its key belonged to job `id`, still "
    "waiting, and its on_conflict changed that job (docs/howto/unique-and-bulk.md)."
)


def enqueue_outcome(created: bool, debounced: str | None) -> EnqueueOutcome:
    """What an enqueue did, as the API says it."""
    if created:
        return "created"
    if debounced == "replaced":
        return "replaced"
    return "extended" if debounced == "extended" else "existing"


class EnqueuedJobOut(JobOut):
    """The job a POST /jobs added, or the one that held its key."""

    outcome: EnqueueOutcome = Field(description=_OUTCOME)


class BatchItem(BaseModel):
    id: int
    outcome: EnqueueOutcome = Field(description=_OUTCOME)


class BatchEnqueued(BaseModel):
    jobs: list[BatchItem] = Field(description="One entry per job of the request, in order.")


class JobList(BaseModel):
    jobs: list[JobOut | JobSummary] = Field(
        description="Every field, or with fields=summary, all but payload, result, last_error, "
        "errors, metadata, progress_info and last_checkpoint."
    )
    next_cursor: int | None = Field(
        description="Pass as `cursor` to get the next page; null on the last page."
    )


class QueueJobs(BaseModel):
    queued: int = Field(description="Runnable now.")
    scheduled: int = Field(description="Waiting for their run_at (delayed or backing off).")
    running: int
    waiting: int = Field(description="Waiting for the jobs they depend on (workflows).")


class QueueTotals(BaseModel):
    """Since the queue was first used; retention pruning does not lower them."""

    succeeded: int
    failed_attempts: int
    dead: int
    cancelled: int
    snoozed: int = Field(description="Snoozes handlers asked for: neither failures nor attempts.")


class QueueLimits(BaseModel):
    """A queue's limits; null: no such limit."""

    concurrency_limit: int | None = Field(description=LIMITS["concurrency_limit"][1])
    concurrency_limit_per_key: int | None = Field(
        description=LIMITS["concurrency_limit_per_key"][1]
    )
    rate_limit: int | None = Field(description=LIMITS["rate_limit"][1])
    rate_limit_per_key: int | None = Field(description=LIMITS["rate_limit_per_key"][1])
    rate_period_seconds: float | None = Field(description=LIMITS["rate_period_seconds"][1])
    fair: bool | None = Field(default=None, description=LIMITS["fair"][1])
    max_start_lag_seconds: float | None = Field(
        default=None, description=LIMITS["max_start_lag_seconds"][1]
    )


class QueueControlsOut(BaseModel):
    """A queue's pause and limits."""

    queue: str
    paused: bool = Field(description="No job of the queue starts; running jobs finish.")
    limits: QueueLimits
    updated_at: datetime | None = Field(description="When they last changed.")

    @classmethod
    def of(cls, controls: QueueControls) -> QueueControlsOut:
        return cls(
            queue=controls.queue,
            paused=controls.paused,
            limits=QueueLimits(**controls.limits()),
            updated_at=controls.updated_at,
        )


class KeyObjectiveOut(BaseModel):
    """One concurrency_key's latency objective in a fair queue."""

    queue: str
    key: str
    # (null, all three: the objective was removed.)
    max_start_lag_seconds: float | None = Field(
        default=None,
        description="The longest the key's runnable jobs should wait to start (null: removed).",
    )
    wait_seconds: float | None = Field(
        default=None,
        description="How long the key's next job has waited (0: none is runnable; null: no "
        "objective).",
    )
    shortfall_seconds: float | None = Field(
        default=None,
        description="How far that wait is past the objective (0: within it; null: no objective).",
    )

    @classmethod
    def of(cls, objective: KeyObjective) -> KeyObjectiveOut:
        return cls(**objective.to_dict())


class KeyObjectiveList(BaseModel):
    queue: str
    keys: list[KeyObjectiveOut]


class AllKeyObjectives(BaseModel):
    keys: list[KeyObjectiveOut] = Field(description="Every queue's, by queue and key.")


class QueueOut(BaseModel):
    queue: str
    jobs: QueueJobs
    totals: QueueTotals
    oldest_runnable_seconds: float = Field(
        description="Age of the oldest runnable job (0 when none is waiting)."
    )
    start_lag_shortfall_seconds: float | None = Field(
        default=None,
        description="How far the oldest runnable job's wait is past the queue's latency "
        "objective, max_start_lag_seconds (0: within it; null: the queue has none).",
    )
    paused: bool = Field(description="No job of the queue starts; running jobs finish.")
    limits: QueueLimits


class QueueList(BaseModel):
    queues: list[QueueOut]


class Health(BaseModel):
    status: Literal["ok"]


class Problem(BaseModel):
    field: str
    problem: str


class ErrorBody(BaseModel):
    """Every error the API returns has this shape."""

    error: str = Field(description="A stable code: invalid_input, malformed_json, not_found, ...")
    message: str
    field: str | None = Field(default=None, description="The first offending field, if any.")
    problems: list[Problem] = Field(default_factory=list)
    job_ids: list[int] | None = Field(
        default=None,
        description="Only with enqueue_outcome_unknown: the ids the enqueue reserved; its jobs "
        "may exist under them (GET /jobs/{id}).",
    )
