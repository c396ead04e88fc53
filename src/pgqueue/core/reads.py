"""The reads of the state machine: a job, a listing, what an idle worker
waits for, the schema's state. Free of I/O, like transitions.py: flows that
a queue or the worker runs."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..sql import migration_versions
from .errors import InvalidJob, JobNotFound
from .flows import Flow, Row, Statement
from .jobs import Job, JobState
from .rules import Payload

__all__ = [
    "LIST_VIEWS",
    "ClaimHints",
    "ProgressSeen",
    "Wake",
    "checked_job_id",
    "claim_hints",
    "forget_waits",
    "get",
    "health",
    "list_filters",
    "list_jobs",
    "list_summaries",
    "next_wake",
    "queues_with_jobs",
    "read",
    "schema_pending",
    "start_lags",
    "watch",
]

# A wait's registration (watch) lasts at most this long: a longer wait falls
# back to re-reading its job every second after that.
WATCH_MAX_SECONDS = 24 * 3600.0


def queues_with_jobs() -> Flow[list[str]]:
    """The queues that have queued jobs (runnable or not), by name."""
    rows = yield Statement("queue_names_queued", {})
    return [row["queue"] for row in rows]


@dataclass(frozen=True, slots=True)
class Wake:
    """When an idle worker should look again by itself (``seconds`` from
    now, None: only when woken), and the queues whose ended jobs free a
    slot under a concurrency limit."""

    seconds: float | None
    limited: frozenset[str]


def next_wake(queues: Sequence[str] | None) -> Flow[Wake]:
    """When the earliest delayed job becomes runnable or a rate window lets
    one more job start, and which queues have a concurrency limit."""
    rows = yield Statement("queue_next_wake", {"queues": list(queues) if queues else None})
    seconds = rows[0]["seconds"]
    return Wake(None if seconds is None else float(seconds), frozenset(rows[0]["limited"]))


@dataclass(frozen=True, slots=True)
class ClaimHints:
    """What a worker's claims weigh besides the round robin: its fair
    queues, and the latency objectives of its queues (seconds, by name)."""

    fair: frozenset[str] = frozenset()
    objectives: dict[str, float] = field(default_factory=dict)


def claim_hints(queues: Sequence[str] | None) -> Flow[ClaimHints]:
    """The fair queues and the latency objectives among ``queues`` (None:
    every queue), paused queues left out."""
    rows = yield Statement("queue_claim_hints", {"queues": list(queues) if queues else None})
    return ClaimHints(
        frozenset(row["name"] for row in rows if row["fair"]),
        {
            row["name"]: float(row["max_start_lag_seconds"])
            for row in rows
            if row["max_start_lag_seconds"] is not None
        },
    )


def start_lags(queues: Sequence[str]) -> Flow[dict[str, float]]:
    """How long each queue's oldest runnable job has waited, in seconds
    (the database's clock; 0 when none waits)."""
    if not queues:
        return {}
    rows = yield Statement("queue_start_lags", {"queues": list(queues)})
    return {row["queue"]: float(row["lag_seconds"]) for row in rows}


# -- operators' transitions -----------------------------------------------------


def get(job_id: int) -> Flow[Job]:
    jobs: list[Job] = yield Statement("job_get", {"id": checked_job_id(job_id)}, jobs=True)
    if not jobs:
        raise JobNotFound(job_id)
    return jobs[0]


def watch(job_id: int, seconds: float) -> Flow[Job]:
    """wait()'s first read of a job: unless the job has ended, the statement
    that ends it will notify ``pgqueue_finished`` (for ``seconds`` at most;
    the ends of jobs nobody watches notify nobody)."""
    seconds = min(seconds, WATCH_MAX_SECONDS) if seconds > 0 else 0.0
    jobs: list[Job] = yield Statement(
        "job_watch", {"id": checked_job_id(job_id), "seconds": seconds}, jobs=True
    )
    if not jobs:
        raise JobNotFound(job_id)
    return jobs[0]


def forget_waits() -> Flow[None]:
    """Delete the registrations of waiters past their timeout."""
    yield Statement("wait_prune", {})


# What a listing may filter on beyond a job's states: queued jobs waiting for
# a future run_at, and queued jobs that failed before (in backoff or due).
LIST_VIEWS = ("scheduled", "retrying")
MAX_ERROR_SEARCH = 1000
# A containment search's JSON object (payload_contains, metadata_contains).
MAX_SEARCH_BYTES = 4096
_SEARCH = Payload(MAX_SEARCH_BYTES)


def search_object(field: str, value: Any) -> str | None:
    """A containment search as JSON text: a dict, or JSON text of an object
    (from a URL or a command line); InvalidJob naming ``field`` otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise InvalidJob(field, f"must be a JSON object, as text: {exc}") from None
    return _SEARCH.check(field, value)


def list_filters(
    *,
    state: str | None = None,
    queue: str | None = None,
    task: str | None = None,
    error_contains: str | None = None,
    error_kind: str | None = None,
    payload_contains: Any = None,
    metadata_contains: Any = None,
    before_id: int | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    """The checked parameters of ``job_list`` and ``job_list_summary``;
    ``state`` is a job state or one of ``LIST_VIEWS``."""
    if state is not None and state not in (*JobState, *LIST_VIEWS):
        choices = ", ".join((*JobState, *LIST_VIEWS))
        raise InvalidJob("state", f"must be one of {choices}, got {state!r}")
    if not 1 <= limit <= 1000:
        raise InvalidJob("limit", f"must be between 1 and 1000, got {limit}")
    if error_contains is not None and not 1 <= len(error_contains) <= MAX_ERROR_SEARCH:
        raise InvalidJob("error_contains", f"must be 1 to {MAX_ERROR_SEARCH} characters")
    if error_kind is not None and not 1 <= len(error_kind) <= MAX_ERROR_SEARCH:
        raise InvalidJob("error_kind", f"must be 1 to {MAX_ERROR_SEARCH} characters")
    return {
        "state": JobState.QUEUED.value if state in LIST_VIEWS else state,
        "scheduled": state == "scheduled",
        "retrying": state == "retrying",
        "queue": queue,
        "task": task,
        "error_contains": error_contains,
        "error_kind": error_kind,
        "payload_contains": search_object("payload_contains", payload_contains),
        "metadata_contains": search_object("metadata_contains", metadata_contains),
        "before_id": None if before_id is None else checked_job_id(before_id),
        "limit": limit,
    }


def list_jobs(**filters: Any) -> Flow[list[Job]]:
    """Newest first; pass the last id of a page as ``before_id`` for the
    next. The filters are those of ``list_filters``."""
    jobs: list[Job] = yield Statement("job_list", list_filters(**filters), jobs=True)
    return jobs


def list_summaries(**filters: Any) -> Flow[list[Row]]:
    """Like ``list_jobs``, as rows without payload, result and last_error."""
    rows = yield Statement("job_list_summary", list_filters(**filters))
    return rows


def checked_job_id(job_id: Any) -> int:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 1 <= job_id < 2**63:
        raise JobNotFound(job_id)
    return job_id


def read(name: str, **params: Any) -> Flow[list[Row]]:
    """Run a read-only named query and return its rows (stats, metrics)."""
    rows = yield Statement(name, params)
    return rows


def health() -> Flow[list[str]]:
    """What a health check asks: the migrations pending (schema_pending);
    once there are none, whether the session can write (a read-only one
    raises, and the driver drops it from its pool)."""
    pending = yield from schema_pending()
    if not pending:
        yield Statement("health_write_check", {})
    return pending


def schema_pending() -> Flow[list[str]]:
    """The migrations this code needs that the database has not applied
    (every one of them when it was never migrated); empty when up to date."""
    rows = yield Statement("migration_table_exists", {})
    applied: set[str] = set()
    if rows[0]["present"]:
        rows = yield Statement("migration_applied", {})
        applied = {row["version"] for row in rows}
    return [version for version in migration_versions() if version not in applied]


class ProgressSeen:
    """wait()'s ``on_progress``: called with each job read back whose
    progress report (``progress_at``) it has not seen yet."""

    __slots__ = ("_last", "_on_progress")

    def __init__(self, on_progress: Callable[[Job], object] | None) -> None:
        self._on_progress = on_progress
        self._last: datetime | None = None

    def __call__(self, job: Job) -> None:
        at = job.progress_at
        if self._on_progress is not None and at is not None and at != self._last:
            self._last = at
            self._on_progress(job)
