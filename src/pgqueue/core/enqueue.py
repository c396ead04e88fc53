"""The producers' transitions: enqueue one job, or many in one statement
(COPY for plain jobs), returning the existing job when a key is taken, after
changing it if the enqueue's ``on_conflict`` says so and it is still
waiting (``debounce``: replace or extend).

A call that the queue retries across a lost connection (retrying.py) keeps a
``CallKey`` across its attempts, so that an attempt finds what an earlier one
committed instead of adding it again: the ids it reserved, and its key,
written into each of its jobs (the call_key column)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar
from uuid import UUID, uuid4

from .batches import lock_batches
from .dependencies import Graph, enqueue_graph
from .errors import KEY_ROUNDS, BatchClosed, KeyTaken
from .flows import Flow, Statement, db_now
from .job_spec import JobSpec, spec_columns
from .jobs import Job

__all__ = [
    "ENQUEUE_CHUNK",
    "LOSABLE",
    "CallKey",
    "Enqueued",
    "PerAttempt",
    "enqueue",
    "enqueue_group",
    "enqueue_many",
    "enqueue_plain",
    "made_by",
    "one_statement",
    "per_attempt",
]

A = TypeVar("A")
T = TypeVar("T")

# Chunk of a bulk enqueue sent as one statement: large enough to amortise the
# round trip, small enough to keep the parameter arrays in a few MB.
ENQUEUE_CHUNK = 5000
# A bulk enqueue of at most this many plain jobs goes in as one statement
# outside a transaction (enqueue_plain): three round trips fewer than a
# COPY's transaction (BEGIN, the count after the COPY, COMMIT), which is
# what a small batch's latency is made of; above it the COPY's cheaper rows
# win (bench/perf/small_batches.py).
ONE_STATEMENT_JOBS = 100
# The statements of the enqueue flows whose loss (the connection gone before
# their answer) leaves no job written: reads, and the reservation of ids (a
# lost id is a gap in the sequence, not a job). Any other may have committed.
LOSABLE = frozenset(
    {
        "db_now",
        "batch_lock",
        "job_reserve_ids",
        "job_get",
        "job_get_by_idempotency_key",
        "job_get_many",
        "job_enqueue_found",
    }
)


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


@dataclass(slots=True)
class CallKey:
    """What one enqueue call keeps across its attempts: the ids of its jobs,
    reserved from the sequence by the first attempt that got them (None
    until then), so that the primary key finds a job that an earlier
    attempt committed, at no cost to the table; and ``key``, written into
    every job the call inserts, which tells the call's own job from another
    call's under the same id (``made_by``). ``attempts``: the attempts that
    began. ``unsure``: an attempt lost its connection while its write may
    have committed, and no later attempt has ended since (retrying.py:
    giving up then is EnqueueOutcomeUnknown, not DatabaseUnavailable)."""

    ids: list[int] | None = None
    attempts: int = 0
    unsure: bool = False
    key: UUID = dataclasses.field(default_factory=uuid4)

    def begin(self) -> bool:
        """Count an attempt; whether an earlier one began (and may have committed)."""
        self.attempts += 1
        return self.attempts > 1


@dataclass(slots=True)
class PerAttempt(Generic[A, T]):
    """A new flow for each attempt of one call (``make(jobs, call)``:
    enqueue or enqueue_many), all with the call's key."""

    make: Callable[[A, CallKey], Flow[T]]
    jobs: A
    call: CallKey = dataclasses.field(default_factory=CallKey)

    def __call__(self) -> Flow[T]:
        return self.make(self.jobs, self.call)


def per_attempt(make: Callable[[A, CallKey], Flow[T]], jobs: A) -> PerAttempt[A, T]:
    """The attempts of one call (``PerAttempt``)."""
    return PerAttempt(make, jobs)


def _reserve(call: CallKey, count: int) -> Flow[list[int]]:
    """The call's ids, reserved now if no earlier attempt got them."""
    if call.ids is None:
        rows = yield Statement("job_reserve_ids", {"count": count})
        call.ids = rows[0]["ids"]
    return call.ids


def enqueue(spec: JobSpec, call: CallKey | None = None) -> Flow[Job]:
    """Insert a job, or return the one that holds its key now. With
    ``call``, the job's id is reserved first, and an attempt after the
    first returns the job that an earlier attempt committed, if one did. A
    job with dependencies goes in as a graph (it has no key; Queue does not
    retry it)."""
    if spec.depends_on:
        [job] = yield from enqueue_graph(Graph((spec,), ((),)))
        return job
    retry = call is not None and call.begin()
    try:
        yield from lock_batches([spec])
    except BatchClosed:
        # Closed since an earlier attempt of this call, which may have
        # committed the job before: then that job is the answer.
        if not (retry and call is not None and call.ids):
            raise
        rows = yield Statement("job_get", {"id": call.ids[0]})
        if rows and made_by(rows[0], call):
            return Job.from_row(rows[0])
        raise
    job_id = (yield from _reserve(call, 1))[0] if call is not None else None
    [spec] = yield from _in_periods([spec])
    params = spec.params() | {"id": job_id, "call_key": call.key if call else None}
    # A conflicting insert may be in flight in another transaction: ON
    # CONFLICT waits for it, and if it rolled back our insert goes ahead. The
    # holder may also let the key go (start, end) between the two
    # statements: then the next round inserts.
    for _ in range(KEY_ROUNDS):
        try:
            jobs: list[Job] = yield Statement("job_enqueue", params, jobs=True)
        except KeyTaken:  # its id: an earlier attempt committed the job
            jobs = []
        if jobs:
            return jobs[0]
        if retry:
            assert call is not None
            rows = yield Statement("job_get", {"id": job_id})
            if rows and made_by(rows[0], call):
                return Job.from_row(rows[0])
            if rows:  # another job's id (handed out again after a failover): ours is not here
                call.ids, retry = None, False
                params["id"] = job_id = (yield from _reserve(call, 1))[0]
                continue
        if spec.on_conflict:
            jobs = yield from debounce(spec)
            if jobs:
                return dataclasses.replace(
                    jobs[0], duplicate=True, debounced=_DONE[spec.on_conflict]
                )
        jobs = yield Statement(
            "job_get_by_idempotency_key", {"idempotency_key": spec.idempotency_key}, jobs=True
        )
        if jobs:
            return dataclasses.replace(jobs[0], duplicate=True)
    raise RuntimeError(f"key {spec.idempotency_key!r} kept changing hands")


# What a job that on_conflict changed says it was (Job.debounced).
_DONE = {"replace": "replaced", "extend": "extended"}


def debounce(spec: JobSpec) -> Flow[list[Job]]:
    """Apply ``spec.on_conflict`` (replace or extend) to the job holding its
    key, if that job is still waiting (job_debounce); the changed job, or
    none when the holder started (or let the key go) meanwhile."""
    params = spec.params() | {"on_conflict": spec.on_conflict}
    jobs: list[Job] = yield Statement("job_debounce", params, jobs=True)
    return jobs


def made_by(row: Mapping[str, Any], call: CallKey) -> bool:
    """Whether ``row``, found under an id the call reserved, was written by
    the call: it carries the call's key. A sequence never hands an id out
    twice, but a primary promoted after an asynchronous failover can: its
    sequence is where the standby had it, behind ids the old primary handed
    out (and a commit it acknowledged may be lost). Another call's job under
    our id is not ours, even one equal in every field; nor is a row without
    a key (written by SQL, a caller's transaction or an older version)."""
    return bool(row["call_key"] == call.key)


@dataclass(frozen=True, slots=True)
class Enqueued:
    """Per job of a bulk enqueue: its id, whether this call created it, and
    (when it did not) whether its on_conflict changed the waiting job that
    held its key: "replaced" or "extended", else None."""

    id: int
    created: bool
    debounced: str | None = None


def enqueue_many(
    specs: Sequence[JobSpec], call: CallKey | None = None, *, copy: bool = True
) -> Flow[list[Enqueued]]:
    """Insert many jobs; results in input order. Plain jobs (runnable now, no
    key) go in by COPY when ``copy``; others by INSERT, a few thousand per
    statement, skipping held keys. With ``call``, an attempt after one that
    reserved the ids inserts only the jobs that are not there yet (by
    INSERT: a COPY cannot skip a row), and the jobs an earlier attempt
    committed count as created by this call. When some jobs have
    dependencies, those go in as one graph and the others as here, keys,
    batches and on_conflict included (``_with_dependents``)."""
    call = call or CallKey()
    try:
        yield from lock_batches(specs, many=True)
    except BatchClosed:
        # Closed since an earlier attempt of this call, which may have
        # committed the jobs before: then they are the answer, not an error
        # saying that nothing was written.
        earlier = yield from _committed_before(specs, call)
        if earlier is None:
            raise
        return earlier
    if any(spec.depends_on for spec in specs):
        return (yield from _with_dependents(specs, call))
    fresh = call.ids is None
    ids = yield from _reserve(call, len(specs))
    if copy and fresh and all(_plain(spec) for spec in specs):
        return (yield from _copy_many(specs, ids, call.key))
    return (yield from _insert_many(specs, ids, call))


def _committed_before(specs: Sequence[JobSpec], call: CallKey) -> Flow[list[Enqueued] | None]:
    """What an earlier attempt of ``call`` committed, if one did (None
    otherwise): the jobs under the ids it reserved that carry its key, each
    created by the call; a job it did not insert (another job held its key)
    is answered by the key's holder now. One attempt's jobs commit
    together: some of them there means all of its answers were written."""
    if call.ids is None or len(call.ids) != len(specs):  # (a graph's call reserves fewer)
        return None
    specs = yield from _in_periods(specs)
    keys = sorted({str(spec.idempotency_key) for spec in specs if spec.idempotency_key})
    found = yield Statement("job_enqueue_found", {"ids": call.ids, "idempotency_keys": keys})
    ours = {row["id"] for row in found if row["reserved"] and made_by(row, call)}
    if not ours:
        return None
    holders = {row["holds_key"]: row["id"] for row in found if row["holds_key"]}
    return [
        Enqueued(job_id, True)
        if job_id in ours
        else Enqueued(holders.get(spec.idempotency_key, job_id), False)
        for spec, job_id in zip(specs, call.ids, strict=True)
    ]


def _with_dependents(specs: Sequence[JobSpec], call: CallKey) -> Flow[list[Enqueued]]:
    """A bulk enqueue where some jobs have dependencies (on existing jobs:
    one job of a bulk enqueue cannot name another): those go in as one
    graph, the others by INSERT with their keys, batches and on_conflict,
    in one transaction (Queue does not retry such a call: a graph's jobs
    carry no call key). Errors name each job by its place in ``specs``."""
    dependent = [i for i, spec in enumerate(specs) if spec.depends_on]
    others = [i for i, spec in enumerate(specs) if not spec.depends_on]
    results: dict[int, Enqueued] = {}
    if others:
        ids = yield from _reserve(call, len(others))
        inserted = yield from _insert_many([specs[i] for i in others], ids, call)
        results.update(zip(others, inserted, strict=True))
    graph = Graph(
        tuple(specs[i] for i in dependent),
        ((),) * len(dependent),
        tuple(f"jobs[{i}]" for i in dependent),
    )
    jobs = yield from enqueue_graph(graph)
    results.update((i, Enqueued(job.id, True)) for i, job in zip(dependent, jobs, strict=True))
    return [results[i] for i in range(len(specs))]


def _insert_many(specs: Sequence[JobSpec], ids: list[int], call: CallKey) -> Flow[list[Enqueued]]:
    """The INSERT path of enqueue_many: chunks, each with its ids."""
    specs = yield from _in_periods(specs)
    results: list[Enqueued] = []
    for start in range(0, len(specs), ENQUEUE_CHUNK):
        end = start + ENQUEUE_CHUNK
        chunk_ids = ids[start:end]
        results += yield from _insert_chunk(specs[start:end], chunk_ids, call)
        ids[start:end] = chunk_ids  # (with the ids it had to take again)
    return results


def enqueue_group(specs: Sequence[JobSpec], call: CallKey) -> Flow[list[Job | None]]:
    """The single enqueues of a group commit (group_commit.py) as one insert
    (enqueue_many's) and one read of the rows, or, for a few plain jobs,
    one statement that returns them (no transaction: ``one_statement``):
    per spec, what ``enqueue`` would return for it alone (the job that
    holds its key, ``duplicate``, when it was not created; a later spec of
    the group with an earlier one's key gets that job). None for a spec
    whose key holder (or whose job, written by an earlier attempt) is gone
    since the insert (pruned): it must be enqueued again, alone."""
    if one_statement(specs):  # a few plain jobs: one statement, no transaction
        written: list[Job] | None = yield from _write_plain(specs, call, rows=True)
        assert call.ids is not None  # (reserved by _write_plain)
        if written is None:  # by an earlier attempt of the group
            written = yield Statement("job_get_many", {"ids": call.ids}, jobs=True)
        by_id = {job.id: job for job in written}
        return [by_id.get(job_id) for job_id in call.ids]
    results = yield from enqueue_many(specs, call, copy=False)
    ids = sorted({r.id for r in results})
    rows: list[Job] = yield Statement("job_get_many", {"ids": ids}, jobs=True)
    found = {job.id: job for job in rows}
    return [_answer(found.get(r.id), r) for r in results]


def _answer(job: Job | None, result: Enqueued) -> Job | None:
    if job is None or result.created:
        return job
    return dataclasses.replace(job, duplicate=True, debounced=result.debounced)


def _insert_chunk(chunk: Sequence[JobSpec], ids: list[int], call: CallKey) -> Flow[list[Enqueued]]:
    """One INSERT of a chunk with its ids and the call's key. A job
    skipped is either there already (an earlier attempt of the call
    committed it) or skipped for a key another job holds: it gets the
    holder's id. A holder that let its key go meanwhile means another round,
    and so does a row under one of the ids that is another call's job
    (``made_by``): that job of ours gets a new id (in ``ids``), which the
    next round inserts."""
    results: dict[int, Enqueued] = {}
    todo = list(range(len(chunk)))
    for _ in range(KEY_ROUNDS):
        columns = spec_columns(chunk[i] for i in todo)
        params = columns | {"id": [ids[i] for i in todo], "call_key": call.key}
        rows = yield Statement("job_enqueue_many", params)
        inserted = {row["id"] for row in rows}
        results |= {i: Enqueued(ids[i], True) for i in todo if ids[i] in inserted}
        todo = [i for i in todo if i not in results]
        if not todo:
            break
        keys = sorted({str(chunk[i].idempotency_key) for i in todo if chunk[i].idempotency_key})
        found = yield Statement(
            "job_enqueue_found", {"ids": [ids[i] for i in todo], "idempotency_keys": keys}
        )
        under_ids = {row["id"]: row for row in found if row["reserved"]}
        taken = [i for i in todo if ids[i] in under_ids and not made_by(under_ids[ids[i]], call)]
        if taken:  # ids handed out again after a failover: ours are not here
            new_ids = yield from _new_ids(len(taken), {*(call.ids or ()), *ids})
            for i, new_id in zip(taken, new_ids, strict=True):
                ids[i] = new_id
        ours = {ids[i] for i in todo if ids[i] in under_ids}
        holders = {row["holds_key"]: row["id"] for row in found if row["holds_key"]}
        for i in todo:
            if ids[i] in ours:
                results[i] = Enqueued(ids[i], True)
            elif chunk[i].idempotency_key in holders:
                results[i] = yield from _held(chunk[i], holders[chunk[i].idempotency_key])
        todo = [i for i in todo if i not in results]
        if not todo:
            break
    else:
        raise RuntimeError(f"{len(todo)} key(s) kept changing hands")
    return [results[i] for i in range(len(chunk))]


def _held(spec: JobSpec, holder: int) -> Flow[Enqueued]:
    """A job of a bulk enqueue whose key ``holder`` holds: that job, changed
    first if the spec's on_conflict says so and it is still waiting (one
    statement per such job, in the order given: the last one wins)."""
    if spec.on_conflict:
        jobs = yield from debounce(spec)
        if jobs:
            return Enqueued(jobs[0].id, False, _DONE[spec.on_conflict])
    return Enqueued(holder, False)


def _new_ids(count: int, held: set[int]) -> Flow[list[int]]:
    """``count`` ids from the sequence, none of them one the call holds: a
    primary promoted after an asynchronous failover hands out again the ids
    after where the standby had its sequence, the call's own among them,
    and two jobs of one call under one id would be taken for one (they
    carry the same key). The sequence only goes forward: this ends."""
    got: list[int] = []
    while len(got) < count:
        rows = yield Statement("job_reserve_ids", {"count": count - len(got)})
        got += [job_id for job_id in rows[0]["ids"] if job_id not in held]
    return got


def one_statement(specs: Sequence[JobSpec]) -> bool:
    """Whether ``enqueue_plain`` takes these jobs (a few plain ones); if so,
    their call needs no transaction."""
    return len(specs) <= ONE_STATEMENT_JOBS and all(_plain(spec) for spec in specs)


def enqueue_plain(specs: Sequence[JobSpec], call: CallKey) -> Flow[list[Enqueued]]:
    """A few plain jobs (``one_statement``) by one statement, which counts
    and wakes them itself: run outside a transaction, it commits all of
    them or none, one round trip after the ids' reservation."""
    yield from _write_plain(specs, call, rows=False)
    assert call.ids is not None  # (reserved by _write_plain)
    return [Enqueued(job_id, True) for job_id in call.ids]


def _write_plain(specs: Sequence[JobSpec], call: CallKey, *, rows: bool) -> Flow[list[Any] | None]:
    """The one statement of the specs under the call's ids (with ``rows``:
    the one that returns the new jobs, which it returns), or None when an
    earlier attempt of the call had written them. An id of the call that
    another row holds fails the statement (KeyTaken): either an earlier
    attempt of the call committed it, and so all of its jobs (they carry
    its key), or a primary promoted after a failover handed the id out
    again (``made_by``): then the jobs are written under new ids."""
    name = "job_enqueue_plain_rows" if rows else "job_enqueue_plain"
    columns = spec_columns(specs)
    tried: set[int] = set()
    for _ in range(KEY_ROUNDS):
        ids = yield from _reserve(call, len(specs))
        tried.update(ids)
        try:
            written = yield Statement(name, columns | {"id": ids, "call_key": call.key}, jobs=rows)
        except KeyTaken:
            found = yield Statement("job_enqueue_found", {"ids": ids, "idempotency_keys": []})
            if any(row["reserved"] and made_by(row, call) for row in found):
                return None
            call.ids = yield from _new_ids(len(ids), tried)
            continue
        return written
    raise RuntimeError(f"the ids of {len(specs)} job(s) kept being taken")


def _plain(spec: JobSpec) -> bool:
    return (
        spec.idempotency_key is None
        and not spec.depends_on
        and spec.run_at is None
        and not spec.delay_seconds
        and spec.batch_id is None  # (a COPY does not count it in its batch)
    )


def _copy_many(
    specs: Sequence[JobSpec], ids: Sequence[int], call_key: UUID
) -> Flow[list[Enqueued]]:
    key = str(call_key)  # (text once, not adapted again for every row)
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
                s.metadata_json,
                key,
            )
            for job_id, s in zip(ids, specs, strict=True)
        ],
    )
    counts = Counter(s.queue for s in specs)
    queues = sorted(counts)
    yield Statement("job_copied", {"queues": queues, "counts": [counts[q] for q in queues]})
    return [Enqueued(job_id, True) for job_id in ids]
