"""Batches: jobs grouped while a batch is open, and callback jobs enqueued
exactly once when it is closed and every job of it has ended.

    open_batch   insert the batch (``batch_open``) with its callbacks, each a
                 job's fields checked now: on_success (every job succeeded),
                 on_death (at least one died), on_finish (in any case)
    join         a job enqueued with ``batch`` (JobSpec.batch_id): the
                 enqueue flows first lock the batches their jobs join
                 (``lock_batches`` → ``batch_lock``): BatchNotFound or
                 BatchClosed, and nothing is written; the insert then counts
                 the job in its batch
    close_batch  no job may join any more (``batch_close``); if every job
                 has ended it is finished at once, its callbacks enqueued
    get_batch    the batch, its counters, and its jobs counted by state now

The counting and the callbacks are SQL (migrations/0027_batches.sql,
pgqueue_batch_moved): the statement that ends a batch's last job, or the
close, enqueues them in the same transaction, under the batch row's lock.
No I/O here.
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .errors import BatchClosed, BatchNotFound, InvalidJob
from .flows import Flow, Row, Statement
from .job_spec import JobSpec
from .jobs import MAX_METADATA_BYTES
from .json_text import dump_json, loads_stored

__all__ = [
    "CALLBACKS",
    "Batch",
    "BatchState",
    "Callback",
    "close_batch",
    "get_batch",
    "lock_batches",
    "open_batch",
]

# When each callback runs, in the order they are enqueued.
CALLBACKS = ("on_success", "on_death", "on_finish")

# What a callback is given as: a job's fields (a mapping, as enqueue_many
# takes them), or a JobSpec.
Callback = JobSpec | Mapping[str, Any]


class BatchState(enum.StrEnum):
    """open: jobs may join; closed: none may, its callbacks wait for the last
    job to end; finished: its callbacks are enqueued (once)."""

    OPEN = "open"
    CLOSED = "closed"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch as read back. ``total`` jobs joined it; ``pending`` have not
    ended; ``succeeded``, ``dead`` and ``cancelled`` ended so (its counters,
    frozen once finished, kept when jobs are pruned). ``counts``: its jobs
    by state now (pruned jobs are not there). ``callbacks``: the callback
    jobs' fields by when they run; ``callback_jobs``: the ids of those
    enqueued, once finished."""

    id: uuid.UUID
    state: BatchState
    total: int
    pending: int
    succeeded: int
    dead: int
    cancelled: int
    counts: dict[str, int] = field(default_factory=dict)
    callbacks: dict[str, dict[str, Any]] = field(default_factory=dict)
    callback_jobs: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None
    created_at: datetime | None = None
    closed_at: datetime | None = None
    finished_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Row) -> Batch:
        def json_of(value: Any) -> Any:
            return loads_stored(value) if isinstance(value, str) else value

        return cls(
            id=row["id"],
            state=BatchState(row["state"]),
            total=row["total"],
            pending=row["pending"],
            succeeded=row["succeeded"],
            dead=row["dead"],
            cancelled=row["cancelled"],
            counts=dict(json_of(row.get("counts")) or {}),
            callbacks=dict(json_of(row["callbacks"]) or {}),
            callback_jobs=dict(json_of(row["fired"]) or {}),
            metadata=json_of(row["metadata"]),
            created_at=row["created_at"],
            closed_at=row["closed_at"],
            finished_at=row["finished_at"],
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the id as text, datetimes as ISO 8601 strings."""
        return {
            "id": str(self.id),
            "state": str(self.state),
            "total": self.total,
            "pending": self.pending,
            "succeeded": self.succeeded,
            "dead": self.dead,
            "cancelled": self.cancelled,
            "counts": self.counts,
            "callbacks": self.callbacks,
            "callback_jobs": self.callback_jobs,
            "metadata": self.metadata,
            "created_at": _iso(self.created_at),
            "closed_at": _iso(self.closed_at),
            "finished_at": _iso(self.finished_at),
        }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def checked_callbacks(
    callbacks: Mapping[str, Callback | None], default_max_attempts: int
) -> dict[str, dict[str, Any]]:
    """Each callback given (None: none) as the fields pgqueue_batch_fire
    inserts; InvalidJob naming it (``on_success.priority``). A callback job
    runs once, when the batch finishes: it has no key, dependencies, batch
    or run_at (a delay is fine)."""
    checked: dict[str, dict[str, Any]] = {}
    for name, given in callbacks.items():
        if name not in CALLBACKS:
            raise InvalidJob(name, f"unknown callback (they are {', '.join(CALLBACKS)})")
        if given is None:
            continue
        if isinstance(given, JobSpec):
            spec = given
        elif isinstance(given, Mapping):
            try:
                spec = JobSpec.from_fields(given, default_max_attempts=default_max_attempts)
            except InvalidJob as exc:
                raise InvalidJob(f"{name}.{exc.field}", exc.problem) from None
        else:
            raise InvalidJob(
                name, f"must be a job's fields (a mapping), got {type(given).__name__}"
            )
        for refused, present in (
            ("idempotency_key", spec.idempotency_key is not None),
            ("depends_on", bool(spec.depends_on)),
            ("batch", spec.batch_id is not None),
            ("run_at", spec.run_at is not None),
        ):
            if present:
                raise InvalidJob(f"{name}.{refused}", "a batch's callback job cannot have one")
        checked[name] = {
            "task": spec.task,
            "queue": spec.queue,
            "payload": json.loads(spec.payload_json),
            "priority": spec.priority,
            "delay_seconds": spec.delay_seconds,
            "max_attempts": spec.max_attempts,
            "timeout_seconds": spec.timeout_seconds,
            "concurrency_key": spec.concurrency_key,
            "metadata": None if spec.metadata_json is None else json.loads(spec.metadata_json),
        }
    return checked


def open_batch(
    callbacks: Mapping[str, Callback | None],
    metadata: Mapping[str, Any] | None,
    default_max_attempts: int,
) -> Flow[Batch]:
    """Open a new batch with these callbacks (``CALLBACKS`` by name) and
    metadata (a JSON object, given to the callbacks); InvalidJob naming a
    bad one, and nothing is written."""
    checked = checked_callbacks(callbacks, default_max_attempts)
    if metadata is not None and not isinstance(metadata, Mapping):
        raise InvalidJob("metadata", f"must be a JSON object, got {type(metadata).__name__}")
    metadata_json = (
        None
        if metadata is None
        else dump_json(dict(metadata), "metadata", max_bytes=MAX_METADATA_BYTES)
    )
    rows = yield Statement(
        "batch_open",
        {
            "id": uuid.uuid4(),
            "callbacks": json.dumps(checked),
            "metadata": metadata_json,
        },
    )
    return Batch.from_row(rows[0])


def batch_key(batch_id: uuid.UUID | str, field: str = "batch_id") -> uuid.UUID:
    """A batch id as a UUID; BatchNotFound for what is no uuid at all."""
    if isinstance(batch_id, uuid.UUID):
        return batch_id
    try:
        return uuid.UUID(str(batch_id))
    except ValueError:
        raise BatchNotFound(batch_id, field) from None


def get_batch(batch_id: uuid.UUID | str) -> Flow[Batch]:
    """The batch (BatchNotFound for an unknown id)."""
    key = batch_key(batch_id)
    rows = yield Statement("batch_get", {"id": key})
    if not rows:
        raise BatchNotFound(batch_id)
    return Batch.from_row(rows[0])


def close_batch(batch_id: uuid.UUID | str) -> Flow[Batch]:
    """Close the batch (a batch already closed or finished stays as it is)
    and read it back; BatchNotFound for an unknown id. Run it in one
    transaction."""
    key = batch_key(batch_id)
    rows = yield Statement("batch_close", {"id": key})
    if not rows or rows[0]["state"] is None:
        raise BatchNotFound(batch_id)
    return (yield from get_batch(key))


def lock_batches(specs: Sequence[JobSpec], *, many: bool = False) -> Flow[None]:
    """Lock the batches ``specs`` join (none: no statement) until the
    enqueue commits, so that none is closed before its new jobs count in
    it; BatchNotFound or BatchClosed for one that is unknown or not open,
    naming the field of the first job that joins it (``batch``; with
    ``many``, ``jobs[3].batch``)."""
    first: dict[uuid.UUID, int] = {}
    for index, spec in enumerate(specs):
        if spec.batch_id is not None:
            first.setdefault(spec.batch_id, index)
    if not first:
        return
    rows = yield Statement("batch_lock", {"ids": sorted(first)})
    states = {row["id"]: row["state"] for row in rows}
    for batch_id, index in first.items():
        where = f"jobs[{index}].batch" if many else "batch"
        if batch_id not in states:
            raise BatchNotFound(batch_id, where)
        if states[batch_id] != BatchState.OPEN:
            raise BatchClosed(batch_id, states[batch_id], where)
