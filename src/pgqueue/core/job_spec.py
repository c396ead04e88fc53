"""The one shape every new job has on every surface.

A new job has seventeen fields, named after the columns of the jobs table
(but on_conflict, which says what the enqueue does, not what the job is):

    task, payload, queue, priority, delay_seconds, run_at, max_attempts,
    timeout_seconds, idempotency_key, unique_scope, unique_period_seconds,
    on_conflict, concurrency_key, depends_on, on_dependency_failure, metadata,
    batch

``delay`` and ``timeout`` are aliases of ``delay_seconds`` and
``timeout_seconds``; a job that gives a name and its alias is refused.
``JOB_FIELDS`` describes each field once (its rule, default and meaning).
``JobSpec.from_fields`` checks a mapping of fields against it: the library's
``enqueue`` and ``enqueue_many``, the HTTP API and ``pgqueue enqueue-file``
all call it, and the HTTP request model and its OpenAPI schema are built from
the same table (``api/models.py``). Errors name the field as the caller
spelled it. The SQL functions ``pgqueue_enqueue`` and ``pgqueue_enqueue_many``
(migrations/0030_sql_enqueue.sql) apply the same rules in PL/pgSQL;
tests/integration/queue/test_sql_enqueue_property.py holds the two together.

Unique jobs: ``idempotency_key`` is the job's one key, and ``unique_scope``
says while which states the job holds it (``UNIQUE_SCOPES``; the index that
enforces it is in migrations/0004_unique_jobs.sql). A scope or a period
without a key makes the key from the task and the payload. ``on_conflict``
says what an enqueue does to a waiting job that holds its key (``ON_CONFLICT``:
ignore it, replace its payload, or extend its wait: a debounce); it needs a key.

Dependencies: ``depends_on`` lists the ids of jobs this one waits for (it is
``waiting`` until they end), and ``on_dependency_failure`` what it does when
one of them dies or is cancelled (``DEPENDENCY_POLICIES``; see
docs/workflows.md). A job with dependencies has no key.

JSON values (the payload, the metadata, and a handler's result, checked by
the same ``json_text.dump_json``) must read back as written: at most
``MAX_JSON_DEPTH`` levels deep and ``MAX_JSON_BYTES`` bytes, keys strings.

Batches: ``batch`` is the id of an open batch the job joins
(``Queue.open_batch``; docs/howto/batches.md); a job of a batch has no
dependencies.

Metadata: a JSON object about the job rather than its arguments, shown with
it and given to its handler (``Job.metadata``); the key ``otel`` is where
tracing.py carries the enqueuer's trace context (docs/tracing.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from .errors import InvalidJob
from .jobs import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_UNIQUE_SCOPE,
    DEPENDENCY_POLICIES,
    MAX_ATTEMPTS,
    MAX_DELAY_SECONDS,
    MAX_DEPENDENCIES,
    MAX_KEY_LENGTH,
    MAX_METADATA_BYTES,
    MAX_PRIORITY,
    MAX_TIMEOUT_SECONDS,
    ON_CONFLICT,
    QUEUE_NAME,
    TASK_NAME,
    UNIQUE_SCOPES,
)
from .json_text import MAX_JSON_BYTES, MAX_JSON_DEPTH, printable
from .rules import (
    SEALED_KEY,
    BatchId,
    Integer,
    JobIds,
    Key,
    Moment,
    Name,
    OneOf,
    Payload,
    Rule,
    Seconds,
)

__all__ = [
    "FIELD_ALIASES",
    "JOB_FIELDS",
    "JobField",
    "JobSpec",
    "build_specs",
    "payload_digest",
    "spec_columns",
]


@dataclass(frozen=True, slots=True)
class JobField:
    """One field of a new job. A missing field takes ``default``; so does a
    null one when ``nullable``. ``alias`` is another accepted name."""

    name: str
    rule: Rule
    description: str
    default: Any = None
    nullable: bool = True
    required: bool = False
    alias: str | None = None


JOB_FIELDS: tuple[JobField, ...] = (
    JobField("task", Name(TASK_NAME), "The handler's name.", nullable=False, required=True),
    JobField(
        "payload",
        Payload(reserved=(SEALED_KEY,)),
        f"The job's arguments: a JSON object of at most {MAX_JSON_BYTES} bytes as JSON, "
        f"nested at most {MAX_JSON_DEPTH} levels deep (the object itself is one), with "
        "string keys, no NaN or Infinity, no NUL character, no lone surrogate.",
        default={},
    ),
    JobField("queue", Name(QUEUE_NAME), "The queue's name.", default="default", nullable=False),
    JobField(
        "priority",
        Integer(-MAX_PRIORITY, MAX_PRIORITY),
        "Higher runs first.",
        default=0,
        nullable=False,
    ),
    JobField(
        "delay_seconds",
        Seconds(0.0, MAX_DELAY_SECONDS),
        "Run no earlier than this many seconds from now.",
        default=0,
        alias="delay",
    ),
    JobField(
        "run_at",
        Moment(MAX_DELAY_SECONDS),
        "Run no earlier than this time (ISO 8601 with a time zone; a time in the past "
        "means now). Give delay_seconds or run_at, not both.",
    ),
    JobField(
        "max_attempts",
        Integer(1, MAX_ATTEMPTS),
        "Attempts before the job is dead (default: the setting default_max_attempts).",
    ),
    JobField(
        "timeout_seconds",
        Seconds(0.0, MAX_TIMEOUT_SECONDS, exclusive_low=True),
        "Time limit of one attempt (default: the handler's own, else none).",
        alias="timeout",
    ),
    JobField(
        "idempotency_key",
        Key(MAX_KEY_LENGTH),
        "The job's key: an enqueue with a key another job holds returns that job and "
        "writes nothing (how long a job holds its key: unique_scope).",
    ),
    JobField(
        "unique_scope",
        OneOf(UNIQUE_SCOPES),
        "While which states the job holds its key: queued (until its first attempt "
        "starts), active (while queued or running), always (until the job is deleted). "
        "Default with a key: always. Without idempotency_key, the key is made of the "
        "task and the payload.",
    ),
    JobField(
        "unique_period_seconds",
        Seconds(1.0, MAX_DELAY_SECONDS),
        "At most one job per key in each period of this many seconds (periods are "
        "counted from 1970-01-01 UTC by the database's clock). Without idempotency_key, "
        "the key is made of the task and the payload.",
    ),
    JobField(
        "on_conflict",
        OneOf(ON_CONFLICT),
        "When another job holds the key and is still waiting (queued, not started): "
        "ignore (return it unchanged; the default), replace (write this job's payload, "
        "metadata and priority into it; it keeps its id and run_at) or extend (replace, "
        "and move its run_at later to this job's: a debounce, the job runs after the last "
        "enqueue's delay). A job that started is never changed. Needs a key "
        "(idempotency_key, unique_scope or unique_period_seconds).",
    ),
    JobField(
        "concurrency_key",
        Key(MAX_KEY_LENGTH),
        "What the queue's per-key limits count by (a tenant, a customer...): at most "
        "concurrency_limit_per_key of the queue's jobs with one key run at once, and at most "
        "rate_limit_per_key start per rate period. Without one, only the queue's own limits apply.",
    ),
    JobField(
        "depends_on",
        JobIds(MAX_DEPENDENCIES),
        "Ids of jobs this one waits for: it stays waiting (never claimed) until each has "
        "ended, and its handler gets their results as job.parents, in this order. Unknown "
        "ids are refused. Not with an idempotency key.",
    ),
    JobField(
        "on_dependency_failure",
        OneOf(DEPENDENCY_POLICIES),
        "When a job it depends on dies or is cancelled: cancel (this job, and the jobs "
        "that depend on it) or run (as if that job had succeeded).",
        default="cancel",
        nullable=False,
    ),
    JobField(
        "metadata",
        Payload(MAX_METADATA_BYTES),
        f"Facts about the job, not its arguments: a JSON object of at most "
        f"{MAX_METADATA_BYTES} bytes (otherwise checked as payload is), shown with the "
        "job and given to its handler as job.metadata. The key otel is pgqueue's: the "
        "trace context of the code that enqueued the job, when tracing is on "
        "(docs/tracing.md).",
    ),
    JobField(
        "batch",
        BatchId(),
        "The id of an open batch this job joins (POST /batches): its callbacks run once "
        "the batch is closed and every job of it has ended. Not with depends_on.",
    ),
)
FIELD_ALIASES = {f.alias: f.name for f in JOB_FIELDS if f.alias}
_REQUIRED = [f.name for f in JOB_FIELDS if f.required]
# Each field by every name it is accepted by.
_BY_NAME = {name: f for f in JOB_FIELDS for name in (f.name, f.alias) if name}
# The checked value of each field when it is missing (max_attempts: the caller's default).
_DEFAULTS: dict[str, Any] = {
    f.name: None if f.default is None else f.rule.check(f.name, f.default) for f in JOB_FIELDS
}


def _unknown(name: Any) -> InvalidJob:
    import difflib  # here, as hashlib below: a worker's start does without them

    shown = printable(str(name))
    guess = difflib.get_close_matches(shown, _BY_NAME, n=1)
    known = ", ".join(f.name for f in JOB_FIELDS)
    hint = f"did you mean '{guess[0]}'?" if guess else f"the fields are {known}"
    return InvalidJob(shown, f"unknown field '{shown}' ({hint})")


class JobSpec(NamedTuple):
    """A validated request to enqueue one job: build it with ``from_fields``
    (or ``build``). A named tuple: bulk enqueues build a hundred thousand."""

    task: str
    payload_json: str
    queue: str
    priority: int
    run_at: datetime | None
    delay_seconds: float
    max_attempts: int
    timeout_seconds: float | None
    idempotency_key: str | None
    unique_scope: str | None
    unique_period_seconds: float | None
    concurrency_key: str | None = None
    depends_on: tuple[int, ...] = ()
    on_dependency_failure: str = "cancel"
    metadata_json: str | None = None
    batch_id: UUID | None = None
    on_conflict: str | None = None  # None: ignore

    @classmethod
    def from_fields(
        cls, given: Mapping[str, Any], *, default_max_attempts: int = DEFAULT_MAX_ATTEMPTS
    ) -> JobSpec:
        """Check a mapping of fields (canonical names or aliases; a missing
        or null optional field takes its default); raise InvalidJob naming
        the first bad field in the mapping's order, unknown fields included."""
        values = dict(_DEFAULTS)
        names: dict[str, str] = {}  # canonical name -> the name it was given by
        for name, value in given.items():
            job_field = _BY_NAME.get(name)
            if job_field is None:
                raise _unknown(name)
            if job_field.name in names:
                raise InvalidJob(
                    job_field.name, f"give {names[job_field.name]} or {name}, not both"
                )
            names[job_field.name] = name
            if value is not None or not job_field.nullable:
                values[job_field.name] = job_field.rule.check(name, value)
        for required in _REQUIRED:
            if required not in names:
                raise InvalidJob(required, "missing")
        delay = names.get("delay_seconds")
        if values["run_at"] is not None and delay is not None and given[delay] is not None:
            raise InvalidJob("run_at", f"give {delay} or run_at, not both")
        key, scope, period = _uniqueness(values)
        if values["batch"] is not None and values["depends_on"]:
            raise InvalidJob(names["batch"], "a job with dependencies cannot join a batch")
        if key is not None and values["depends_on"]:
            raise InvalidJob(
                names["depends_on"], "a job with dependencies cannot have a key (unique jobs)"
            )
        if key is None and values["on_conflict"] is not None:
            raise InvalidJob(
                names["on_conflict"],
                "needs a key: give idempotency_key, unique_scope or unique_period_seconds",
            )
        return cls(
            values["task"],
            values["payload"],
            values["queue"],
            values["priority"],
            values["run_at"],
            values["delay_seconds"],
            values["max_attempts"] or default_max_attempts,
            values["timeout_seconds"],
            key,
            scope,
            period,
            values["concurrency_key"],
            values["depends_on"] or (),
            values["on_dependency_failure"],
            values["metadata"],
            values["batch"],
            None if values["on_conflict"] == "ignore" else values["on_conflict"],
        )

    @classmethod
    def build(cls, task: Any, payload: Any = None, **fields: Any) -> JobSpec:
        """``from_fields`` with the task, payload and fields as arguments."""
        return cls.from_fields({"task": task, "payload": payload, **fields})

    def params(self) -> dict[str, Any]:
        """The job's columns as the enqueue statements name their parameters."""
        return {name: getattr(self, field) for name, field in _PARAMETERS.items()}


# The enqueue statements' parameter for each field of a JobSpec they take.
_PARAMETERS = {
    "queue": "queue",
    "task": "task",
    "payload": "payload_json",
    "priority": "priority",
    "run_at": "run_at",
    "delay": "delay_seconds",
    "max_attempts": "max_attempts",
    "timeout_seconds": "timeout_seconds",
    "idempotency_key": "idempotency_key",
    "unique_scope": "unique_scope",
    "concurrency_key": "concurrency_key",
    "metadata": "metadata_json",
    "batch_id": "batch_id",
}


def spec_columns(specs: Iterable[JobSpec]) -> dict[str, list[Any]]:
    """The specs' ``params`` as one array per parameter: what the statements
    that insert many jobs from arrays (unnest) take."""
    # (No specs: no columns to pair with the fields, hence not strict.)
    by_field = dict(zip(JobSpec._fields, zip(*specs, strict=True), strict=False))
    return {name: list(by_field.get(field, ())) for name, field in _PARAMETERS.items()}


def _uniqueness(values: Mapping[str, Any]) -> tuple[str | None, str | None, float | None]:
    """The key, its scope and its period. A key without a scope is held
    always (an idempotency key); a scope or a period without a key is
    uniqueness by task and payload."""
    key, scope, period = (
        values["idempotency_key"],
        values["unique_scope"],
        values["unique_period_seconds"],
    )
    if key is None and (scope or period):
        key = f"{values['task']}:{payload_digest(values['payload'])}"
    return key, (scope or DEFAULT_UNIQUE_SCOPE) if key else None, period


def payload_digest(payload_json: str) -> str:
    """SHA-256 of a payload with its keys sorted, so that two payloads that
    are the same JSON object make the same key whatever their key order."""
    import hashlib

    canonical = json.dumps(json.loads(payload_json), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def build_specs(
    jobs: Iterable[JobSpec | Mapping[str, Any]], *, default_max_attempts: int
) -> list[JobSpec]:
    """Validate a batch up front, so that one bad job writes nothing; the
    error names the job by its index: ``jobs[3].priority``."""
    specs = []
    for index, job in enumerate(jobs):
        if isinstance(job, JobSpec):
            specs.append(job)
            continue
        if not isinstance(job, Mapping):
            raise InvalidJob(f"jobs[{index}]", f"must be a mapping, got {type(job).__name__}")
        try:
            specs.append(JobSpec.from_fields(job, default_max_attempts=default_max_attempts))
        except InvalidJob as exc:
            raise InvalidJob(f"jobs[{index}].{exc.field}", exc.problem) from None
    return specs
