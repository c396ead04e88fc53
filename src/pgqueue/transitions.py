"""The job state machine: one function per transition, free of I/O.

Each transition is a generator that yields the statements to run (a query
name from ``sql/queries.sql`` and its parameters) and receives their rows;
its return value is the transition's result. The sync ``Queue`` and the
async ``AsyncQueue`` drive the same generators, so the two faces cannot
drift apart, and the worker runtime uses the same ones.

    enqueue ──> queued ──claim──> running ──finish(ok)──> succeeded
                  ^                │ └─finish(error) or reap, attempts left─> queued (backoff)
                  │                └───finish(error) or reap, none left─────> dead
                  └──retry── dead, cancelled <──cancel── queued, running
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from .checks import printable
from .errors import (
    InvalidJob,
    JobAlreadyFinished,
    JobKeyHeld,
    JobNotFound,
    JobNotRetryable,
    KeyTaken,
)
from .jobs import Job, JobSpec, JobState, dump_json
from .settings import Settings
from .sql import migration_versions

__all__ = [
    "Flow",
    "Outcome",
    "Statement",
    "cancel",
    "claim",
    "db_now",
    "enqueue",
    "enqueue_many",
    "finish",
    "get",
    "heartbeat",
    "list_jobs",
    "next_run_in",
    "prune",
    "reap",
    "retry",
    "schema_pending",
]

Row = dict[str, Any]
T = TypeVar("T")
# Chunk of a bulk enqueue sent as one statement: large enough to amortise the
# round trip, small enough to keep the parameter arrays in a few MB.
ENQUEUE_CHUNK = 5000
# Rounds of insert-then-look-up before a key that keeps changing hands is an
# error: each round that fails needs a holder that let the key go between
# the two statements.
KEY_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement to run: a query name and its parameters, or for a COPY
    statement, the rows to send. With ``jobs``, the flow is sent its rows as
    ``Job`` objects instead of dicts (the statement returns whole job rows)."""

    name: str
    params: dict[str, Any]
    copy_rows: list[tuple[Any, ...]] | None = None
    jobs: bool = False


# A flow is sent a list of dict rows, or of Jobs for a ``jobs`` statement.
Flow = Generator[Statement, list[Any], T]


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one attempt ended, fenced by the token of its claim."""

    job_id: int
    token: int
    succeeded: bool
    result_json: str | None = None
    error: str | None = None
    retryable: bool = True

    @classmethod
    def success(cls, job: Job, result: Any) -> Outcome:
        """A success, unless the result cannot be stored: then a failed attempt."""
        try:
            text = dump_json(result, "result")
        except InvalidJob as exc:
            return cls.failure(job, f"handler returned a result PostgreSQL cannot store: {exc}")
        return cls(job.id, _token(job), True, result_json=text)

    @classmethod
    def failure(cls, job: Job, error: str, *, retryable: bool = True) -> Outcome:
        # jsonb is not involved, but text columns refuse NUL and lone
        # surrogates as well (an exception's text may quote either).
        text = printable(error).replace("\x00", "\\0")
        return cls(job.id, _token(job), False, error=text, retryable=retryable)


def _token(job: Job) -> int:
    if job.lease_token is None:
        raise ValueError(f"job {job.id} was not claimed: it has no lease token")
    return job.lease_token


# -- enqueue ----------------------------------------------------------------


def _spec_params(spec: JobSpec) -> dict[str, Any]:
    return {
        "queue": spec.queue,
        "task": spec.task,
        "payload": spec.payload_json,
        "priority": spec.priority,
        "run_at": spec.run_at,
        "delay": spec.delay_seconds,
        "max_attempts": spec.max_attempts,
        "timeout_seconds": spec.timeout_seconds,
        "idempotency_key": spec.idempotency_key,
        "unique_scope": spec.unique_scope,
    }


def db_now() -> Flow[datetime]:
    """The database's clock."""
    rows = yield Statement("db_now", {})
    now: datetime = rows[0]["now"]
    return now


def _in_periods(specs: Sequence[JobSpec]) -> Flow[Sequence[JobSpec]]:
    """The specs, each key with a period ending in the start of the period
    it is in now by the database's clock (one statement, only when needed):
    the key of the next period is another key."""
    if not any(spec.unique_period_seconds for spec in specs):
        return specs
    now = (yield from db_now()).timestamp()
    return [_in_period(spec, now) for spec in specs]


def _in_period(spec: JobSpec, now: float) -> JobSpec:
    period = spec.unique_period_seconds
    if not period:
        return spec
    start = datetime.fromtimestamp(math.floor(now / period) * period, UTC)
    return spec._replace(idempotency_key=f"{spec.idempotency_key}@{start.isoformat()}")


def enqueue(spec: JobSpec) -> Flow[Job]:
    """Insert a job, or return the one that holds its key now."""
    [spec] = yield from _in_periods([spec])
    params = _spec_params(spec)
    # A conflicting insert may be in flight in another transaction: ON
    # CONFLICT waits for it, and if it rolled back our insert goes ahead. The
    # holder may also let the key go (start, end) between the two
    # statements: then the next round inserts.
    for _ in range(KEY_ROUNDS):
        jobs: list[Job] = yield Statement("job_enqueue", params, jobs=True)
        if jobs:
            return jobs[0]
        jobs = yield Statement(
            "job_get_by_idempotency_key", {"idempotency_key": spec.idempotency_key}, jobs=True
        )
        if jobs:
            return dataclasses.replace(jobs[0], duplicate=True)
    raise RuntimeError(f"key {spec.idempotency_key!r} kept changing hands")


@dataclass(frozen=True, slots=True)
class Enqueued:
    """Per job of a bulk enqueue: its id and whether this call created it."""

    id: int
    created: bool


def enqueue_many(specs: Sequence[JobSpec], *, copy: bool = True) -> Flow[list[Enqueued]]:
    """Insert many jobs; results in input order. Plain jobs (runnable now, no
    key) go in by COPY when ``copy``; others by INSERT, a few thousand per
    statement, skipping held keys."""
    if copy and all(_plain(spec) for spec in specs):
        return (yield from _copy_many(specs))
    specs = yield from _in_periods(specs)
    results: list[Enqueued] = []
    for start in range(0, len(specs), ENQUEUE_CHUNK):
        results += yield from _insert_chunk(specs[start : start + ENQUEUE_CHUNK])
    return results


def _insert_chunk(chunk: Sequence[JobSpec]) -> Flow[list[Enqueued]]:
    """One INSERT of a chunk; the jobs whose key was held get the holder's
    id. A holder that let its key go meanwhile means another round."""
    results = [Enqueued(-1, False)] * len(chunk)
    todo = list(range(len(chunk)))
    for _ in range(KEY_ROUNDS):
        part = [chunk[i] for i in todo]
        columns: dict[str, list[Any]] = {name: [] for name in _spec_params(part[0])}
        for spec in part:
            for name, value in _spec_params(spec).items():
                columns[name].append(value)
        rows = yield Statement("job_enqueue_many", columns)
        for i, result in zip(todo, _match_inserted(part, rows), strict=True):
            results[i] = result
        todo = [i for i in todo if results[i].id < 0]
        if not todo:
            return results
        keys = sorted({str(chunk[i].idempotency_key) for i in todo})
        found = yield Statement("job_ids_by_idempotency_keys", {"idempotency_keys": keys})
        holders = {row["idempotency_key"]: row["id"] for row in found}
        for i in todo:
            if chunk[i].idempotency_key in holders:
                results[i] = Enqueued(holders[chunk[i].idempotency_key], False)
        todo = [i for i in todo if results[i].id < 0]
        if not todo:
            return results
    raise RuntimeError(f"{len(todo)} key(s) kept changing hands")


def _plain(spec: JobSpec) -> bool:
    return spec.idempotency_key is None and spec.run_at is None and not spec.delay_seconds


def _copy_many(specs: Sequence[JobSpec]) -> Flow[list[Enqueued]]:
    rows = yield Statement("job_reserve_ids", {"count": len(specs)})
    ids: list[int] = rows[0]["ids"]
    yield Statement(
        "job_copy",
        {},
        copy_rows=[
            (job_id, s.queue, s.task, s.payload_json, s.priority, s.max_attempts, s.timeout_seconds)
            for job_id, s in zip(ids, specs, strict=True)
        ],
    )
    yield Statement("job_notify_queues", {"queues": sorted({s.queue for s in specs})})
    return [Enqueued(job_id, True) for job_id in ids]


def _match_inserted(chunk: Sequence[JobSpec], rows: list[Row]) -> list[Enqueued]:
    """Pair inserted rows with the specs they came from. Rows come back in
    insertion order (ids increase with it); a spec whose key was taken gets a
    placeholder id -1, resolved by key afterwards."""
    inserted = iter(rows)
    keyed = {row["idempotency_key"]: row["id"] for row in rows if row["idempotency_key"]}
    taken: set[str] = set()
    matched = []
    for spec in chunk:
        key = spec.idempotency_key
        if key is None:
            matched.append(Enqueued(_next_unkeyed(inserted), True))
        elif key in keyed and key not in taken:
            taken.add(key)
            matched.append(Enqueued(keyed[key], True))
        else:
            matched.append(Enqueued(-1, False))
    return matched


def _next_unkeyed(rows: Iterable[Row]) -> int:
    for row in rows:
        if row["idempotency_key"] is None:
            return int(row["id"])
    raise RuntimeError("bulk insert returned fewer rows than it was given")


# -- the worker's transitions -------------------------------------------------


def claim(
    settings: Settings,
    *,
    limit: int,
    worker: str,
    queues: Sequence[str] | None = None,
    lease_seconds: float | None = None,
) -> Flow[list[Job]]:
    """Claim up to ``limit`` runnable jobs (of ``queues``, or of all)."""
    one_queue = len(queues) == 1 if queues else False
    jobs: list[Job] = yield Statement(
        "job_claim",
        {
            "limit": limit,
            # One queue walks that queue's index; several are a filter.
            "queue": queues[0] if queues and one_queue else None,
            "queues": list(queues) if queues and not one_queue else None,
            "lease_seconds": lease_seconds or settings.lease_seconds,
            "worker": worker,
            "latency_bounds": list(settings.latency_buckets),
        },
        jobs=True,
    )
    return jobs


def heartbeat(held: Sequence[tuple[int, int]], lease_seconds: float) -> Flow[set[int]]:
    """Extend the leases of (id, token) pairs; return the ids still held."""
    if not held:
        return set()
    rows = yield Statement(
        "job_heartbeat",
        {
            "ids": [i for i, _ in held],
            "tokens": [t for _, t in held],
            "lease_seconds": lease_seconds,
        },
    )
    return {row["id"] for row in rows}


def finish(settings: Settings, outcomes: Sequence[Outcome]) -> Flow[dict[int, JobState]]:
    """Record many outcomes; return the new state of each job whose token
    still held. A missing id means the attempt had lost its lease."""
    if not outcomes:
        return {}
    rows = yield Statement(
        "job_finish",
        {
            "ids": [o.job_id for o in outcomes],
            "tokens": [o.token for o in outcomes],
            "succeeded": [o.succeeded for o in outcomes],
            "results": [o.result_json for o in outcomes],
            "errors": [o.error for o in outcomes],
            "retryable": [o.retryable for o in outcomes],
            "backoff_base": settings.backoff_base_seconds,
            "backoff_cap": settings.backoff_cap_seconds,
            "notify_finished": settings.notify_finished,
        },
    )
    return {row["id"]: JobState(row["state"]) for row in rows}


def reap(settings: Settings, limit: int | None = None) -> Flow[dict[int, JobState]]:
    """Take back jobs whose lease expired; return their new states."""
    rows = yield Statement(
        "job_reap",
        {
            "limit": limit or settings.reap_batch,
            "backoff_base": settings.backoff_base_seconds,
            "backoff_cap": settings.backoff_cap_seconds,
        },
    )
    return {row["id"]: JobState(row["state"]) for row in rows}


def prune(settings: Settings, limit: int | None = None) -> Flow[int]:
    """Delete finished jobs past retention, up to ``limit``; return how many."""
    rows = yield Statement(
        "job_prune",
        {"retention_seconds": settings.retention_seconds, "limit": limit or settings.prune_batch},
    )
    return int(rows[0]["pruned"])


def next_run_in(queues: Sequence[str] | None) -> Flow[float | None]:
    """Seconds until the earliest queued job becomes runnable (None: none)."""
    rows = yield Statement("job_next_run_at", {"queues": list(queues) if queues else None})
    seconds = rows[0]["seconds"]
    return None if seconds is None else float(seconds)


# -- operators' transitions -----------------------------------------------------


def get(job_id: int) -> Flow[Job]:
    jobs: list[Job] = yield Statement("job_get", {"id": _job_id(job_id)}, jobs=True)
    if not jobs:
        raise JobNotFound(job_id)
    return jobs[0]


def cancel(job_id: int) -> Flow[Job]:
    """Cancel a queued or running job (revoking its lease)."""
    jobs: list[Job] = yield Statement("job_cancel", {"id": _job_id(job_id)}, jobs=True)
    if jobs:
        return jobs[0]
    job = yield from get(job_id)
    raise JobAlreadyFinished(job_id, job.state, "cancel")


def retry(job_id: int) -> Flow[Job]:
    """Put a dead or cancelled job back to queued with a fresh attempt
    budget; JobKeyHeld when another job holds its key now."""
    for _ in range(KEY_ROUNDS):
        try:
            jobs: list[Job] = yield Statement("job_retry", {"id": _job_id(job_id)}, jobs=True)
        except KeyTaken:
            jobs = []  # taken as we retried: look again
        if jobs:
            return jobs[0]
        job = yield from get(job_id)
        if job.state in (JobState.DEAD, JobState.CANCELLED) and job.idempotency_key:
            holders: list[Job] = yield Statement(
                "job_get_by_idempotency_key", {"idempotency_key": job.idempotency_key}, jobs=True
            )
            if holders:
                raise JobKeyHeld(job_id, job.state, job.idempotency_key, holders[0].id)
            continue  # the holder let the key go meanwhile
        raise JobNotRetryable(job_id, job.state, "retry")
    raise RuntimeError(f"the key of job {job_id} kept changing hands")


def list_jobs(
    *,
    state: str | None = None,
    queue: str | None = None,
    task: str | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> Flow[list[Job]]:
    """Newest first; pass the last id of a page as ``before_id`` for the next."""
    if state is not None and state not in set(JobState):
        raise InvalidJob("state", f"must be one of {', '.join(JobState)}, got {state!r}")
    if not 1 <= limit <= 1000:
        raise InvalidJob("limit", f"must be between 1 and 1000, got {limit}")
    jobs: list[Job] = yield Statement(
        "job_list",
        {
            "state": state,
            "queue": queue,
            "task": task,
            "before_id": None if before_id is None else _job_id(before_id),
            "limit": limit,
        },
        jobs=True,
    )
    return jobs


def _job_id(job_id: Any) -> int:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 1 <= job_id < 2**63:
        raise JobNotFound(job_id)
    return job_id


def read(name: str, **params: Any) -> Flow[list[Row]]:
    """Run a read-only named query and return its rows (stats, metrics)."""
    rows = yield Statement(name, params)
    return rows


def schema_pending() -> Flow[list[str]]:
    """The migrations this code needs that the database has not applied
    (every one of them when it was never migrated); empty when up to date."""
    rows = yield Statement("migration_table_exists", {})
    applied: set[str] = set()
    if rows[0]["present"]:
        rows = yield Statement("migration_applied", {})
        applied = {row["version"] for row in rows}
    return [version for version in migration_versions() if version not in applied]
