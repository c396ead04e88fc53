"""``Queue``, the blocking face."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Self, TypeVar
from uuid import UUID

from ..core import (
    archive,
    batches,
    dependencies,
    key_objectives,
    queue_controls,
    reads,
    runtime_schedules,
    schedules,
    sealing,
    workflows,
)
from ..core import doctor as doctor_flows
from ..core import transitions as t
from ..core.archive import DroppedPartition
from ..core.batches import Batch, Callback
from ..core.bulk import BulkAction, JobFilter, retry_dead
from ..core.dependencies import WorkflowJobs
from ..core.doctor import DoctorOptions
from ..core.enqueue import CallKey, Enqueued, PerAttempt, per_attempt
from ..core.errors import WaitTimeout
from ..core.flows import Flow
from ..core.health import HealthReport
from ..core.job_spec import JobSpec
from ..core.jobs import Job, JobState
from ..core.key_objectives import KeyObjective
from ..core.outcomes import Outcome, attempt_token
from ..core.queue_controls import QueueControls
from ..core.schedules import ScheduleRecord
from ..core.settings import Settings
from ..db import driver
from ..db.connections import caller_connection, listen_url, resolve_url
from ..db.pools import errors_translated, open_pool
from ..db.waiters import WAIT_POLL_SECONDS, Waiters
from .common import Common, call_name

__all__ = ["Queue"]

T = TypeVar("T")


class Queue(Common):
    """The blocking face: ``with Queue() as q: q.enqueue("task", {...})``."""

    def __init__(self, url: str | None = None, *, settings: Settings | None = None) -> None:
        super().__init__(url, settings)
        self.url = url or resolve_url(self.settings)
        self._pool = open_pool(self.url, self.settings)
        self._waiters = Waiters(listen_url(self.settings, self.url))

    def close(self) -> None:
        self._waiters.close()
        self._pool.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- driving transitions --------------------------------------------------

    def run(self, flow: Flow[T], connection: Any = None, *, transaction: bool = False) -> T:
        """Drive a flow (a transition, a read) on the caller's connection
        (bounded by the caller's own timeouts), or on a pooled one (each
        statement by ``call_timeout_seconds``: retrying.Retrying.once)."""
        with errors_translated():
            if connection is not None:
                with driver.tuple_cursor(caller_connection(connection)) as cur:
                    return driver.drive(flow, driver.CursorSession(cur))
            return self._retrying.once(self._pool, flow, call_name(flow), transaction)

    def _retried(
        self,
        flow: Callable[[], Flow[T]],
        what: str,
        *,
        transaction: bool = False,
        call: CallKey | None = None,
    ) -> T:
        """Drive a new ``flow()`` until one attempt ends (retrying.py); ``call``:
        the key its flows share (a PerAttempt's own, if not given)."""
        call = call or (flow.call if isinstance(flow, PerAttempt) else None)
        with errors_translated():
            return self._retrying.drive(self._pool, self.url, flow, what, transaction, call)

    # -- producers ----------------------------------------------------------------

    def enqueue(
        self, task: str, payload: Any = None, *, connection: Any = None, **fields: Any
    ) -> Job:
        """Add a job. Fields: queue, priority, delay_seconds (or delay), run_at,
        max_attempts, timeout_seconds (or timeout), idempotency_key; see
        ``jobs.JOB_FIELDS``. A bad or unknown field raises InvalidJob naming
        it. With ``connection``, the job is part of the caller's transaction.
        ``job.duplicate`` says the key already existed. With ``depends_on``
        (job ids) it waits for those jobs (docs/workflows.md). With ``batch``
        (a batch id) it joins that open batch (BatchNotFound, BatchClosed
        otherwise, and nothing is written; docs/howto/batches.md). Lost
        connections are retried, never adding the job twice, unless given
        ``connection`` or ``depends_on``."""
        spec = self._spec(task, payload, **fields)
        if connection is not None or spec.depends_on:
            return self.run(
                self._enqueue_flows.enqueue(spec), connection, transaction=bool(spec.depends_on)
            )
        # A job that joins a batch: the batch's lock and the insert in one transaction.
        attempts = per_attempt(self._enqueue_flows.enqueue, spec)
        return self._retried(attempts, "enqueue", transaction=spec.batch_id is not None)

    def enqueue_workflow(self, flow: workflows.Workflow, *, connection: Any = None) -> WorkflowJobs:
        """Add a workflow (``chain``/``group`` of steps, or a list of named
        jobs) in one transaction, under a new workflow id."""
        return self.run(self._enqueue_flows.workflow(flow), connection, transaction=True)

    def workflow(self, workflow_id: UUID | str, action: str = "show") -> WorkflowJobs:
        """A workflow's jobs, after ``action``: show, cancel (every job not
        ended) or retry (its dead and cancelled jobs)."""
        return self.run(workflows.act(action, workflow_id), transaction=True)

    def list_workflows(
        self, *, state: str | None = None, before: int | None = None, limit: int = 50
    ) -> list[workflows.WorkflowSummary]:
        """Workflows newest first, each with its jobs counted by state. ``state``
        keeps those with a job not ended (running), with none (finished), with
        only succeeded jobs (succeeded), with a dead or a cancelled job (dead,
        cancelled); ``before``: the last one's ``first_job``, for the next page."""
        return self.run(workflows.list_workflows(state=state, before=before, limit=limit))

    def open_batch(
        self,
        *,
        on_success: Callback | None = None,
        on_death: Callback | None = None,
        on_finish: Callback | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Batch:
        """Open a batch: jobs join it by ``enqueue(..., batch=batch.id)``
        (from a handler too) until ``close_batch``. Once closed and every job
        of it has ended, its callbacks are enqueued exactly once, each a
        job's fields (as ``enqueue_many`` takes them): ``on_success`` when
        every job succeeded, ``on_death`` when at least one died,
        ``on_finish`` in any case. Their metadata gets the key ``batch``:
        the batch's id, counts and ``metadata``. InvalidJob names a bad
        callback field (``on_success.priority``); nothing is written."""
        callbacks = {"on_success": on_success, "on_death": on_death, "on_finish": on_finish}
        flow = batches.open_batch(callbacks, metadata, self.settings.default_max_attempts)
        return self.run(flow)

    def close_batch(self, batch_id: UUID | str) -> Batch:
        """Close a batch: no job may join it any more (BatchClosed). If every
        job of it has already ended, its callbacks are enqueued now;
        otherwise when its last job ends. A batch already closed stays as
        it is. BatchNotFound for an unknown id."""
        return self.run(batches.close_batch(batch_id), transaction=True)

    def get_batch(self, batch_id: UUID | str) -> Batch:
        """A batch: its state, counters, jobs by state and callback jobs."""
        return self.run(batches.get_batch(batch_id))

    def enqueue_many(
        self, jobs: Iterable[JobSpec | Mapping[str, Any]], *, connection: Any = None
    ) -> list[Enqueued]:
        """Add many jobs (mappings of the same fields as ``enqueue``, task
        and payload included) in one transaction; one result per job, in order.
        Retried as ``enqueue`` is, unless given a ``connection`` or a job
        has ``depends_on``."""
        specs = self._specs(jobs)
        if not specs:
            return []
        if connection is not None or any(spec.depends_on for spec in specs):
            return self.run(self._enqueue_flows.enqueue_many(specs), connection, transaction=True)
        attempts, transaction = self._bulk_attempts(specs)
        return self._retried(attempts, "enqueue_many", transaction=transaction)

    def wait(
        self,
        job_id: int,
        timeout: float,
        *,
        on_progress: Callable[[Job], object] | None = None,
    ) -> Job:
        """Block until the job succeeds, dies or is cancelled; raise
        WaitTimeout. ``on_progress`` is called with the job read back each
        time it shows a progress report not seen before (job.progress(); at
        most about once a second: the worker's pace)."""
        deadline = time.monotonic() + timeout
        with self._waiters.waiting(job_id) as ended:
            job = self.run(reads.watch(job_id, timeout))
            seen = reads.ProgressSeen(on_progress)
            while True:
                seen(job)
                remaining = deadline - time.monotonic()
                if job.state.finished:
                    return job
                if remaining <= 0:
                    raise WaitTimeout(job_id, timeout)
                ended.wait(min(remaining, WAIT_POLL_SECONDS))
                ended.clear()
                job = self.get(job_id)

    # -- workers --------------------------------------------------------------------

    def claim(
        self, limit: int = 1, *, worker: str = "", queues: Sequence[str] | None = None
    ) -> list[Job]:
        """Claim up to ``limit`` runnable jobs, round-robin across ``queues``
        (None: every queue that has queued jobs; see ``EveryQueue``). A
        paused queue gives none; a limited queue what its limits allow."""
        return self.run(self._claim(limit, worker, queues))

    def heartbeat(self, jobs: Sequence[Job], lease_seconds: float | None = None) -> set[int]:
        held = [(job.id, attempt_token(job)) for job in jobs]
        return self.run(t.heartbeat(held, lease_seconds or self.settings.lease_seconds))

    def ack(self, job: Job, result: Any = None) -> JobState | None:
        """Record success: the new state (succeeded; or queued/dead when the
        result cannot be stored), or None if the lease was lost (result dropped)."""
        return self.finish([Outcome.success(job, result)]).get(job.id)

    def fail(self, job: Job, error: str, *, retryable: bool = True) -> JobState | None:
        """Record a failed attempt; the new state, or None if the lease was lost."""
        return self.finish([Outcome.failure(job, error, retryable=retryable)]).get(job.id)

    def finish(self, outcomes: Sequence[Outcome]) -> dict[int, JobState]:
        return self.run(t.finish(self.settings, outcomes))

    def reap(self, limit: int | None = None) -> dict[int, JobState]:
        return self.run(t.reap(self.settings, limit))

    def prune(self, limit: int | None = None) -> int:
        return self.run(t.prune(self.settings, limit))

    def archive(self, limit: int | None = None) -> int:
        """Move up to ``limit`` (default ``archive_batch``) succeeded jobs
        past ``archive_after_seconds`` to the archive, creating the day
        partitions they need; how many moved (docs/howto/retention.md).
        Maintenance does it every ``prune_interval_seconds``."""
        self.run(archive.partitions(self.settings))
        return self.run(archive.move(self.settings, limit)).jobs

    def drop_archived(self) -> list[DroppedPartition]:
        """Drop the archive's day partitions wholly older than
        ``retention_seconds``: retention of archived jobs, no row deleted one
        by one. Maintenance does it with each prune."""
        return self.run(archive.drop(self.settings))

    def reseal_payloads(self) -> int:
        """Key rotation: seal again, with the first of ``encryption_keys``,
        every stored payload sealed with another key (the others must still
        be listed, to open them); how many were rewritten
        (docs/howto/encryption.md)."""
        return self.run(sealing.reseal(self.settings.sealing))

    # -- queue controls ---------------------------------------------------------------

    def pause(self, queue: str) -> QueueControls:
        """Start no more jobs of ``queue``, on any worker, from now on (a claim
        already running may still take some); its running jobs finish."""
        return self.run(queue_controls.change(queue, {"paused": True}), transaction=True)

    def resume(self, queue: str) -> QueueControls:
        """Start jobs of ``queue`` again, and wake the workers."""
        return self.run(queue_controls.change(queue, {"paused": False}), transaction=True)

    def set_limits(self, queue: str, **limits: Any) -> QueueControls:
        """Set some of ``queue``'s limits (the names of ``queue_controls.LIMITS``):
        None removes one, a limit not given stays. InvalidQueueControl names
        a bad one, and nothing is written."""
        flow = queue_controls.change(queue, limits, allowed=queue_controls.LIMITS)
        return self.run(flow, transaction=True)

    def queue_controls(self) -> dict[str, QueueControls]:
        """The pause and limits of every queue that ever had any, by name."""
        return self.run(queue_controls.read_all())

    def set_key_objective(
        self, queue: str, key: str, max_start_lag_seconds: float | None
    ) -> KeyObjective | None:
        """Declare the latency objective of one concurrency_key of a fair
        queue (None removes it): a claim takes first the jobs of the keys
        whose next job has waited half of theirs, the furthest behind first.
        The objective as the claims now weigh it (None: removed);
        InvalidQueueControl names a bad argument, and nothing is written."""
        flow = key_objectives.set_objective(queue, key, max_start_lag_seconds)
        return self.run(flow, transaction=True)

    def key_objectives(self, queue: str | None = None) -> list[KeyObjective]:
        """The key objectives of ``queue`` (None: of every queue), by queue
        and key, each with its key's wait and shortfall."""
        return self.run(key_objectives.read(queue))

    # -- operators ----------------------------------------------------------------

    def get(self, job_id: int) -> Job:
        return self.run(reads.get(job_id))

    def dependents(self, job_id: int) -> list[int]:
        """The ids of the jobs that depend on this one (the first 1,000, by
        id); JobNotFound for an unknown id."""
        return self.run(dependencies.dependents(job_id))

    def cancel(self, job_id: int) -> Job:
        return self.run(t.cancel(job_id))

    def retry(self, job_id: int) -> Job:
        return self.run(t.retry(job_id))

    def signal(self, job_id: int, name: str, payload: Any = None) -> Job:
        """Send the signal ``name`` (letters, digits, ``_ . : -``; at most
        200) to a job, with ``payload`` (any JSON, checked as a job's
        payload is): a handler's ``job.wait_for_signal(name, ...)`` consumes
        it, once. A job asleep waiting for it is woken now. Returns the job
        as it is then. Raises InvalidJob for a bad name or payload,
        JobNotFound, or JobAlreadyFinished for a job that succeeded, died
        or was cancelled; nothing is stored then."""
        return self.run(self._signal(job_id, name, payload), transaction=True)

    def retry_dead(self, queue: str | None = None) -> int:
        return self.run(retry_dead(queue))

    def bulk(
        self,
        action: BulkAction | str,
        where: JobFilter | None = None,
        /,
        *,
        dry_run: bool = False,
        **filters: Any,
    ) -> int:
        """Apply a bulk action (cancel, retry, delete) to every job ``where``
        matches (a JobFilter, or its fields as keywords), 1,000 jobs per
        statement; return how many it changed. ``dry_run``: how many it
        would change now, changing nothing."""
        return self.run(self._bulk(action, where, dry_run, filters))

    def bulk_cancel(
        self, where: JobFilter | None = None, /, *, dry_run: bool = False, **filters: Any
    ) -> int:
        """Cancel the queued and running jobs that match (running jobs lose their lease)."""
        return self.bulk(BulkAction.CANCEL, where, dry_run=dry_run, **filters)

    def bulk_retry(
        self, where: JobFilter | None = None, /, *, dry_run: bool = False, **filters: Any
    ) -> int:
        """Put the dead and cancelled jobs that match back to queued."""
        return self.bulk(BulkAction.RETRY, where, dry_run=dry_run, **filters)

    def bulk_delete(
        self, where: JobFilter | None = None, /, *, dry_run: bool = False, **filters: Any
    ) -> int:
        """Delete the finished jobs that match (outcome counters keep them)."""
        return self.bulk(BulkAction.DELETE, where, dry_run=dry_run, **filters)

    def list_jobs(self, **filters: Any) -> list[Job]:
        return self.run(reads.list_jobs(**filters))

    def read(self, name: str, **params: Any) -> list[dict[str, Any]]:
        """Rows of a read-only named query (queue_stats, counters_totals, ...)."""
        return self.run(reads.read(name, **params))

    # -- schedules ----------------------------------------------------------------------

    def list_schedules(self) -> list[ScheduleRecord]:
        """Every schedule, declared in code or created at run time, by name."""
        return self.run(schedules.list_schedules())

    def create_schedule(self, name: str, task: str | None = None, **fields: Any) -> ScheduleRecord:
        """Create a schedule at run time (origin runtime): ``cron`` (with
        ``tz``) or ``every``, and Schedule.create's other fields (payload,
        queue, priority, max_attempts, timeout, catch_up, catch_up_limit),
        plus ``enabled`` (default True). ``task`` defaults to ``name``; it
        need not be handled by a running worker yet. It starts at its first
        tick after now. InvalidSchedule names a bad field; ScheduleConflict
        when the name is taken (declared in code, or created before).
        Nothing is written in either case."""
        return self.run(self._create_schedule(name, task, dict(fields)))

    def update_schedule(self, name: str, **changes: Any) -> ScheduleRecord:
        """Change some fields of a runtime schedule (those of
        create_schedule but ``enabled``); the others stay. A changed timing
        starts from its first tick after now (the database's clock).
        InvalidSchedule (no field, a bad one), ScheduleNotFound, or
        ScheduleConflict (it is declared in code); nothing is written."""
        flow = runtime_schedules.update(name, changes)
        return self.run(flow, transaction=True)

    def delete_schedule(self, name: str) -> None:
        """Delete a schedule (its jobs stay). One that a worker's code
        declares is created again when that worker starts."""
        self.run(schedules.delete(name))

    def enable_schedule(self, name: str) -> ScheduleRecord:
        """Switch a schedule on, from its first tick after now."""
        return self.run(schedules.set_enabled(name, True))

    def disable_schedule(self, name: str) -> ScheduleRecord:
        """Switch a schedule off, on every worker."""
        return self.run(schedules.set_enabled(name, False))

    def run_schedule_now(self, name: str) -> Job:
        """Enqueue one job of a schedule now (enabled or not), outside its
        ticks; it becomes the schedule's last run, and its next tick stays.
        Its key is ``pgqueue:schedule-now:NAME@SECOND``: called again within
        the same second (a double click), it returns that job
        (``duplicate`` True) and enqueues nothing."""
        flow = runtime_schedules.run_now(name, self.settings.default_max_attempts)
        return self.run(flow)

    def doctor(
        self,
        *,
        window_seconds: float = 5.0,
        long_transaction_seconds: float = 60.0,
        cores: int | None = None,
    ) -> HealthReport:
        """A live capacity and health check (docs/howto/health-check.md): the
        rate, cost and WAL per job measured over ``window_seconds`` (which
        this call waits), the headroom on ``cores`` cores, and what threatens
        the queue. A bad option raises InvalidSettings naming it."""
        options = DoctorOptions(window_seconds, long_transaction_seconds, cores)
        first = self.run(doctor_flows.sample())
        time.sleep(options.window_seconds)
        second = self.run(doctor_flows.sample())
        return self.run(doctor_flows.examine(self.settings, options, first, second))
