"""pgqueue: a durable job queue whose only infrastructure is PostgreSQL.

Layout (one guess finds each part; docs/architecture.md has the whole plan):

    sql/queries.sql     every statement, named; migrations/*.sql, the schema
    core/               no I/O: transitions.py (the state machine: claim, finish,
                        reap...), reads.py, outcomes.py (Outcome, Snooze, CancelJob),
                        steps.py and sleeps.py (durable steps, sleeps, signals),
                        enqueue.py, job_spec.py (the one shape of a new job), jobs.py
                        (Job, JobState), rules.py and json_text.py, schedules.py,
                        workflows.py, bulk.py, queue_controls.py, settings.py, errors.py,
                        doctor.py with health.py and threats.py (the doctor's checks)
    db/                 the only code that talks to PostgreSQL: driver.py drives the
                        flows; connections, retries, deadlines, group commit,
                        wait()'s listener, the worker's connection, migrate, the
                        embedded server
    queue/              Queue (blocking) and AsyncQueue (asyncio)
    worker/             the worker: producer (claims), running (each job's runner),
                        executor, completer (acks), leases, maintenance (reaps),
                        wired in runtime.py
    api/                the FastAPI HTTP layer
    cli/                the command line, one module per topic
    processes.py        the supervisor of child processes (up, worker --processes)
    clusters.py         queues over several PostgreSQL clusters
    tracing.py          OpenTelemetry, when installed and switched on

A job's life (see docs/architecture.md):

    queued --claim--> running --ack--> succeeded
    running --fail or lease expired, attempts left--> queued (after backoff)
    running --fail or lease expired, no attempts left--> dead
    running --the handler raised Snooze--> queued (after its delay; the attempt given back)
    running --job.sleep(), job.wait_for_signal()--> queued (until its wake time, or
        the signal; the attempt given back: docs/howto/durable-sleep-and-signals.md)
    running --the handler raised CancelJob--> cancelled
    queued, running --cancel--> cancelled;  dead, cancelled --retry--> queued
    waiting (for the jobs it depends on) --the last one ended--> queued (docs/workflows.md)
"""

from __future__ import annotations

import importlib
import logging
import typing

# The one place the version is written: pyproject.toml reads it from here
# (tool.setuptools.dynamic), and a worker reads it without importlib.metadata
# (a start-up cost of its own).
__version__ = "0.1.0"

# The names below are imported on first use (PEP 562), so that a program that
# needs one part (a worker process, one command of the command line) does not
# import them all: each module costs its start-up (about 0.02 s of a worker's).
if typing.TYPE_CHECKING:
    from .core.archive import DroppedPartition
    from .core.batches import Batch, BatchState
    from .core.bulk import BulkAction, JobFilter
    from .core.enqueue import Enqueued
    from .core.errors import (
        BatchClosed,
        BatchNotFound,
        DatabaseReadOnly,
        DatabaseUnavailable,
        EnqueueOutcomeUnknown,
        InvalidJob,
        InvalidQueueControl,
        InvalidSchedule,
        InvalidSettings,
        JobAlreadyFinished,
        JobKeyHeld,
        JobNotFound,
        JobNotRetryable,
        JobStateConflict,
        NotInHandler,
        OutcomeUnknown,
        PayloadNotOpened,
        PgQueueError,
        ScheduleConflict,
        ScheduleNotFound,
        SchemaNotMigrated,
        SignalTimeout,
        StaleAttempt,
        UnsupportedServer,
        WaitTimeout,
        WorkerFailed,
        WorkflowNotFound,
    )
    from .core.health import HealthCheck, HealthReport
    from .core.job_spec import JobSpec
    from .core.jobs import AttemptError, Job, JobState
    from .core.key_objectives import KeyObjective
    from .core.outcomes import CancelJob, Outcome, Snooze
    from .core.queue_controls import QueueControls
    from .core.schedules import Schedule, ScheduleRecord
    from .core.settings import Settings
    from .core.workflows import chain, group
    from .db.migrate import migrate
    from .queue import AsyncQueue, Queue

__all__ = [
    "AsyncQueue",
    "AttemptError",
    "Batch",
    "BatchClosed",
    "BatchNotFound",
    "BatchState",
    "BulkAction",
    "CancelJob",
    "DatabaseReadOnly",
    "DatabaseUnavailable",
    "DroppedPartition",
    "EnqueueOutcomeUnknown",
    "Enqueued",
    "HealthCheck",
    "HealthReport",
    "InvalidJob",
    "InvalidQueueControl",
    "InvalidSchedule",
    "InvalidSettings",
    "Job",
    "JobAlreadyFinished",
    "JobFilter",
    "JobKeyHeld",
    "JobNotFound",
    "JobNotRetryable",
    "JobSpec",
    "JobState",
    "JobStateConflict",
    "KeyObjective",
    "NotInHandler",
    "Outcome",
    "OutcomeUnknown",
    "PayloadNotOpened",
    "PgQueueError",
    "Queue",
    "QueueControls",
    "Schedule",
    "ScheduleConflict",
    "ScheduleNotFound",
    "ScheduleRecord",
    "SchemaNotMigrated",
    "Settings",
    "SignalTimeout",
    "Snooze",
    "StaleAttempt",
    "UnsupportedServer",
    "WaitTimeout",
    "WorkerFailed",
    "WorkflowNotFound",
    "chain",
    "group",
    "migrate",
]

logging.getLogger("pgqueue").addHandler(logging.NullHandler())

# Where each public name lives.
_HOMES = {
    "AsyncQueue": ".queue",
    "AttemptError": ".core.jobs",
    "Batch": ".core.batches",
    "BatchClosed": ".core.errors",
    "BatchNotFound": ".core.errors",
    "BatchState": ".core.batches",
    "BulkAction": ".core.bulk",
    "CancelJob": ".core.outcomes",
    "DatabaseReadOnly": ".core.errors",
    "DatabaseUnavailable": ".core.errors",
    "DroppedPartition": ".core.archive",
    "EnqueueOutcomeUnknown": ".core.errors",
    "Enqueued": ".core.enqueue",
    "HealthCheck": ".core.health",
    "HealthReport": ".core.health",
    "InvalidJob": ".core.errors",
    "InvalidQueueControl": ".core.errors",
    "InvalidSchedule": ".core.errors",
    "InvalidSettings": ".core.errors",
    "Job": ".core.jobs",
    "JobAlreadyFinished": ".core.errors",
    "JobFilter": ".core.bulk",
    "JobKeyHeld": ".core.errors",
    "JobNotFound": ".core.errors",
    "JobNotRetryable": ".core.errors",
    "JobSpec": ".core.job_spec",
    "JobState": ".core.jobs",
    "JobStateConflict": ".core.errors",
    "KeyObjective": ".core.key_objectives",
    "NotInHandler": ".core.errors",
    "Outcome": ".core.outcomes",
    "OutcomeUnknown": ".core.errors",
    "PayloadNotOpened": ".core.errors",
    "PgQueueError": ".core.errors",
    "Queue": ".queue",
    "QueueControls": ".core.queue_controls",
    "Schedule": ".core.schedules",
    "ScheduleConflict": ".core.errors",
    "ScheduleNotFound": ".core.errors",
    "ScheduleRecord": ".core.schedules",
    "SchemaNotMigrated": ".core.errors",
    "Settings": ".core.settings",
    "SignalTimeout": ".core.errors",
    "Snooze": ".core.outcomes",
    "StaleAttempt": ".core.errors",
    "UnsupportedServer": ".core.errors",
    "WaitTimeout": ".core.errors",
    "WorkerFailed": ".core.errors",
    "WorkflowNotFound": ".core.errors",
    "chain": ".core.workflows",
    "group": ".core.workflows",
    "migrate": ".db.migrate",
}


def __getattr__(name: str) -> typing.Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
