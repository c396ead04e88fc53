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

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .errors import (
    KEY_ROUNDS,
    JobAlreadyFinished,
    JobKeyHeld,
    JobNotRetryable,
    KeyTaken,
    StaleAttempt,
)
from .flows import Flow, Row, Statement
from .jobs import STATES, Job, JobState
from .outcomes import Outcome
from .randomness import chance
from .reads import checked_job_id, get, queues_with_jobs, start_lags
from .settings import Settings

__all__ = [
    "OBJECTIVE_MARGIN",
    "CancelNotice",
    "Report",
    "age_priorities",
    "behind",
    "cancel",
    "claim",
    "complete",
    "finish",
    "finish_groups",
    "heartbeat",
    "prune",
    "reap",
    "release",
    "report_progress",
    "retry",
    "round_robin",
]


# A queue whose oldest runnable job has waited this part of its latency
# objective is asked first, for every slot: early enough that, while the
# workers can catch up, its jobs start within the objective.
OBJECTIVE_MARGIN = 0.5

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
    caps: Mapping[str, int] | None = None,
    objectives: Mapping[str, float] | None = None,
) -> Flow[list[Job]]:
    """Claim up to ``limit`` runnable jobs of ``queues`` (None: of every
    queue that has queued jobs), round-robin: each queue gets an equal share
    of ``limit``; ``turn`` says which queues get the remainder (None: chosen
    at random); ``sparse`` queues (those that gave nothing last time) are
    asked for one job each first, and what they do not take, the others do;
    what a queue cannot fill goes to those that filled theirs. A paused
    queue gives nothing; a limited queue, what its limits allow.

    ``caps``: a queue named there is asked for at most that many jobs, once
    (the worker keeps a fair queue's claims short). ``objectives``: latency
    objectives (seconds, by queue): their queues' lags are read first, and
    those at least OBJECTIVE_MARGIN of the way to their objective are asked
    first, for every slot, the furthest behind first (``behind``)."""
    names = list(dict.fromkeys(queues)) if queues is not None else (yield from queues_with_jobs())
    turn = chance.randrange(len(names) or 1) if turn is None else turn
    caps, objectives = caps or {}, objectives or {}
    first: list[str] = []
    if watched := [name for name in names if name in objectives]:
        first = behind((yield from start_lags(watched)), objectives)
    jobs: list[Job] = []
    while names and len(jobs) < limit:
        shares = round_robin(limit - len(jobs), names, turn, sparse, first=first, caps=caps)
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
        # queues) has not been asked yet; a capped one was asked once.
        names = [
            name
            for name in names
            if got[name] >= shares.get(name, 0) and not (name in caps and name in shares)
        ]
        turn += 1
    return jobs


def round_robin(
    slots: int,
    queues: Sequence[str],
    turn: int,
    sparse: Collection[str] = (),
    *,
    first: Sequence[str] = (),
    caps: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Each queue's share of ``slots``, in the order the claim asks them:
    the ``first`` ones (queues behind their latency objective), each for
    every slot; the ``sparse`` ones, one slot each; then the others, who
    split all of ``slots`` as evenly as can be (the one at ``turn``, modulo,
    and those after it get the remainder). The claim stops at ``slots``, so
    that the slots a queue does not take go to those after it in the same
    statement. A queue in ``caps`` gets at most its cap. Queues whose share
    is 0 are left out."""
    start = turn % len(queues)
    order = [*queues[start:], *queues[:start]]
    few = [name for name in order if name in sparse]
    many = [name for name in order if name not in sparse] or few
    shares = {name: slots for name in first if name in order}
    shares.update({name: 1 for name in few[:slots] if many is not few and name not in shares})
    each, extra = divmod(slots, len(many))
    shares.update(
        {
            name: each + (i < extra)
            for i, name in enumerate(many)
            if each + (i < extra) and name not in shares
        }
    )
    if caps:
        shares = {name: min(share, caps.get(name, share)) for name, share in shares.items()}
    return shares


def behind(lags: Mapping[str, float], objectives: Mapping[str, float]) -> list[str]:
    """The queues at least OBJECTIVE_MARGIN of the way to their latency
    objective (``lags``: how long each one's oldest runnable job has
    waited), the furthest behind first (lag / objective)."""
    ratios = {
        name: lag / objectives[name]
        for name, lag in lags.items()
        if name in objectives and lag >= OBJECTIVE_MARGIN * objectives[name] and lag > 0
    }
    return sorted(ratios, key=lambda name: (-ratios[name], name))


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


class Report(NamedTuple):
    """A handler's latest progress report (job.progress()), for its attempt."""

    job_id: int
    token: int
    fraction: float
    info_json: str | None


def report_progress(reports: Sequence[Report]) -> Flow[set[int]]:
    """Write the progress of many running jobs, each fenced by its token
    (waiters of those jobs are woken); return the ids written."""
    rows = yield Statement(
        "job_progress",
        {
            "ids": [r.job_id for r in reports],
            "tokens": [r.token for r in reports],
            "fractions": [r.fraction for r in reports],
            "infos": [r.info_json for r in reports],
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


def complete(settings: Settings, job_id: int, token: int, result_json: str) -> Flow[None]:
    """Complete one attempt as a success inside its handler's own
    transaction (``job.transaction()``): job_finish, fenced by the token,
    so that the handler's writes commit only with it; StaleAttempt (which
    rolls the transaction back) when the token no longer holds."""
    outcome = Outcome(job_id, token, True, result_json=result_json)
    states = yield from finish(settings, [outcome])
    if job_id not in states:
        raise StaleAttempt(job_id, token)


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


def age_priorities(settings: Settings, limit: int | None = None) -> Flow[list[int]]:
    """Raise by one the priority of the queued jobs of negative priority
    that waited ``priority_aging_seconds`` since they became runnable or
    last rose (up to ``limit``); return their ids."""
    rows = yield Statement(
        "job_age_priorities",
        {
            "aging_seconds": settings.priority_aging_seconds,
            "limit": limit or settings.priority_aging_batch,
        },
    )
    return [row["id"] for row in rows]


def prune(settings: Settings, limit: int | None = None) -> Flow[int]:
    """Delete finished jobs past retention, up to ``limit``; return how many."""
    rows = yield Statement(
        "job_prune",
        {"retention_seconds": settings.retention_seconds, "limit": limit or settings.prune_batch},
    )
    return int(rows[0]["pruned"])


@dataclass(frozen=True, slots=True)
class CancelNotice:
    """The running attempts a cancel ended, (job id, lease token) each: what
    the cancels (``cancel``, bulk, workflow) notify on ``pgqueue_cancelled``
    at commit (migrations/0022), so that the workers holding them stop
    their handlers."""

    leases: tuple[tuple[int, int], ...]

    @classmethod
    def from_payload(cls, payload: str) -> CancelNotice:
        """Read "id:token,id:token"; a pair that is not two integers is
        left out (nobody but pgqueue_notify_cancelled should write here)."""
        leases = []
        for pair in payload.split(","):
            job_id, _, token = pair.partition(":")
            if job_id.isdecimal() and token.isdecimal():
                leases.append((int(job_id), int(token)))
        return cls(tuple(leases))


def cancel(job_id: int) -> Flow[Job]:
    """Cancel a waiting, queued or running job (revoking its lease, and
    telling its worker: ``CancelNotice``); its dependents follow their
    policies."""
    jobs: list[Job] = yield Statement("job_cancel", {"id": checked_job_id(job_id)}, jobs=True)
    if jobs:
        return jobs[0]
    job = yield from get(job_id)
    raise JobAlreadyFinished(job_id, job.state, "cancel")


def retry(job_id: int) -> Flow[Job]:
    """Put a dead or cancelled job back to queued with a fresh attempt
    budget; JobKeyHeld when another job holds its key now."""
    for _ in range(KEY_ROUNDS):
        try:
            jobs: list[Job] = yield Statement(
                "job_retry", {"id": checked_job_id(job_id)}, jobs=True
            )
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
