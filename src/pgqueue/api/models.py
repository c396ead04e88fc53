"""Request and response bodies of the HTTP API.

Requests are strict: unknown fields are refused, numbers are not read from
strings, booleans are not integers, and every limit of ``JobSpec.build`` is
repeated here so that it shows in the OpenAPI schema. ``JobSpec.build`` still
runs after these checks; the two agree, and the API maps its field names
(``delay`` -> ``delay_seconds``, ``timeout`` -> ``timeout_seconds``).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationInfo,
    field_validator,
)

from ..jobs import (
    _QUEUE_NAME,
    _TASK_NAME,
    MAX_ATTEMPTS,
    MAX_DELAY_SECONDS,
    MAX_KEY_LENGTH,
    MAX_PRIORITY,
    MAX_TIMEOUT_SECONDS,
    Job,
    JobState,
)

__all__ = [
    "BatchEnqueued",
    "EnqueueRequest",
    "ErrorBody",
    "Health",
    "JobList",
    "JobOut",
    "JobSummary",
    "Problem",
    "QueueList",
    "QueueOut",
    "batch_request_model",
]

MAX_JOB_ID = 2**63 - 1
TASK_PATTERN = f"^{_TASK_NAME.pattern}$"
QUEUE_PATTERN = f"^{_QUEUE_NAME.pattern}$"
# A run_at before this is a mistake, not a way to say "now".
EARLIEST_RUN_AT = datetime(1970, 1, 1, tzinfo=UTC)

StrictInt = Annotated[int, Strict()]
StrictStr = Annotated[str, Strict()]
Seconds = Annotated[float, Strict(), Field(allow_inf_nan=False)]


def _text_only(value: Any) -> Any:
    # Lax datetime parsing would read a bare number, or a string of digits,
    # as a Unix time.
    if not isinstance(value, str):
        raise ValueError("must be an ISO 8601 string with a time zone")
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("must be an ISO 8601 string with a time zone") from None
    return value


def _sane_run_at(value: datetime) -> datetime:
    latest = time.time() + MAX_DELAY_SECONDS
    if value < EARLIEST_RUN_AT or value.timestamp() > latest:
        raise ValueError(
            f"must be after 1970-01-01 and at most {MAX_DELAY_SECONDS:g} seconds from now"
        )
    return value


RunAt = Annotated[AwareDatetime, BeforeValidator(_text_only), AfterValidator(_sane_run_at)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnqueueRequest(_Strict):
    """One job to add."""

    task: Annotated[StrictStr, Field(pattern=TASK_PATTERN, description="Handler name.")]
    payload: dict[str, Any] | None = Field(
        default=None, description="Arguments of the job: a JSON object (no NaN, no NUL)."
    )
    queue: Annotated[StrictStr, Field(pattern=QUEUE_PATTERN)] = "default"
    priority: Annotated[StrictInt, Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] = Field(
        default=0, description="Higher runs first."
    )
    delay_seconds: Annotated[Seconds, Field(ge=0, le=MAX_DELAY_SECONDS)] | None = Field(
        default=None, description="Run no earlier than this many seconds from now."
    )
    run_at: RunAt | None = Field(
        default=None,
        description="Run no earlier than this time (ISO 8601 with a time zone). "
        "Give delay_seconds or run_at, not both.",
    )
    max_attempts: Annotated[StrictInt, Field(ge=1, le=MAX_ATTEMPTS)] | None = Field(
        default=None, description="Attempts before the job is dead (default from settings)."
    )
    timeout_seconds: Annotated[Seconds, Field(gt=0, le=MAX_TIMEOUT_SECONDS)] | None = None
    idempotency_key: (
        Annotated[StrictStr, Field(min_length=1, max_length=MAX_KEY_LENGTH, pattern=r"^[^\x00]+$")]
        | None
    ) = Field(default=None, description="A second enqueue with this key returns the first job.")

    @field_validator("run_at")
    @classmethod
    def _one_start_time(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        # delay_seconds is declared first, so it is validated (and in info.data) by now.
        if value is not None and info.data.get("delay_seconds") is not None:
            raise ValueError("give delay_seconds or run_at, not both")
        return value

    def fields(self) -> dict[str, Any]:
        """Keyword arguments of ``AsyncQueue.enqueue`` / ``JobSpec.build``."""
        return {
            "task": self.task,
            "payload": self.payload,
            "queue": self.queue,
            "priority": self.priority,
            "delay": self.delay_seconds,
            "run_at": self.run_at,
            "max_attempts": self.max_attempts,
            "timeout": self.timeout_seconds,
            "idempotency_key": self.idempotency_key,
        }


# JobSpec.build names two fields differently from the API.
API_FIELD = {"delay": "delay_seconds", "timeout": "timeout_seconds"}


def batch_request_model(max_batch: int) -> type[BaseModel]:
    """The body of POST /jobs/batch; its size limit is a setting, so the
    model (and the schema that documents it) is made per app."""

    class BatchEnqueueRequest(_Strict):
        jobs: list[EnqueueRequest] = Field(min_length=1, max_length=max_batch)

    return BatchEnqueueRequest


class JobSummary(BaseModel):
    """A job without the fields that can be large: what GET /jobs?fields=summary lists."""

    id: int
    queue: str
    task: str
    state: JobState
    priority: int
    attempts: int
    max_attempts: int
    run_at: datetime
    timeout_seconds: float | None
    idempotency_key: str | None
    worker: str | None
    lease_expires_at: datetime | None
    enqueued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobOut(JobSummary):
    """A job as the API shows it."""

    payload: dict[str, Any]
    last_error: str | None
    result: Any = Field(description="What the handler returned (any JSON), once succeeded.")

    @classmethod
    def of(cls, job: Job) -> JobOut:
        return cls(
            id=job.id,
            queue=job.queue,
            task=job.task,
            state=job.state,
            payload=job.payload,
            priority=job.priority,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            run_at=job.run_at,
            timeout_seconds=job.timeout_seconds,
            idempotency_key=job.idempotency_key,
            worker=job.worker,
            lease_expires_at=job.lease_expires_at,
            last_error=job.last_error,
            result=job.result,
            enqueued_at=job.enqueued_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
        )


class BatchItem(BaseModel):
    id: int
    outcome: Literal["created", "existing"] = Field(
        description="created: this request added the job; existing: its idempotency key "
        "already belonged to job `id`, and nothing was written."
    )


class BatchEnqueued(BaseModel):
    jobs: list[BatchItem] = Field(description="One entry per job of the request, in order.")


class JobList(BaseModel):
    jobs: list[JobOut | JobSummary] = Field(
        description="Every field, or with fields=summary, all but payload, result and last_error."
    )
    next_cursor: int | None = Field(
        description="Pass as `cursor` to get the next page; null on the last page."
    )


class QueueJobs(BaseModel):
    queued: int = Field(description="Runnable now.")
    scheduled: int = Field(description="Waiting for their run_at (delayed or backing off).")
    running: int


class QueueTotals(BaseModel):
    """Since the queue was first used; retention pruning does not lower them."""

    succeeded: int
    failed_attempts: int
    dead: int
    cancelled: int


class QueueOut(BaseModel):
    queue: str
    jobs: QueueJobs
    totals: QueueTotals
    oldest_runnable_seconds: float = Field(
        description="Age of the oldest runnable job (0 when none is waiting)."
    )


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
