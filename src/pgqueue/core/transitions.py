"""The job state machine: one function per transition, free of I/O.

Each transition is a generator that yields the statements to run (a query
name from ``sql/queries.sql`` and its parameters) and receives their rows;
its return value is the transition's result. The sync ``Queue`` and the
async ``AsyncQueue`` drive the same generators, so the two faces cannot
drift apart, and the worker runtime uses the same ones.

    enqueue ──> (waiting: for the jobs it depends on; released by their end)
       └──────> queued ──claim──> running ──finish(ok)──> succeeded
                  ^                │ └─finish(error) or reap, attempts left─> queued (backoff)
                  │                ├───finish(error) or reap, none left─────> dead
                  │                ├───finish(snooze): attempt given back───> queued (delay)
                  │                └───finish(cancel): the handler's────────> cancelled
                  └──retry── dead, cancelled <──cancel── queued, running
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from ..sql import migration_versions
from .enqueue import KEY_ROUNDS, Enqueued, enqueue, enqueue_many
from .errors import (
    InvalidJob,
    JobAlreadyFinished,
    JobKeyHeld,
    JobNotFound,
    JobNotRetryable,
    KeyTaken,
)
from .flows import Flow, Row, Statement, db_now
from .jobs import STATES, Job, JobState, dump_json
from .outcomes import snooze_seconds
from .rules import printable
from .settings import Settings

__all__ = [
    "Enqueued",
    "Flow",
    "Outcome",
    "Statement",
    "Wake",
    "cancel",
    "claim",
    "db_now",
    "enqueue",
    "enqueue_many",
    "finish",
    "finish_groups",
    "forget_waits",
    "get",
    "health",
    "heartbeat",
    "list_jobs",
    "next_wake",
    "prune",
    "queues_with_jobs",
    "reap",
    "release",
    "retry",
    "round_robin",
    "schema_pending",
    "watch",
]

T = TypeVar("T")

# A wait's registration (watch) lasts at most this long: a longer wait falls
# back to re-reading its job every second after that.
WATCH_MAX_SECONDS = 24 * 3600.0


class Outcome(NamedTuple):
    """How one attempt ended, fenced by the token of its claim: a success, a
    failure, or what its handler asked for (a snooze, a cancel). Make one
    with the constructors below. (A named tuple, not a frozen dataclass: the
    worker makes one per job, in a third of the time.)"""

    job_id: int
    token: int
    succeeded: bool
    result_json: str | None = None
    error: str | None = None  # a failure's error, or a cancel's reason
    retryable: bool = True
    snooze_seconds: float | None = None  # a snooze: queued again after this long
    cancelled: bool = False  # the handler cancelled the job

    @classmethod
    def success(cls, job: Job, result: Any) -> Outcome:
        """A success, unless the result cannot be stored: then a failed attempt."""
        try:
            # (None, what most handlers return, needs no encoder: a job's cost)
            text = "null" if result is None else dump_json(result, "result")
        except InvalidJob as exc:
            return cls.failure(job, f"handler returned a result PostgreSQL cannot store: {exc}")
        return cls(job.id, _token(job), True, result_json=text)

    @classmethod
    def failure(cls, job: Job, error: str, *, retryable: bool = True) -> Outcome:
        return cls(job.id, _token(job), False, error=_storable(error), retryable=retryable)

    @classmethod
    def snooze(
        cls, job: Job, seconds: float, *, max_snoozes: int | None = None, error: str | None = None
    ) -> Outcome:
        """Queued again after ``seconds``, the attempt given back (``error``:
        why, kept as last_error; None leaves it). A job that already snoozed
        ``max_snoozes`` times (None: no bound) is dead instead, so that a job
        waiting for something that never comes ends visibly."""
        seconds = snooze_seconds(seconds)
        if max_snoozes is not None and job.snoozes >= max_snoozes:
            return cls.failure(
                job,
                f"asked to snooze ({seconds:g} s) after {job.snoozes} snoozes, the most "
                f"allowed (max_snoozes {max_snoozes}): giving up",
                retryable=False,
            )
        text = None if error is None else _storable(error)
        return cls(job.id, _token(job), False, error=text, snooze_seconds=seconds)

    @classmethod
    def cancel(cls, job: Job, reason: str) -> Outcome:
        """Cancelled at its handler's request: no retry, ``reason`` kept as last_error."""
        return cls(job.id, _token(job), False, error=_storable(reason), cancelled=True)


def _storable(text: str) -> str:
    # jsonb is not involved, but text columns refuse NUL and lone surrogates
    # as well (an exception's text may quote either).
    return printable(text).replace("\x00", "\\0")


def _token(job: Job) -> int:
    if job.lease_token is None:
        raise ValueError(f"job {job.id} was not claimed: it has no lease token")
    return job.lease_token


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


def release(held: Sequence[tuple[int, int]]) -> Flow[set[int]]:
    """Give back claimed jobs that never started, (id, token) pairs: queued
    again at once, the attempt not counted; return the ids given back."""
    if not held:
        return set()
    rows = yield Statement(
        "job_release", {"ids": [i for i, _ in held], "tokens": [t for _, t in held]}
    )
    return {row["id"] for row in rows}


def finish(settings: Settings, outcomes: Sequence[Outcome]) -> Flow[dict[int, JobState]]:
    """Record many outcomes, one statement per group of ``finish_groups``;
    return the new state of each job whose token still held. A missing id
    means the attempt had lost its lease."""
    rows: list[Row] = []
    for group in finish_groups(outcomes):
        rows += yield _finish_statement(settings, group)
    return {row["id"]: STATES[row["state"]] for row in rows}


def finish_groups(outcomes: Sequence[Outcome]) -> list[Sequence[Outcome]]:
    """Outcomes by the statement that writes them: successes and failures
    (job_finish) first, then snoozes (job_snooze), then cancels
    (job_cancel_held). Usually one group, the outcomes as given: the
    statements handlers ask for cost job_finish nothing."""
    if not any(o.snooze_seconds is not None or o.cancelled for o in outcomes):
        return [outcomes] if outcomes else []
    snoozes = [o for o in outcomes if o.snooze_seconds is not None]
    cancels = [o for o in outcomes if o.cancelled]
    ended = [o for o in outcomes if o.snooze_seconds is None and not o.cancelled]
    return [group for group in (ended, snoozes, cancels) if group]


def _finish_statement(settings: Settings, group: Sequence[Outcome]) -> Statement:
    """The statement that writes one group of ``finish_groups``."""
    fenced = {"ids": [o.job_id for o in group], "tokens": [o.token for o in group]}
    if group[0].snooze_seconds is not None:
        return Statement(
            "job_snooze",
            {
                **fenced,
                "seconds": [o.snooze_seconds for o in group],
                "errors": [o.error for o in group],
            },
        )
    if group[0].cancelled:
        return Statement(
            "job_cancel_held",
            {
                **fenced,
                "reasons": [o.error for o in group],
                "notify_finished": settings.notify_finished,
            },
        )
    return Statement(
        "job_finish",
        {
            **fenced,
            "succeeded": [o.succeeded for o in group],
            "results": [o.result_json for o in group],
            "errors": [o.error for o in group],
            "retryable": [o.retryable for o in group],
            "backoff_base": settings.backoff_base_seconds,
            "backoff_cap": settings.backoff_cap_seconds,
            "notify_finished": settings.notify_finished,
        },
    )


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
    return {row["id"]: STATES[row["state"]] for row in rows}


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


def watch(job_id: int, seconds: float) -> Flow[Job]:
    """wait()'s first read of a job: unless the job has ended, the statement
    that ends it will notify ``pgqueue_finished`` (for ``seconds`` at most;
    the ends of jobs nobody watches notify nobody)."""
    seconds = min(seconds, WATCH_MAX_SECONDS) if seconds > 0 else 0.0
    jobs: list[Job] = yield Statement(
        "job_watch", {"id": _job_id(job_id), "seconds": seconds}, jobs=True
    )
    if not jobs:
        raise JobNotFound(job_id)
    return jobs[0]


def forget_waits() -> Flow[None]:
    """Delete the registrations of waiters past their timeout."""
    yield Statement("wait_prune", {})


def cancel(job_id: int) -> Flow[Job]:
    """Cancel a waiting, queued or running job (revoking its lease); its
    dependents follow their policies."""
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


# What a listing may filter on beyond a job's states: queued jobs waiting for
# a future run_at, and queued jobs that failed before (in backoff or due).
LIST_VIEWS = ("scheduled", "retrying")
MAX_ERROR_SEARCH = 1000


def list_filters(
    *,
    state: str | None = None,
    queue: str | None = None,
    task: str | None = None,
    error_contains: str | None = None,
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
    return {
        "state": JobState.QUEUED.value if state in LIST_VIEWS else state,
        "scheduled": state == "scheduled",
        "retrying": state == "retrying",
        "queue": queue,
        "task": task,
        "error_contains": error_contains,
        "before_id": None if before_id is None else _job_id(before_id),
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


def _job_id(job_id: Any) -> int:
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
