"""What a job is, and the checks every new job passes before it is written."""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any, NamedTuple

from .errors import InvalidJob

__all__ = ["Job", "JobSpec", "JobState", "dump_json"]

MAX_PRIORITY = 32767
MAX_ATTEMPTS = 1000
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600.0
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600.0
MAX_KEY_LENGTH = 255
# A run_at in the past means "now"; one before this year is a mistake.
MIN_RUN_AT_YEAR = 1970
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,62}")
_TASK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:\-]{0,199}")


class JobState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED)


@dataclass(frozen=True, slots=True)
class Job:
    """A row of the jobs table. ``duplicate`` is set by enqueue when the
    idempotency key already belonged to this job (nothing new was written)."""

    id: int
    queue: str
    task: str
    payload: dict[str, Any]
    priority: int
    state: JobState
    run_at: datetime
    attempts: int
    max_attempts: int
    timeout_seconds: float | None
    lease_token: int | None
    lease_expires_at: datetime | None
    worker: str | None
    last_error: str | None
    result: Any
    idempotency_key: str | None
    enqueued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duplicate: bool = False

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, duplicate: bool = False) -> Job:
        values = [row[name] for name in _COLUMNS]
        values[_STATE_INDEX] = _STATES[values[_STATE_INDEX]]
        return cls(*values, duplicate=duplicate)  # type: ignore[misc]  # mypy cannot count a list

    @classmethod
    def from_tuples(cls, names: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[Job]:
        """Jobs from plain result tuples whose columns are ``names``: the
        claim's hot path, without a dict per row."""
        picks = [names.index(name) for name in _COLUMNS]
        jobs = []
        for row in rows:
            values = [row[i] for i in picks]
            values[_STATE_INDEX] = _STATES[values[_STATE_INDEX]]
            jobs.append(cls(*values))
        return jobs

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: datetimes as ISO 8601 strings."""
        out: dict[str, Any] = {}
        for name in _COLUMNS:
            value = getattr(self, name)
            out[name] = value.isoformat() if isinstance(value, datetime) else value
        out["state"] = str(self.state)
        return out


_COLUMNS = tuple(f.name for f in fields(Job) if f.name != "duplicate")
_STATE_INDEX = _COLUMNS.index("state")
_STATES = {state.value: state for state in JobState}


class JobSpec(NamedTuple):
    """A validated request to enqueue one job. Construct with ``JobSpec.build``.
    (A named tuple: bulk enqueues build a hundred thousand of them.)"""

    task: str
    payload_json: str
    queue: str
    priority: int
    run_at: datetime | None
    delay_seconds: float
    max_attempts: int
    timeout_seconds: float | None
    idempotency_key: str | None

    @classmethod
    def build(
        cls,
        task: Any,
        payload: Any = None,
        *,
        queue: Any = "default",
        priority: Any = 0,
        delay: Any = None,
        run_at: Any = None,
        max_attempts: Any = 5,
        timeout: Any = None,
        idempotency_key: Any = None,
    ) -> JobSpec:
        """Check every argument; raise InvalidJob naming the first bad one."""
        if delay is not None and run_at is not None:
            raise InvalidJob("delay", "give delay or run_at, not both")
        return cls(
            _name("task", task, _TASK_NAME),
            _payload(payload),
            _name("queue", queue, _QUEUE_NAME),
            _integer("priority", priority, -MAX_PRIORITY, MAX_PRIORITY),
            None if run_at is None else _aware("run_at", run_at),
            0.0 if delay is None else _seconds("delay", delay, 0.0, MAX_DELAY_SECONDS) or 0.0,
            _integer("max_attempts", max_attempts, 1, MAX_ATTEMPTS),
            None
            if timeout is None
            else _seconds("timeout", timeout, 0.0, MAX_TIMEOUT_SECONDS, open_low=True),
            None if idempotency_key is None else _key(idempotency_key),
        )


# Built once: json.dumps with non-default options builds an encoder per call.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
# Names already seen valid; bulk enqueues repeat a few names many times.
_VALID_NAMES: set[tuple[str, str]] = set()


def dump_json(value: Any, field: str) -> str:
    """Serialise to JSON that PostgreSQL's jsonb accepts, or raise InvalidJob.

    jsonb refuses NaN/Infinity and the NUL character; json.dumps would write
    the first two and escape the third, so both are checked here.
    """
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidJob(field, f"not JSON-serialisable ({exc})") from None
    if "\\u0000" in text:
        raise InvalidJob(field, "contains a NUL character, which PostgreSQL cannot store")
    return text


def _payload(payload: Any) -> str:
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise InvalidJob("payload", f"must be a JSON object (dict), got {type(payload).__name__}")
    return dump_json(payload, "payload")


def _name(field: str, value: Any, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str):
        raise InvalidJob(field, f"must be a string, got {type(value).__name__}")
    if (field, value) in _VALID_NAMES:
        return value
    if not pattern.fullmatch(value):
        raise InvalidJob(
            field,
            f"{value[:80]!r} is not a valid {field} name: it must match {pattern.pattern}",
        )
    if len(_VALID_NAMES) < 10_000:
        _VALID_NAMES.add((field, value))
    return value


def _integer(field: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJob(field, f"must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidJob(field, f"must be between {low} and {high}, got {value}")
    return value


def _seconds(
    field: str, value: Any, low: float, high: float, *, open_low: bool = False
) -> float | None:
    if value is None:
        return None
    if hasattr(value, "total_seconds"):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJob(field, f"must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value < low or (open_low and value == low) or value > high:
        bound = f"more than {low:g}" if open_low else f"at least {low:g}"
        raise InvalidJob(field, f"must be {bound} and at most {high:g} seconds, got {value}")
    return float(value)


def _aware(field: str, value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidJob(field, f"must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidJob(field, "must have a time zone (a naive datetime is ambiguous)")
    try:
        in_utc = value.astimezone(UTC)
    except OverflowError:
        in_utc = None
    if in_utc is None or not MIN_RUN_AT_YEAR <= in_utc.year <= 9999:
        raise InvalidJob(field, f"must be between the years {MIN_RUN_AT_YEAR} and 9999 in UTC")
    return value


def _key(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidJob("idempotency_key", f"must be a string, got {type(value).__name__}")
    if not 1 <= len(value) <= MAX_KEY_LENGTH:
        raise InvalidJob("idempotency_key", f"must be 1 to {MAX_KEY_LENGTH} characters")
    if "\x00" in value:
        raise InvalidJob("idempotency_key", "contains a NUL character")
    return value
