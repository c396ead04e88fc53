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
import random
from collections import Counter
from collections.abc import Collection, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .checks import printable
from .errors import InvalidJob, JobAlreadyFinished, JobNotFound, JobNotRetryable
from .jobs import Job, JobSpec, JobState, dump_json
from .settings import Settings
from .sql import migration_versions

__all__ = [
    "Flow",
    "Outcome",
    "Statement",
    "Wake",
    "cancel",
    "claim",
    "enqueue",
    "enqueue_many",
    "finish",
    "get",
    "heartbeat",
    "list_jobs",
    "next_wake",
    "prune",
    "queues_with_jobs",
    "reap",
    "retry",
    "retry_dead",
    "round_robin",
    "schema_pending",
]

Row = dict[str, Any]
T = TypeVar("T")
# Chunk of a bulk enqueue sent as one statement: large enough to amortise the
# round trip, small enough to keep the parameter arrays in a few MB.
ENQUEUE_CHUNK = 5000


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
        "concurrency_key": spec.concurrency_key,
    }


def enqueue(spec: JobSpec) -> Flow[Job]:
    """Insert a job, or return the one that already holds its idempotency key."""
    params = _spec_params(spec)
    # A conflicting insert may be in flight in another transaction: ON
    # CONFLICT waits for it, and if it rolled back our insert goes ahead on
    # the next try. Two rounds always settle it under READ COMMITTED.
    for _ in range(3):
        jobs: list[Job] = yield Statement("job_enqueue", params, jobs=True)
        if jobs:
            return jobs[0]
        jobs = yield Statement(
            "job_get_by_idempotency_key", {"idempotency_key": spec.idempotency_key}, jobs=True
        )
        if jobs:
            return dataclasses.replace(jobs[0], duplicate=True)
    raise RuntimeError(f"idempotency key {spec.idempotency_key!r} kept changing hands")


@dataclass(frozen=True, slots=True)
class Enqueued:
    """Per job of a bulk enqueue: its id and whether this call created it."""

    id: int
    created: bool


def enqueue_many(specs: Sequence[JobSpec], *, copy: bool = True) -> Flow[list[Enqueued]]:
    """Insert many jobs; results in input order. Plain jobs (runnable now, no
    idempotency key) go in by COPY when ``copy``; others by INSERT, a few
    thousand per statement, skipping taken keys."""
    if copy and all(_plain(spec) for spec in specs):
        return (yield from _copy_many(specs))
    results: list[Enqueued] = []
    for start in range(0, len(specs), ENQUEUE_CHUNK):
        chunk = specs[start : start + ENQUEUE_CHUNK]
        columns: dict[str, list[Any]] = {name: [] for name in _spec_params(chunk[0])}
        for spec in chunk:
            for name, value in _spec_params(spec).items():
                columns[name].append(value)
        rows = yield Statement("job_enqueue_many", columns)
        results.extend(_match_inserted(chunk, rows))
        missing = [r for r in results[start:] if r.id < 0]
        if missing:
            keys = [spec.idempotency_key for spec in chunk]
            found = yield Statement(
                "job_ids_by_idempotency_keys", {"idempotency_keys": [k for k in keys if k]}
            )
            by_key = {row["idempotency_key"]: row["id"] for row in found}
            for offset, spec in enumerate(chunk):
                if results[start + offset].id < 0:
                    results[start + offset] = Enqueued(by_key[spec.idempotency_key], False)
    return results


def _plain(spec: JobSpec) -> bool:
    return spec.idempotency_key is None and spec.run_at is None and not spec.delay_seconds


def _copy_many(specs: Sequence[JobSpec]) -> Flow[list[Enqueued]]:
    rows = yield Statement("job_reserve_ids", {"count": len(specs)})
    ids: list[int] = rows[0]["ids"]
    yield Statement(
        "job_copy",
        {},
        copy_rows=[
            (
                job_id,
                s.queue,
                s.task,
                s.payload_json,
                s.priority,
                s.max_attempts,
                s.timeout_seconds,
                s.concurrency_key,
            )
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
    turn: int | None = None,
    sparse: Collection[str] = (),
    lease_seconds: float | None = None,
) -> Flow[list[Job]]:
    """Claim up to ``limit`` runnable jobs of ``queues`` (None: of every
    queue that has queued jobs), round-robin: each queue gets an equal share
    of ``limit``; ``turn`` says which queues get the remainder (None: chosen
    at random); ``sparse`` queues (those that gave nothing last time) are
    asked for one job each first, and what they do not take, the others do;
    what a queue cannot fill goes to those that filled theirs. A paused
    queue gives nothing; a limited queue, what its limits allow."""
    names = list(dict.fromkeys(queues)) if queues is not None else (yield from queues_with_jobs())
    turn = random.randrange(len(names) or 1) if turn is None else turn
    jobs: list[Job] = []
    while names and len(jobs) < limit:
        shares = round_robin(limit - len(jobs), names, turn, sparse)
        batch: list[Job] = yield Statement(
            "job_claim",
            {
                "limit": limit - len(jobs),
                "queues": list(shares),
                "shares": list(shares.values()),
                "lease_seconds": lease_seconds or settings.lease_seconds,
                "worker": worker,
                "latency_bounds": list(settings.latency_buckets),
            },
            jobs=True,
        )
        jobs.extend(batch)
        if len(jobs) >= limit:
            break
        got = Counter(job.queue for job in batch)
        # A queue that filled its share may have more; one that did not has
        # no more to give now; one that had no share (fewer slots than
        # queues) has not been asked yet.
        names = [name for name in names if got[name] >= shares.get(name, 0)]
        turn += 1
    return jobs


def round_robin(
    slots: int, queues: Sequence[str], turn: int, sparse: Collection[str] = ()
) -> dict[str, int]:
    """Each queue's share of ``slots``, in the order the claim asks them:
    the ``sparse`` ones first, one slot each; then the others, who split all
    of ``slots`` as evenly as can be (the one at ``turn``, modulo, and those
    after it get the remainder). The claim stops at ``slots``, so that the
    slots a sparse queue does not take go to the others in the same
    statement. Queues whose share is 0 are left out."""
    start = turn % len(queues)
    order = [*queues[start:], *queues[:start]]
    few = [name for name in order if name in sparse]
    many = [name for name in order if name not in sparse] or few
    shares = {name: 1 for name in few[:slots] if many is not few}
    each, extra = divmod(slots, len(many))
    shares.update({name: each + (i < extra) for i, name in enumerate(many) if each + (i < extra)})
    return shares


def queues_with_jobs() -> Flow[list[str]]:
    """The queues that have queued jobs (runnable or not), by name."""
    rows = yield Statement("queue_names_queued", {})
    return [row["queue"] for row in rows]


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
    """Put a dead or cancelled job back to queued with a fresh attempt budget."""
    jobs: list[Job] = yield Statement("job_retry", {"id": _job_id(job_id)}, jobs=True)
    if jobs:
        return jobs[0]
    job = yield from get(job_id)
    raise JobNotRetryable(job_id, job.state, "retry")


def retry_dead(queue: str | None = None) -> Flow[int]:
    rows = yield Statement("job_retry_dead", {"queue": queue})
    return int(rows[0]["retried"])


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
