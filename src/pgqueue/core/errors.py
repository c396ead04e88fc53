"""The exceptions pgqueue raises.

PgQueueError
├── InvalidJob            bad input to enqueue (or a bulk filter); nothing was written
├── InvalidQueueControl   a bad pause or limit for a queue; nothing was written
├── InvalidSettings       a setting out of range or of the wrong type
├── InvalidSchedule       a bad schedule definition (cron expression, zone, ...)
├── JobNotFound           no job has that id
├── ScheduleNotFound      no schedule has that name
├── ScheduleConflict      a schedule's name is taken, or the change does not
│                         apply to it (one declared in code); nothing was written
├── WorkflowNotFound      no job has that workflow id
├── BatchNotFound         no batch has that id
├── BatchClosed           a job cannot join a batch that was closed
├── JobStateConflict      the transition does not apply to the job's state
│   ├── JobAlreadyFinished   cancel of (or a signal to) a succeeded, dead or cancelled job
│   ├── JobNotRetryable      retry of a job that is not dead or cancelled
│   └── JobKeyHeld           retry of a job whose key another job holds now
├── KeyTaken              (internal) a statement met a key taken at the same
│                         moment; the flows that can meet it try again
├── WaitTimeout           wait() gave up before the job finished
├── SignalTimeout         job.wait_for_signal(): its deadline passed before the signal came
├── DatabaseUnavailable   the database did not answer in time; nothing was written
│   ├── DatabaseReadOnly        it answers but refuses writes; nothing was written
│   └── OutcomeUnknown          a write went out and its answer never came back
│       └── EnqueueOutcomeUnknown   an enqueue's: the job may exist (``job_ids``)
├── SchemaNotMigrated     the database lacks pgqueue's tables, or has an older schema
├── UnsupportedServer     the PostgreSQL server is older than pgqueue supports; nothing was written
├── WorkerFailed          a part of a worker failed unexpectedly; the worker stopped
├── NotInHandler          job.transaction() or job.progress() outside the handler running the job
├── StaleAttempt          job.transaction(): the attempt's lease was lost; nothing committed
└── PayloadNotOpened      a worker could not decrypt a job's payload (its handler did not run)
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

__all__ = [
    "BatchClosed",
    "BatchNotFound",
    "DatabaseReadOnly",
    "DatabaseUnavailable",
    "EnqueueOutcomeUnknown",
    "InvalidJob",
    "InvalidQueueControl",
    "InvalidSchedule",
    "InvalidSettings",
    "JobAlreadyFinished",
    "JobKeyHeld",
    "JobNotFound",
    "JobNotRetryable",
    "JobStateConflict",
    "KeyTaken",
    "NotInHandler",
    "OutcomeUnknown",
    "PayloadNotOpened",
    "PgQueueError",
    "ScheduleConflict",
    "ScheduleNotFound",
    "SchemaNotMigrated",
    "SignalTimeout",
    "StaleAttempt",
    "UnsupportedServer",
    "WaitTimeout",
    "WorkerFailed",
    "WorkflowNotFound",
]


class PgQueueError(Exception):
    """Root of every error pgqueue raises on purpose."""


class InvalidJob(PgQueueError, ValueError):
    """An enqueue argument (or a bulk action's filter) is invalid. ``field``
    names it; nothing was written."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class InvalidQueueControl(PgQueueError, ValueError):
    """A queue's pause or limit is invalid. ``field`` names it; nothing was written."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class InvalidSettings(PgQueueError, ValueError):
    """A setting is out of range or of the wrong type."""


class InvalidSchedule(PgQueueError, ValueError):
    """A schedule's definition is invalid. ``schedule`` names it and ``field``
    the bad argument (cron, tz, every, catch_up, or a job field)."""

    def __init__(self, schedule: str, field: str, problem: str) -> None:
        self.schedule = schedule
        self.field = field
        self.problem = problem
        super().__init__(f"schedule {schedule!r}: {field}: {problem}")


class ScheduleNotFound(PgQueueError, LookupError):
    """No schedule has this name."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"schedule {name!r} does not exist")


class ScheduleConflict(PgQueueError):
    """A runtime schedule's create or change that the table refuses: its name
    is taken (``field`` "name"), or it is declared in a worker's code
    (``field`` "origin"). Nothing was written."""

    def __init__(self, name: str, field: str, problem: str) -> None:
        self.name = name
        self.field = field
        self.problem = problem
        super().__init__(f"schedule {name!r}: {field}: {problem}")


class JobNotFound(PgQueueError, LookupError):
    """No job has this id."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id} does not exist")


class WorkflowNotFound(PgQueueError, LookupError):
    """No job has this workflow id (it never existed, or its jobs were pruned)."""

    def __init__(self, workflow_id: object) -> None:
        self.workflow_id = workflow_id
        super().__init__(f"workflow {workflow_id} does not exist")


class BatchNotFound(PgQueueError, LookupError):
    """No batch has this id. ``field`` names where the id was given (``batch``
    of a job, ``jobs[3].batch`` of a bulk enqueue, ``batch_id``); nothing
    was written."""

    def __init__(self, batch_id: object, field: str = "batch_id") -> None:
        self.batch_id = batch_id
        self.field = field
        self.problem = f"no batch has the id {batch_id}"
        super().__init__(f"batch {batch_id} does not exist")


class BatchClosed(PgQueueError):
    """A job cannot join this batch: it was closed (``state``: closed, or
    finished). ``field`` names where the id was given; nothing was written."""

    def __init__(self, batch_id: object, state: str, field: str = "batch") -> None:
        self.batch_id = batch_id
        self.state = state
        self.field = field
        self.problem = f"batch {batch_id} is {state}: no job can join it"
        super().__init__(f"{field}: {self.problem}")


class JobStateConflict(PgQueueError):
    """The requested transition does not apply to the job's current state.
    ``field`` and ``problem`` say what stands in the way (the state, by default)."""

    field = "state"

    def __init__(self, job_id: int, state: str, action: str, reason: str | None = None) -> None:
        self.job_id = job_id
        self.state = state
        self.problem = f"is {state}"
        super().__init__(f"cannot {action} job {job_id}: {reason or f'it is {state}'}")


class JobAlreadyFinished(JobStateConflict):
    """Cancel of a job that already succeeded, died or was cancelled, or a
    signal sent to one (nothing was stored)."""


class JobNotRetryable(JobStateConflict):
    """Retry of a job that is not dead or cancelled."""


class JobKeyHeld(JobStateConflict):
    """Retry of a dead or cancelled job whose key (``idempotency_key``)
    another job, ``holder``, holds now: retrying it would make two."""

    field = "idempotency_key"

    def __init__(self, job_id: int, state: str, key: str, holder: int) -> None:
        super().__init__(job_id, state, "retry", f"its key {key!r} is held by job {holder}")
        self.key = key
        self.holder = holder
        self.problem = f"is held by job {holder}"


class KeyTaken(PgQueueError):
    """A statement would have made a job hold a key that another job took at
    the same moment, after the statement's own check. The driver raises it
    into the flow, which tries again; it does not reach callers."""


# Rounds of insert-then-look-up (after KeyTaken) before a key that keeps
# changing hands is an error: each round that fails needs a holder that let
# the key go between the two statements.
KEY_ROUNDS = 3


class WaitTimeout(PgQueueError, TimeoutError):
    """The job did not finish within the wait's timeout."""

    def __init__(self, job_id: int, timeout: float) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id} did not finish within {timeout:g} s")


class SignalTimeout(PgQueueError, TimeoutError):
    """``job.wait_for_signal()``: the signal ``name`` did not come before
    the wait's ``deadline`` (fixed by the wait's first call, database
    clock). Every later attempt's same wait raises it again: the wait's
    outcome is stored, and a signal that comes later waits for the next
    wait of that name."""

    def __init__(self, job_id: int, name: str, deadline: datetime) -> None:
        self.job_id = job_id
        self.name = name
        self.deadline = deadline
        super().__init__(
            f"job {job_id}: no signal {name!r} came before the wait's deadline, "
            f"{deadline.isoformat()}"
        )


class DatabaseUnavailable(PgQueueError, ConnectionError):
    """The database could not be reached, or did not answer, within the
    configured wait. Raised as this class itself, nothing was written: a
    call whose writes may have landed raises ``OutcomeUnknown``."""


class DatabaseReadOnly(DatabaseUnavailable):
    """The database answers but refuses writes: a standby, or a primary
    being demoted in a failover. Retry: a multi-host URL with
    ``target_session_attrs=read-write`` finds the new primary."""

    def __init__(self) -> None:
        super().__init__(
            "the database refuses writes: it is read-only (a standby, or a primary being "
            "demoted in a failover)"
        )


class SchemaNotMigrated(PgQueueError):
    """The database has no pgqueue schema, or an older one than this code.
    ``pending`` lists the migrations not applied (empty when unknown)."""

    def __init__(self, pending: list[str] | None = None) -> None:
        self.pending = list(pending or [])
        missing = f" (missing: {', '.join(self.pending)})" if self.pending else ""
        super().__init__(f"the database schema is not migrated{missing}: run `pgqueue migrate`")


class UnsupportedServer(PgQueueError):
    """The PostgreSQL server is older than the oldest pgqueue supports
    (``MINIMUM``, a server_version_num); migrate wrote nothing."""

    MINIMUM = 150_000

    def __init__(self, version: str) -> None:
        self.version = version
        super().__init__(
            f"pgqueue needs PostgreSQL {self.MINIMUM // 10_000} or newer; "
            f"this server is {version}; nothing was written"
        )


class WorkerFailed(PgQueueError):
    """A part of the worker (``part``: claims, outcomes, heartbeats, ...)
    failed unexpectedly. The worker stopped gracefully; the cause is chained
    and was logged with its traceback."""

    def __init__(self, worker: str, part: str, cause: BaseException) -> None:
        self.worker = worker
        self.part = part
        super().__init__(f"worker {worker}: {part} failed: {type(cause).__name__}: {cause}")


class NotInHandler(PgQueueError, RuntimeError):
    """A job's methods that reach its worker (``job.transaction()``,
    ``job.progress()``, ``job.step()``, ``job.checkpoint()``) were called
    outside the handler that runs the job: on a job read with
    ``Queue.get``, in a test calling the handler directly, in an isolated
    handler's child process, or after the handler returned."""

    def __init__(self, job_id: int, method: str) -> None:
        self.job_id = job_id
        self.method = method
        super().__init__(
            f"job.{method}() works only inside the handler that a worker runs for the job "
            f"(job {job_id}: not running in this handler)"
        )


class StaleAttempt(PgQueueError):
    """``job.transaction()`` could not complete the job, or ``job.step()``
    store a step's result, or ``job.checkpoint()`` a checkpoint: this
    attempt's fencing token no longer holds (its lease expired and the job
    was taken back, or the job was cancelled). The transaction was rolled
    back (nothing was stored), so nothing of it committed; another attempt
    does (or did) the work."""

    def __init__(
        self, job_id: int, token: int, what: str = "the transaction was rolled back"
    ) -> None:
        self.job_id = job_id
        self.token = token
        super().__init__(
            f"job {job_id}: this attempt (token {token}) no longer holds the job (its lease "
            f"was lost or the job was cancelled): {what}"
        )


class OutcomeUnknown(DatabaseUnavailable):
    """A call could not learn, within its deadline, whether its writes
    landed (``what``: the call): a statement that writes, or a COMMIT, went
    out and its answer never came back (the connection was lost, or the
    server stopped answering and the call was cut at its deadline), or a
    COMMIT waited for a synchronous standby past the deadline and its wait
    was cancelled (then it did commit on that server, its replication not
    confirmed). Read the state to find out before doing it again."""

    def __init__(self, what: str, reason: str, *, read: str = "read the state to find out") -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: the outcome is unknown: {reason}; {read}")


class EnqueueOutcomeUnknown(OutcomeUnknown):
    """An enqueue's ``OutcomeUnknown``. ``job_ids``: the ids the call
    reserved, which its jobs have if they exist (``job_id``: the first, a
    single enqueue's); read them (``Queue.get``, ``GET /jobs/{id}``) to find
    out; each job the call wrote carries ``call_key`` (the call's key,
    stored on its row), which tells it from another call's job under the
    same id. Enqueueing again without an idempotency key may make a second
    job."""

    def __init__(
        self, what: str, job_ids: list[int], reason: str, call_key: UUID | None = None
    ) -> None:
        self.job_ids = list(job_ids)
        self.call_key = call_key
        self.job_id = self.job_ids[0] if self.job_ids else None
        named = ", ".join(map(str, self.job_ids[:5])) + (", ..." if len(self.job_ids) > 5 else "")
        super().__init__(what, reason, read=f"job id(s) {named} may exist: read them to find out")


class PayloadNotOpened(PgQueueError):
    """A worker could not decrypt a job's encrypted payload: none of its
    ``encryption_keys`` has the key id the payload was sealed with, or the
    payload was altered. The handler did not run; the attempt fails (and
    the job is retried, so a worker given the key later can run it)."""

    def __init__(self, job_id: int, reason: str) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id}: its payload could not be decrypted: {reason}")
