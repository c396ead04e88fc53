"""pgqueue: a durable job queue whose only infrastructure is PostgreSQL.

Layout (one guess finds each part):

    sql/queries.sql     every statement, named; sql/__init__.py loads them
    migrations/*.sql    the schema, applied in order by migrate()
    jobs.py             Job, JobState, JobSpec, JOB_FIELDS (the one shape of a new job),
                        AttemptError (one failed attempt, kept on the job)
    control.py          Snooze, CancelJob: what a handler may ask for instead of a result
    transitions.py      the state machine: one I/O-free generator per transition
    schedules.py        periodic jobs: Schedule and its flows; ticks.py: when each ticks
    bulk.py             bulk cancel, retry and delete by JobFilter, in batches
    driver.py           the one driver that runs them on a connection
    queue.py            Queue (blocking) and AsyncQueue (asyncio); waiting.py: wait()
    controls.py         pause and limits per queue (QueueControls), obeyed by the claim
    workflows.py        chain, group, fan-in; dependencies.py: the flows of jobs that wait
    worker/             the worker: producer (claims), executor, completer (acks),
                        leases, maintenance (reaps), wired in runtime.py
    api/                the FastAPI HTTP layer
    cli/                the command line, one module per topic
    stats.py            per-queue numbers from one snapshot (API and CLI)
    processes.py        the supervisor of child processes (up, worker --processes)
    demo.py             the demo handlers ``pgqueue up`` runs
    embedded.py         the embedded PostgreSQL server
    settings.py         the one settings object and its loader
    errors.py           the exception tree

A job's life (see docs/architecture.md):

    queued --claim--> running --ack--> succeeded
    running --fail or lease expired, attempts left--> queued (after backoff)
    running --fail or lease expired, no attempts left--> dead
    running --the handler raised Snooze--> queued (after its delay; the attempt given back)
    running --the handler raised CancelJob--> cancelled
    queued, running --cancel--> cancelled;  dead, cancelled --retry--> queued
    waiting (for the jobs it depends on) --the last one ended--> queued (docs/workflows.md)
"""

from __future__ import annotations

import logging

from .core.bulk import BulkAction, JobFilter
from .core.enqueue import Enqueued
from .core.errors import (
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
    OutcomeUnknown,
    PgQueueError,
    ScheduleNotFound,
    SchemaNotMigrated,
    WaitTimeout,
    WorkerFailed,
    WorkflowNotFound,
)
from .core.job_spec import JobSpec
from .core.jobs import AttemptError, Job, JobState
from .core.outcomes import CancelJob, Outcome, Snooze
from .core.queue_controls import QueueControls
from .core.schedules import Schedule
from .core.settings import Settings
from .core.workflows import chain, group
from .db.migrate import migrate
from .queue import AsyncQueue, Queue

__all__ = [
    "AsyncQueue",
    "AttemptError",
    "BulkAction",
    "CancelJob",
    "DatabaseReadOnly",
    "DatabaseUnavailable",
    "EnqueueOutcomeUnknown",
    "Enqueued",
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
    "Outcome",
    "OutcomeUnknown",
    "PgQueueError",
    "Queue",
    "QueueControls",
    "Schedule",
    "ScheduleNotFound",
    "SchemaNotMigrated",
    "Settings",
    "Snooze",
    "WaitTimeout",
    "WorkerFailed",
    "WorkflowNotFound",
    "chain",
    "group",
    "migrate",
]

logging.getLogger("pgqueue").addHandler(logging.NullHandler())
