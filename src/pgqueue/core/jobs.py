"""What a job is: its states, its row as read back (``Job``), and the limits
of its fields (their rules: job_spec.py)."""

from __future__ import annotations

import enum
import functools
import inspect
import json
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, make_dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from uuid import UUID

from .errors import InvalidJob, NotInHandler
from .json_text import MAX_JSON_BYTES, MAX_JSON_DEPTH, dump_json
from .sleeps import checked_signal_name, checked_sleep, checked_wait_timeout
from .steps import checked_step_name, checkpoint_json, step_result_json

__all__ = [
    "DEPENDENCY_POLICIES",
    "MAX_ATTEMPTS",
    "MAX_ATTEMPT_ERRORS",
    "MAX_DELAY_SECONDS",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_KEY_LENGTH",
    "MAX_METADATA_BYTES",
    "MAX_PRIORITY",
    "MAX_PROGRESS_INFO_BYTES",
    "MAX_TIMEOUT_SECONDS",
    "ON_CONFLICT",
    "QUEUE_NAME",
    "TASK_NAME",
    "UNIQUE_SCOPES",
    "AttemptError",
    "AttemptHandle",
    "Job",
    "JobState",
    "Transaction",
    "call_off",
    "dump_json",
]

# The limits of a job's fields. migrations/0030_sql_enqueue.sql repeats them
# (test_sql_enqueue_property.py fails when the two differ).
MAX_PRIORITY = 32767
MAX_ATTEMPTS = 1000
DEFAULT_MAX_ATTEMPTS = 5
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600.0
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600.0
MAX_KEY_LENGTH = 255
# Metadata is for small facts about a job (a trace context is ~120 bytes).
MAX_METADATA_BYTES = 16_384
# Progress info is a small note beside the fraction ({"rows": 1200}), which
# a worker may write once a second per job.
MAX_PROGRESS_INFO_BYTES = 4096
TASK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:\-]{0,199}")
QUEUE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,62}")
# While which states a job holds its key (the index predicate pgqueue_key_held):
# until its first attempt starts; while queued or running (until it ends:
# succeeded, dead or cancelled); in every state, until the row is deleted.
UNIQUE_SCOPES = ("queued", "active", "always")
DEFAULT_UNIQUE_SCOPE = "always"
# What an enqueue does when another job holds its key and is still waiting
# (queued, its first attempt not started): nothing (ignore), or it writes its
# payload, metadata and priority into that job (replace), and also moves its
# run_at later to its own (extend: a debounce). A job that started is never
# changed: the enqueue returns it, as ignore does.
ON_CONFLICT = ("ignore", "replace", "extend")
# When a job it depends on dies or is cancelled, a job is cancelled too (and
# so are its own dependents), or runs anyway, as if that one had succeeded.
DEPENDENCY_POLICIES = ("cancel", "run")
MAX_DEPENDENCIES = 100_000


class JobState(enum.StrEnum):
    """Where a job is in its life (the diagram: docs/architecture.md).
    ``succeeded``, ``dead`` and ``cancelled`` are finished: no worker
    changes them again; a retry queues a dead or cancelled job anew."""

    WAITING = "waiting"  # for the jobs it depends on; never claimed
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """True for the states a worker leaves a job in for good."""
        return self in (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED)


@dataclass(frozen=True, slots=True)
class AttemptError:
    """One failed attempt of a job: its number, the error (the exception and
    the head of its traceback, or why the lease expired), the worker that
    held it, and when it failed (database clock)."""

    attempt: int
    error: str
    worker: str | None
    at: datetime

    @classmethod
    def from_dict(cls, value: Any) -> AttemptError:
        """One element of the errors column. An element pgqueue did not
        write (a row written by SQL) reads as attempt 0 at 1970-01-01 whose
        error is that element's JSON, so that every read can show the job."""
        try:
            worker = value.get("worker")
            return cls(
                int(value["attempt"]),
                str(value["error"]),
                None if worker is None else str(worker),
                datetime.fromisoformat(value["at"]),
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            shown = json.dumps(value, ensure_ascii=False)[:2000]
            return cls(0, f"[not a failed attempt as pgqueue writes one: {shown}]", None, _EPOCH)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "error": self.error,
            "worker": self.worker,
            "at": self.at.isoformat(),
        }


# When an element of the errors column that pgqueue did not write failed.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Failed attempts a job keeps (the oldest go first): pgqueue_errors_append,
# migrations/0010_history.sql.
MAX_ATTEMPT_ERRORS = 20


class Transaction(Protocol):
    """What ``job.transaction()`` gives: ``with`` it in a sync handler,
    ``async with`` it in an async one; either way it gives a psycopg
    connection (sync or async) inside a transaction on the queue's
    database, which completes the job as it commits."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc_info: Any) -> bool | None: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc_info: Any) -> bool | None: ...


class AttemptHandle(Protocol):
    """The worker's side of the attempt a handler runs: set on the job it
    hands the handler (``Job.attempt``), cleared when the handler returns.
    The job's methods that reach the worker go through it; core knows only
    this shape (the worker's implementation: worker/held.py ``Held``)."""

    def transaction(self, result_json: str) -> Transaction: ...

    def progress(self, fraction: float, info_json: str | None) -> None: ...

    # Durable steps: whether a step of that name was stored by an attempt
    # of the job, and its result; then the result of one that was not, to
    # store (fenced). Sync for handlers on threads, async for the others.
    def step_found(self, name: str) -> tuple[bool, Any]: ...

    async def step_found_async(self, name: str) -> tuple[bool, Any]: ...

    def store_step(self, name: str, result_json: str) -> None: ...

    async def store_step_async(self, name: str, result_json: str) -> None: ...

    def store_checkpoint(self, value_json: str) -> None: ...

    async def store_checkpoint_async(self, value_json: str) -> None: ...

    # Durable sleeps and waits (core/sleeps.py): return once ended, or put
    # the job to sleep and raise Asleep.
    def sleep(self, seconds: float | None, until: datetime | None) -> None: ...

    async def sleep_async(self, seconds: float | None, until: datetime | None) -> None: ...

    def wait_for_signal(self, name: str, timeout: float) -> Any: ...

    async def wait_for_signal_async(
        self,
        name: str,
        timeout: float,  # noqa: ASYNC109
    ) -> Any: ...


@dataclass(frozen=True, slots=True)
class Job:
    """A row of the jobs table. ``duplicate`` is set by enqueue when this
    job held the key asked for (no new job was written); ``debounced`` then
    says whether the enqueue changed it (on_conflict): "replaced" or
    "extended", else None."""

    id: int
    queue: str
    task: str
    payload: dict[str, Any]
    priority: int
    state: JobState
    run_at: datetime
    attempts: int
    max_attempts: int
    snoozes: int  # times its handlers asked to run later (Snooze); attempts do not count them
    timeout_seconds: float | None
    lease_token: int | None
    lease_expires_at: datetime | None
    worker: str | None
    last_error: str | None
    result: Any
    idempotency_key: str | None
    unique_scope: str | None
    enqueued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    concurrency_key: str | None = None
    workflow_id: UUID | None = None
    depends_on: list[int] | None = None  # the jobs it waits for, in the order given
    # Its failed attempts, oldest first (the last MAX_ATTEMPT_ERRORS); an
    # operator's retry keeps them, and numbers the next attempts from 1 again.
    errors: tuple[AttemptError, ...] = ()
    metadata: dict[str, Any] | None = None  # None: the job was given none
    # What its handler last reported (job.progress()): the fraction done, the
    # JSON given with it, when the worker wrote it; None until it reports.
    progress_fraction: float | None = None
    progress_info: Any = None
    progress_at: datetime | None = None
    # The value its handler last stored with job.checkpoint() (any attempt),
    # as claimed; None if none.
    last_checkpoint: Any = None
    # The batch it joined (Queue.open_batch), None if none.
    batch_id: UUID | None = None
    duplicate: bool = False
    # The results of the jobs of ``depends_on``, in that order (None for a
    # job that did not succeed, or was pruned): filled in by the claim.
    parents: tuple[Any, ...] = ()
    # Set by the worker while its handler runs this job (see AttemptHandle).
    attempt: AttemptHandle | None = field(default=None, compare=False, repr=False)
    # Set once by the worker that runs this attempt (call_off); read as
    # ``cancelled``.
    _called_off: bool = field(default=False, repr=False, compare=False)
    # Set by an enqueue whose on_conflict changed this waiting job: "replaced"
    # or "extended" (and duplicate is True).
    debounced: str | None = field(default=None, compare=False)

    def transaction(self, result: Any = None) -> Transaction:
        """A transaction on the queue's database that completes this job as
        it commits (succeeded, with ``result`` as its result), so that the
        handler's writes in it happen exactly once::

            with job.transaction() as conn:         # sync handler
                conn.execute("INSERT ...")
            async with job.transaction() as conn:   # async handler
                await conn.execute("INSERT ...")

        At the end of the block the job is completed in the same
        transaction, fenced by this attempt's token: if the lease was lost
        meanwhile (or the worker gave the attempt up: its timeout),
        StaleAttempt is raised and nothing of the block commits.
        An exception in the block rolls it back (the attempt fails as
        usual). Once the block has committed the job is finished: what the
        handler returns or raises afterwards is not recorded. Raises
        InvalidJob for a result PostgreSQL cannot store, NotInHandler
        outside the handler running the job (docs/exactly-once.md)."""
        text = "null" if result is None else dump_json(result, "result")
        return self._running("transaction").transaction(text)

    def progress(self, fraction: float, info: Any = None) -> None:
        """Say how far the handler is: ``fraction`` done, from 0 to 1, and
        ``info``, any JSON of at most MAX_PROGRESS_INFO_BYTES (what it is
        doing, counts...). Cheap, from sync and async handlers alike: the
        value is kept in memory and the worker writes the latest one of each
        job at most once a second (one statement for all its jobs), fenced
        by this attempt's token, onto the job (``progress_fraction``,
        ``progress_info``, ``progress_at``), and wakes the job's waiters.
        Raises InvalidJob for a fraction or info out of bounds (nothing is
        kept), NotInHandler outside the handler running the job
        (docs/howto/progress.md)."""
        checked, info_json = checked_progress(fraction, info)
        self._running("progress").progress(checked, info_json)

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as the durable step ``name`` of this
        job, in a sync handler, and return its result::

            rows = job.step("fetch", fetch_rows, job.payload["url"])
            total = job.step("load", load_rows, rows)

        Once ``fn`` returns, its result is stored (fenced by this attempt's
        token) before ``step`` returns: a later attempt of the job (a retry
        after an exception, a crash or a lost lease) gets the stored result
        back without calling ``fn`` again. A step is at least once: a crash
        after ``fn`` returned and before its result was stored runs it
        again. The result must be JSON (at most MAX_STEP_RESULT_BYTES) and
        is returned as JSON reads it back (a tuple comes back a list), on
        the first attempt as on the later ones. Raises InvalidJob for a bad
        name, a name this attempt already completed, or a result that is
        not JSON (nothing stored: the attempt fails, and the next one runs
        ``fn`` again); StaleAttempt if the attempt no longer holds the job
        (nothing stored); NotInHandler outside the handler running the job
        (docs/howto/durable-steps.md)."""
        attempt = self._running("step")
        found, value = attempt.step_found(checked_step_name(name))
        if found:
            return value
        text = step_result_json(name, fn(*args, **kwargs))
        attempt.store_step(name, text)
        return json.loads(text)

    async def step_async(
        self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Any:
        """``step`` for an async handler: ``fn`` may be a coroutine function
        (awaited) or a plain one; the reads and writes do not block the
        worker's event loop."""
        attempt = self._running("step_async")
        found, value = await attempt.step_found_async(checked_step_name(name))
        if found:
            return value
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        text = step_result_json(name, result)
        await attempt.store_step_async(name, text)
        return json.loads(text)

    def checkpoint(self, value: Any) -> None:
        """Store ``value`` (JSON, at most MAX_CHECKPOINT_BYTES) as this
        job's checkpoint, in a sync handler: where a long walk over a large
        input has got to (an offset, the last key done). Overwrites the
        last one, fenced by this attempt's token; a later attempt of the
        job reads it as ``job.last_checkpoint`` and carries on from there.
        Raises InvalidJob for a value that is not JSON, StaleAttempt if the
        attempt no longer holds the job (nothing stored either way),
        NotInHandler outside the handler running the job."""
        self._running("checkpoint").store_checkpoint(checkpoint_json(value))

    async def checkpoint_async(self, value: Any) -> None:
        """``checkpoint`` for an async handler."""
        await self._running("checkpoint_async").store_checkpoint_async(checkpoint_json(value))

    def sleep(self, seconds: float | timedelta) -> None:
        """Sleep ``seconds`` (0 to ten years), durably, in a sync handler:
        the job goes back to queued until then and its worker slot is free
        for other jobs meanwhile; then the handler runs again from the top,
        its completed steps taken from storage, and this call returns at
        once. The wake time is fixed by the first call (database clock)
        and stored as a step of the job, fenced by this attempt's token.
        The attempt is given back (a sleep is not a failed attempt), and
        it is not one of the job's snoozes (max_snoozes does not bound
        sleeps). Sleeps are told apart by their order in the handler, as
        steps by their names: the n-th sleep of an attempt is the n-th of
        the next one. To unwind the handler it raises ``Asleep``, a
        BaseException that ``except Exception`` lets through. Raises
        InvalidJob for a length out of range, StaleAttempt if the attempt no
        longer holds the job, NotInHandler outside the handler running the
        job (docs/howto/durable-sleep-and-signals.md)."""
        checked, _ = checked_sleep(seconds, None)
        self._running("sleep").sleep(checked, None)

    async def sleep_async(self, seconds: float | timedelta) -> None:
        """``sleep`` for an async handler."""
        checked, _ = checked_sleep(seconds, None)
        await self._running("sleep_async").sleep_async(checked, None)

    def sleep_until(self, when: datetime) -> None:
        """``sleep`` until ``when`` (a datetime with a zone; in the past: return at once)."""
        _, until = checked_sleep(None, when)
        self._running("sleep_until").sleep(None, until)

    async def sleep_until_async(self, when: datetime) -> None:
        """``sleep_until`` for an async handler."""
        _, until = checked_sleep(None, when)
        await self._running("sleep_until_async").sleep_async(None, until)

    def wait_for_signal(self, name: str, timeout: float | timedelta) -> Any:
        """Wait, durably, for the signal ``name`` sent to this job
        (``Queue.signal``, ``POST /jobs/{id}/signals/{name}``, ``pgqueue
        jobs signal``), in a sync handler, and return its payload. A signal
        already sent and not consumed is consumed now (the oldest first;
        each signal by one wait only). Otherwise the job sleeps (as
        ``sleep`` does) until a signal of that name wakes it, or until
        ``timeout`` seconds after the wait's first call (database clock; a
        later attempt does not move it): then SignalTimeout. The wait's
        outcome (the payload, or the timeout) is stored as a step of the
        job, so a later attempt gets it back without waiting again, and
        two waits for one name take two signals. Raises InvalidJob for a
        bad name or timeout, StaleAttempt and NotInHandler as ``sleep``."""
        name = checked_signal_name(name)
        seconds = checked_wait_timeout(timeout)
        return self._running("wait_for_signal").wait_for_signal(name, seconds)

    async def wait_for_signal_async(
        self,
        name: str,
        timeout: float | timedelta,  # noqa: ASYNC109
    ) -> Any:
        """``wait_for_signal`` for an async handler."""
        name = checked_signal_name(name)
        seconds = checked_wait_timeout(timeout)
        attempt = self._running("wait_for_signal_async")
        return await attempt.wait_for_signal_async(name, seconds)

    @property
    def cancelled(self) -> bool:
        """True once the worker has called off the attempt its handler runs:
        the job was cancelled (``Queue.cancel``, a bulk or a workflow
        cancel), or its lease was lost. A sync handler, which the worker
        cannot stop, checks it between steps and returns: whatever it
        returns is dropped, and the job stays as the cancel left it. False
        for any other Job (read back, or not running). A flag of its own,
        not read through ``attempt``: the worker lets go of the attempt when
        it calls it off, while the sync handler's thread runs on."""
        return self._called_off

    def _running(self, method: str) -> AttemptHandle:
        """The attempt a worker runs now; NotInHandler if none."""
        if self.attempt is None:
            raise NotInHandler(self.id, method)
        return self.attempt

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, duplicate: bool = False) -> Job:
        columns = (row[name] for name in _COLUMNS)
        return _made(columns, duplicate, tuple(row.get("parents") or ()))

    @classmethod
    def from_tuples(cls, names: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[Job]:
        """Jobs from plain result tuples whose columns are ``names``: the
        claim's hot path, without a dict per row. A ``parents`` column (the
        claim's) gives each job its parents' results."""
        read = _reader(tuple(names))
        return [read(row) for row in rows]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: datetimes as ISO 8601 strings."""
        out: dict[str, Any] = {}
        for name in _COLUMNS:
            value = getattr(self, name)
            if isinstance(value, datetime):
                value = value.isoformat()
            out[name] = str(value) if isinstance(value, UUID) else value
        out["state"] = str(self.state)
        out["errors"] = [error.to_dict() for error in self.errors]
        return out


def checked_progress(fraction: Any, info: Any) -> tuple[float, str | None]:
    """A progress report checked: the fraction as a float, the info as JSON
    text (None for none); InvalidJob if either is out of bounds."""
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, int | float)
        or not 0 <= fraction <= 1  # NaN included
    ):
        raise InvalidJob(
            "progress", f"must be a number from 0 to 1 (the fraction done), got {fraction!r}"
        )
    text = (
        None
        if info is None
        else dump_json(info, "progress info", max_bytes=MAX_PROGRESS_INFO_BYTES)
    )
    return float(fraction), text


_COLUMNS = tuple(
    f.name
    for f in fields(Job)
    if f.name not in ("duplicate", "parents", "attempt", "_called_off", "debounced")
)
# A state column's text as a JobState (quicker than calling JobState).
STATES = {state.value: state for state in JobState}


# A Job without the frozen guard: the same slots in the same order, filled by
# plain attribute stores, then made a Job by changing its class (which Python
# allows only between classes of the same layout, and checks). A frozen
# dataclass's __init__ goes through object.__setattr__ for each field, a
# call per field for every job the worker claims.
_Unfrozen = make_dataclass(
    "_Unfrozen",
    [(f.name, f.type) for f in fields(Job)],
    slots=True,
    eq=False,
    repr=False,
    match_args=False,
)


@functools.lru_cache(maxsize=32)
def _reader(names: tuple[str, ...]) -> Callable[[Sequence[Any]], Job]:
    """A function that makes a Job of a result tuple whose columns are
    ``names`` (looked up once per statement, not per row)."""
    pick = operator.itemgetter(*(names.index(name) for name in _COLUMNS))
    parents_at = names.index("parents") if "parents" in names else None

    def read(row: Sequence[Any]) -> Job:
        parents = () if parents_at is None else tuple(row[parents_at] or ())
        return _made(pick(row), False, parents)  # False: not a duplicate

    return read


def _made(columns: Iterable[Any], duplicate: bool, parents: tuple[Any, ...]) -> Job:
    """A Job of a row's columns (in the order of _COLUMNS): the state as a
    JobState, the errors (jsonb, NULL when none) as AttemptErrors."""
    # No attempt, not called off, not debounced.
    job = _Unfrozen(*columns, duplicate, parents, None, False, None)
    job.state = STATES[job.state]
    errors = job.errors
    if errors and not isinstance(errors, list):  # a row written by SQL
        errors = [errors]
    job.errors = tuple(map(AttemptError.from_dict, errors)) if errors else ()
    job.__class__ = Job
    return job  # type: ignore[no-any-return]


def call_off(job: Job) -> None:
    """Make ``job.cancelled`` True: the worker's, when it calls the attempt
    off. (A plain store, seen at once by the handler's thread.)"""
    object.__setattr__(job, "_called_off", True)


# -- a new job -------------------------------------------------------------------
