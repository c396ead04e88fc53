"""What a job is, and the one shape every new job has on every surface.

A new job has fifteen fields, named after the columns of the jobs table:

    task, payload, queue, priority, delay_seconds, run_at, max_attempts,
    timeout_seconds, idempotency_key, unique_scope, unique_period_seconds,
    concurrency_key, depends_on, on_dependency_failure, metadata

``delay`` and ``timeout`` are aliases of ``delay_seconds`` and
``timeout_seconds``; a job that gives a name and its alias is refused.
``JOB_FIELDS`` describes each field once (its rule, default and meaning).
``JobSpec.from_fields`` checks a mapping of fields against it: the library's
``enqueue`` and ``enqueue_many``, the HTTP API and ``pgqueue enqueue-file``
all call it, and the HTTP request model and its OpenAPI schema are built from
the same table (``api/models.py``). Errors name the field as the caller
spelled it.

Unique jobs: ``idempotency_key`` is the job's one key, and ``unique_scope``
says while which states the job holds it (``UNIQUE_SCOPES``; the index that
enforces it is in migrations/0004_unique_jobs.sql). A scope or a period
without a key makes the key from the task and the payload.

Dependencies: ``depends_on`` lists the ids of jobs this one waits for (it is
``waiting`` until they end), and ``on_dependency_failure`` what it does when
one of them dies or is cancelled (``DEPENDENCY_POLICIES``; see
docs/workflows.md). A job with dependencies has no key.

JSON values (the payload, the metadata, and a handler's result, checked by
the same ``checks.dump_json``) must read back as written: at most
``MAX_JSON_DEPTH`` levels deep and ``MAX_JSON_BYTES`` bytes, keys strings.

Metadata: a JSON object about the job rather than its arguments, shown with
it and given to its handler (``Job.metadata``); the key ``otel`` is where
tracing.py carries the enqueuer's trace context (docs/tracing.md).
"""

from __future__ import annotations

import difflib
import enum
import functools
import hashlib
import json
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, make_dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple
from uuid import UUID

from .errors import InvalidJob
from .rules import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    Integer,
    JobIds,
    Key,
    Moment,
    Name,
    OneOf,
    Payload,
    Rule,
    Seconds,
    dump_json,
    printable,
)

__all__ = [
    "DEPENDENCY_POLICIES",
    "FIELD_ALIASES",
    "JOB_FIELDS",
    "MAX_ATTEMPTS",
    "MAX_ATTEMPT_ERRORS",
    "MAX_DELAY_SECONDS",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_KEY_LENGTH",
    "MAX_METADATA_BYTES",
    "MAX_PRIORITY",
    "MAX_TIMEOUT_SECONDS",
    "QUEUE_NAME",
    "TASK_NAME",
    "UNIQUE_SCOPES",
    "AttemptError",
    "Job",
    "JobField",
    "JobSpec",
    "JobState",
    "build_specs",
    "dump_json",
]

MAX_PRIORITY = 32767
MAX_ATTEMPTS = 1000
DEFAULT_MAX_ATTEMPTS = 5
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600.0
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600.0
MAX_KEY_LENGTH = 255
# Metadata is for small facts about a job (a trace context is ~120 bytes).
MAX_METADATA_BYTES = 16_384
TASK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:\-]{0,199}")
QUEUE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,62}")
# While which states a job holds its key (the index predicate pgqueue_key_held):
# until its first attempt starts; while queued or running (until it ends:
# succeeded, dead or cancelled); in every state, until the row is deleted.
UNIQUE_SCOPES = ("queued", "active", "always")
DEFAULT_UNIQUE_SCOPE = "always"
# When a job it depends on dies or is cancelled, a job is cancelled too (and
# so are its own dependents), or runs anyway, as if that one had succeeded.
DEPENDENCY_POLICIES = ("cancel", "run")
MAX_DEPENDENCIES = 100_000


class JobState(enum.StrEnum):
    """Where a job is in its life (the diagram: docs/architecture.md).
    ``succeeded``, ``dead`` and ``cancelled`` are finished: no worker
    changes them again; a retry queues a dead or cancelled job anew."""

    WAITING = "waiting"  # for the jobs it depends on; never claimed
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """True for the states a worker leaves a job in for good."""
        return self in (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED)


@dataclass(frozen=True, slots=True)
class AttemptError:
    """One failed attempt of a job: its number, the error (the exception and
    the head of its traceback, or why the lease expired), the worker that
    held it, and when it failed (database clock)."""

    attempt: int
    error: str
    worker: str | None
    at: datetime

    @classmethod
    def from_dict(cls, value: Any) -> AttemptError:
        """One element of the errors column. An element pgqueue did not
        write (a row written by SQL) reads as attempt 0 at 1970-01-01 whose
        error is that element's JSON, so that every read can show the job."""
        try:
            worker = value.get("worker")
            return cls(
                int(value["attempt"]),
                str(value["error"]),
                None if worker is None else str(worker),
                datetime.fromisoformat(value["at"]),
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            shown = json.dumps(value, ensure_ascii=False)[:2000]
            return cls(0, f"[not a failed attempt as pgqueue writes one: {shown}]", None, _EPOCH)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "error": self.error,
            "worker": self.worker,
            "at": self.at.isoformat(),
        }


# When an element of the errors column that pgqueue did not write failed.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Failed attempts a job keeps (the oldest go first): pgqueue_errors_append,
# migrations/0010_history.sql.
MAX_ATTEMPT_ERRORS = 20


@dataclass(frozen=True, slots=True)
class Job:
    """A row of the jobs table. ``duplicate`` is set by enqueue when this
    job held the key asked for (nothing new was written)."""

    id: int
    queue: str
    task: str
    payload: dict[str, Any]
    priority: int
    state: JobState
    run_at: datetime
    attempts: int
    max_attempts: int
    snoozes: int  # times its handlers asked to run later (Snooze); attempts do not count them
    timeout_seconds: float | None
    lease_token: int | None
    lease_expires_at: datetime | None
    worker: str | None
    last_error: str | None
    result: Any
    idempotency_key: str | None
    unique_scope: str | None
    enqueued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    concurrency_key: str | None = None
    workflow_id: UUID | None = None
    depends_on: list[int] | None = None  # the jobs it waits for, in the order given
    # Its failed attempts, oldest first (the last MAX_ATTEMPT_ERRORS); an
    # operator's retry keeps them, and numbers the next attempts from 1 again.
    errors: tuple[AttemptError, ...] = ()
    metadata: dict[str, Any] | None = None  # None: the job was given none
    duplicate: bool = False
    # The results of the jobs of ``depends_on``, in that order (None for a
    # job that did not succeed, or was pruned): filled in by the claim.
    parents: tuple[Any, ...] = ()

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, duplicate: bool = False) -> Job:
        columns = (row[name] for name in _COLUMNS)
        return _made(columns, duplicate, tuple(row.get("parents") or ()))

    @classmethod
    def from_tuples(cls, names: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[Job]:
        """Jobs from plain result tuples whose columns are ``names``: the
        claim's hot path, without a dict per row. A ``parents`` column (the
        claim's) gives each job its parents' results."""
        read = _reader(tuple(names))
        return [read(row) for row in rows]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: datetimes as ISO 8601 strings."""
        out: dict[str, Any] = {}
        for name in _COLUMNS:
            value = getattr(self, name)
            if isinstance(value, datetime):
                value = value.isoformat()
            out[name] = str(value) if isinstance(value, UUID) else value
        out["state"] = str(self.state)
        out["errors"] = [error.to_dict() for error in self.errors]
        return out


_COLUMNS = tuple(f.name for f in fields(Job) if f.name not in ("duplicate", "parents"))
# A state column's text as a JobState (quicker than calling JobState).
STATES = {state.value: state for state in JobState}


# A Job without the frozen guard: the same slots in the same order, filled by
# plain attribute stores, then made a Job by changing its class (which Python
# allows only between classes of the same layout, and checks). A frozen
# dataclass's __init__ goes through object.__setattr__ for each field: 2.8 µs
# of the worker's time per claimed job, against about 1 µs.
_Unfrozen = make_dataclass(
    "_Unfrozen",
    [(f.name, f.type) for f in fields(Job)],
    slots=True,
    eq=False,
    repr=False,
    match_args=False,
)


@functools.lru_cache(maxsize=32)
def _reader(names: tuple[str, ...]) -> Callable[[Sequence[Any]], Job]:
    """A function that makes a Job of a result tuple whose columns are
    ``names`` (looked up once per statement, not per row)."""
    pick = operator.itemgetter(*(names.index(name) for name in _COLUMNS))
    parents_at = names.index("parents") if "parents" in names else None

    def read(row: Sequence[Any]) -> Job:
        parents = () if parents_at is None else tuple(row[parents_at] or ())
        return _made(pick(row), False, parents)  # False: not a duplicate

    return read


def _made(columns: Iterable[Any], duplicate: bool, parents: tuple[Any, ...]) -> Job:
    """A Job of a row's columns (in the order of _COLUMNS): the state as a
    JobState, the errors (jsonb, NULL when none) as AttemptErrors."""
    job = _Unfrozen(*columns, duplicate, parents)
    job.state = STATES[job.state]
    errors = job.errors
    if errors and not isinstance(errors, list):  # a row written by SQL
        errors = [errors]
    job.errors = tuple(map(AttemptError.from_dict, errors)) if errors else ()
    job.__class__ = Job
    return job  # type: ignore[no-any-return]


# -- a new job -------------------------------------------------------------------


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
        Payload(),
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
        if key is not None and values["depends_on"]:
            raise InvalidJob(
                names["depends_on"], "a job with dependencies cannot have a key (unique jobs)"
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
        )

    @classmethod
    def build(cls, task: Any, payload: Any = None, **fields: Any) -> JobSpec:
        """``from_fields`` with the task, payload and fields as arguments."""
        return cls.from_fields({"task": task, "payload": payload, **fields})


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
