"""The producers' transitions: enqueue one job, or many in one statement
(COPY for plain jobs), returning the existing job when a key is taken."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .flows import Flow, Row, Statement, db_now
from .jobs import Job, JobSpec

__all__ = ["ENQUEUE_CHUNK", "KEY_ROUNDS", "Enqueued", "enqueue", "enqueue_many"]

# Chunk of a bulk enqueue sent as one statement: large enough to amortise the
# round trip, small enough to keep the parameter arrays in a few MB.
ENQUEUE_CHUNK = 5000
# Rounds of insert-then-look-up before a key that keeps changing hands is an
# error: each round that fails needs a holder that let the key go between
# the two statements.
KEY_ROUNDS = 3


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
        "concurrency_key": spec.concurrency_key,
    }


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
    counts = Counter(s.queue for s in specs)
    queues = sorted(counts)
    yield Statement("job_copied", {"queues": queues, "counts": [counts[q] for q in queues]})
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
