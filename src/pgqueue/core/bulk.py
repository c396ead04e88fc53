"""Bulk actions: cancel, retry or delete every job a filter matches.

Free of I/O, like transitions.py: ``bulk`` is a flow that the queue runs.
Each batch is one statement (``job_bulk_cancel``, ``job_bulk_finished``) of
at most ``BULK_BATCH`` jobs in its own transaction, so that no lock is held
for long; the flow repeats it until the jobs that match are done.

    cancel   waiting, queued and running jobs (a running job's lease is revoked;
             dependents follow their policies)
    retry    dead and cancelled jobs, back to queued with a fresh attempt
             budget (a job whose key another job holds now is left as it is)
    delete   finished jobs: succeeded, dead, cancelled

``JobFilter`` is what they act on; its fields (``FILTER_FIELDS``) are checked
by the same rules as a job's, for the library, the HTTP API and the command
line alike. A filter without any field reaches every job the action applies
to, so an action on one must say so (``all``): a body or a call that lost
its filter on the way must not empty the queue. Counting (a dry run) needs
no such word.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .errors import InvalidJob, KeyTaken
from .flows import Flow, Statement, db_now
from .job_spec import JobField
from .jobs import MAX_DELAY_SECONDS, QUEUE_NAME, TASK_NAME, JobState
from .rules import Cutoff, JobIds, Key, Name, OneOf

__all__ = [
    "BULK_BATCH",
    "FILTER_FIELDS",
    "BulkAction",
    "DeadGroup",
    "DeadLetters",
    "JobFilter",
    "bulk",
    "dead_letters",
    "retry_dead",
]

# Jobs per statement: large enough that a flood of 100,000 jobs takes 100
# statements, small enough that each holds its row locks for milliseconds.
BULK_BATCH = 1000
MAX_ERROR_TEXT = 1000


class BulkAction(enum.StrEnum):
    """What a bulk action does to the jobs its ``JobFilter`` matches:
    cancel waiting, queued or running ones, retry dead or cancelled ones, delete
    finished ones (``Queue.bulk_cancel``, ``bulk_retry``, ``bulk_delete``)."""

    CANCEL = "cancel"
    RETRY = "retry"
    DELETE = "delete"

    @property
    def states(self) -> tuple[JobState, ...]:
        """The states of the jobs this action applies to."""
        return _ACTION_STATES[self]


_ACTION_STATES = {
    BulkAction.CANCEL: (JobState.WAITING, JobState.QUEUED, JobState.RUNNING),
    BulkAction.RETRY: (JobState.DEAD, JobState.CANCELLED),
    BulkAction.DELETE: (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED),
}

_AGE = "(a time, or a number of seconds before the database's now)"
FILTER_FIELDS: tuple[JobField, ...] = (
    JobField("queue", Name(QUEUE_NAME), "Only jobs of this queue."),
    JobField("task", Name(TASK_NAME), "Only jobs of this task."),
    JobField(
        "state",
        OneOf(tuple(JobState)),
        "Only jobs in this state (one the action applies to).",
    ),
    JobField(
        "enqueued_before",
        Cutoff(MAX_DELAY_SECONDS),
        f"Only jobs enqueued before this {_AGE}.",
    ),
    JobField(
        "finished_before",
        Cutoff(MAX_DELAY_SECONDS),
        f"Only jobs that finished before this {_AGE}; not for cancel.",
    ),
    JobField(
        "error_contains",
        Key(MAX_ERROR_TEXT),
        "Only jobs whose last error contains this text (case-sensitive).",
    ),
    JobField(
        "error_kind",
        Key(MAX_ERROR_TEXT),
        "Only jobs whose last error is of this kind: its first line with ids replaced by "
        "<id> and numbers by <n> (a dead-letter group's error).",
    ),
    JobField(
        "ids",
        JobIds(BULK_BATCH),
        f"Only these jobs (a selection of at most {BULK_BATCH}).",
    ),
)
_NAMES = tuple(f.name for f in FILTER_FIELDS)


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs a bulk action applies to: every field given must match.
    No field: every job the action applies to, which an action (not a dry
    run) takes only with ``all=True``. Checked when made; a bad field
    raises InvalidJob naming it."""

    queue: str | None = None
    task: str | None = None
    state: str | None = None
    enqueued_before: datetime | timedelta | float | None = None
    finished_before: datetime | timedelta | float | None = None
    error_contains: str | None = None
    error_kind: str | None = None
    ids: tuple[int, ...] | list[int] | None = None
    all: bool = False

    def __post_init__(self) -> None:
        for job_field in FILTER_FIELDS:
            value = getattr(self, job_field.name)
            if value is not None:
                object.__setattr__(
                    self, job_field.name, job_field.rule.check(job_field.name, value)
                )
        if not isinstance(self.all, bool):
            raise InvalidJob("all", f"must be true or false, got {self.all!r}")

    @property
    def unbounded(self) -> bool:
        """No field given: the filter matches every job an action applies to."""
        return all(getattr(self, name) is None for name in _NAMES)

    def check_scope(self, action: BulkAction) -> None:
        """Refuse an action on every job it applies to unless ``all`` says so."""
        if self.unbounded and not self.all:
            raise InvalidJob(
                "all",
                f"no filter given: this would {action} every {' or '.join(action.states)} job; "
                "give a filter, or all (true) to mean every one",
            )

    @classmethod
    def from_fields(cls, given: Mapping[str, Any]) -> JobFilter:
        """A filter from a mapping of its fields and ``all`` (HTTP bodies,
        keywords)."""
        for name in given:
            if name not in (*_NAMES, "all"):
                raise InvalidJob(str(name), f"unknown filter (the filters are {', '.join(_NAMES)})")
        return cls(**given)


def bulk(
    action: BulkAction, where: JobFilter, *, dry_run: bool = False, batch: int = BULK_BATCH
) -> Flow[int]:
    """Apply ``action`` to every job ``where`` matches, ``batch`` jobs per
    statement; the number of jobs it changed. With ``dry_run``, the number
    of jobs it would apply to now, and nothing changes."""
    if not 1 <= batch <= 10_000:
        raise ValueError(f"batch must be between 1 and 10000, got {batch}")
    if not dry_run:
        where.check_scope(action)
    states = _states(action, where)
    started_at = yield from db_now()
    name = "job_bulk_cancel" if action is BulkAction.CANCEL else "job_bulk_finished"
    params = {
        "action": str(action),
        "states": states,
        "started_at": started_at,
        "dry_run": dry_run,
        "limit": None if dry_run else batch,
        "after_at": None,
        "after_id": None,
        "queue": where.queue,
        "task": where.task,
        "enqueued_before": _moment(where.enqueued_before, started_at),
        "finished_before": _moment(where.finished_before, started_at),
        "error_contains": where.error_contains,
        "error_kind": where.error_kind,
        "ids": None if where.ids is None else list(where.ids),
    }
    total = yield from _batches(name, params, action, dry_run, batch)
    if action is BulkAction.DELETE and JobState.SUCCEEDED in states:
        # Then the succeeded jobs the archive holds (migration 0034).
        total += yield from _batches("job_bulk_archived", params, action, dry_run, batch)
    return total


def _batches(
    name: str, params: dict[str, Any], action: BulkAction, dry_run: bool, batch: int
) -> Flow[int]:
    """Run the statement of one table's part of a bulk action until it is
    done: the jobs changed (with ``dry_run``, the jobs matching)."""
    total = 0
    while True:
        try:
            rows = yield Statement(name, params)
        except KeyTaken:
            continue  # a key was taken as this batch retried its job: the next skips it
        row = rows[0]
        if dry_run:
            return int(row["matched"])
        total += int(row["affected"])
        if not _more(action, row, batch):
            return total
        # Finished jobs go in order: the next batch starts after this one.
        params = {**params, "after_at": row.get("last_at"), "after_id": row.get("last_id")}


def _more(action: BulkAction, batch_row: dict[str, Any], batch: int) -> bool:
    """Whether another batch may find more. A cancel goes on while batches
    cancel something: jobs that a worker held were skipped and are looked at
    again, and one a lock holds for good cannot keep it going. Retry and
    delete walk the finished jobs once, in order: they end at the first batch
    that did not fill up."""
    if action is BulkAction.CANCEL:
        return int(batch_row["affected"]) > 0
    return int(batch_row["matched"]) >= batch


def retry_dead(queue: str | None = None) -> Flow[int]:
    """Put every dead job (of one queue, or of all) back to queued."""
    return (yield from bulk(BulkAction.RETRY, JobFilter(queue=queue, state=JobState.DEAD)))


# Dead letters: groups of dead jobs by task and the kind of their error, each
# one bulk action away from being retried or deleted. Bounded twice: the
# newest DEAD_SCAN dead jobs are grouped, and at most `limit` groups are
# returned.
DEAD_SCAN = 100_000
# The length of an error's kind (the cut of pgqueue_error_kind, migration 0024).
DEAD_ERROR_CHARS = 200


@dataclass(frozen=True, slots=True)
class DeadGroup:
    """Dead jobs of one task whose last errors are of one kind: the same
    first line but for ids and numbers."""

    task: str
    error: str  # the kind: the first line, ids as <id> and numbers as <n>, cut to DEAD_ERROR_CHARS
    jobs: int
    queues: list[str]
    first_at: datetime
    last_at: datetime
    latest_id: int

    def where(self) -> JobFilter:
        """The filter of a bulk action on the group: the task's dead jobs
        whose last error is of the group's kind (the jobs of a group without
        an error: every dead job of the task)."""
        return JobFilter(task=self.task, state=JobState.DEAD, error_kind=self.error or None)


@dataclass(frozen=True, slots=True)
class DeadLetters:
    groups: list[DeadGroup]
    scanned: int  # dead jobs grouped (the newest, up to DEAD_SCAN)
    group_count: int  # groups among them, before `limit`


def dead_letters(*, limit: int = 50, scan: int = DEAD_SCAN) -> Flow[DeadLetters]:
    """The biggest groups of dead jobs first (then the most recent)."""
    if not 1 <= limit <= 500:
        raise InvalidJob("limit", f"must be between 1 and 500, got {limit}")
    rows = yield Statement("job_dead_groups", {"limit": limit, "scan": scan})
    groups = [DeadGroup(**{k: row[k] for k in _GROUP_COLUMNS}) for row in rows]
    scanned = int(rows[0]["scanned"]) if rows else 0
    return DeadLetters(groups, scanned, int(rows[0]["group_count"]) if rows else 0)


_GROUP_COLUMNS = ("task", "error", "jobs", "queues", "first_at", "last_at", "latest_id")


def _states(action: BulkAction, where: JobFilter) -> list[str]:
    """The states the action applies to, narrowed by the filter's."""
    allowed = action.states
    names = " or ".join(allowed)
    if where.finished_before is not None and not all(s.finished for s in allowed):
        raise InvalidJob("finished_before", f"{action} applies to {names} jobs, not finished ones")
    if where.state is None:
        return [str(state) for state in allowed]
    if where.state not in allowed:
        raise InvalidJob("state", f"{action} applies to {names} jobs, not {where.state}")
    return [where.state]


def _moment(cutoff: datetime | timedelta | float | None, now: datetime) -> datetime | None:
    """A cutoff as a moment: an age counts back from the database's now."""
    if isinstance(cutoff, timedelta):
        return now - cutoff
    assert cutoff is None or isinstance(cutoff, datetime)  # __post_init__ made it one
    return cutoff
