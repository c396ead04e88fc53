"""The two faces of the queue: ``Queue`` (blocking) and ``AsyncQueue`` (asyncio).

Both drive the same transition generators from ``transitions``; this module
only owns connections: a pool that checks connections on checkout (so a
database restart costs one failed check, not a failed call; the producers'
retried calls skip it: retrying.py), bounded waits, and running a transition
on the caller's own connection so that a job commits or rolls back with the
caller's data.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Self, TypeVar
from uuid import UUID

from . import tracing
from .core import queue_controls, reads, workflows
from .core import transitions as t
from .core.bulk import BulkAction, JobFilter, bulk, retry_dead
from .core.dependencies import WorkflowJobs
from .core.enqueue import CallKey, Enqueued, PerAttempt, per_attempt
from .core.errors import WaitTimeout
from .core.every_queue import EveryQueue
from .core.flows import Flow
from .core.job_spec import JobSpec, build_specs
from .core.jobs import Job, JobState
from .core.outcomes import Outcome, attempt_token
from .core.queue_controls import QueueControls
from .core.settings import Settings
from .db import driver
from .db.connections import (
    AsyncPool,
    async_caller_connection,
    caller_connection,
    errors_translated,
    listen_url,
    open_async_pool,
    open_pool,
    resolve_url,
)
from .db.driver import is_asyncpg_connection
from .db.group_commit import GroupCommitter
from .db.retrying import Retrying
from .db.waiters import WAIT_POLL_SECONDS, AsyncWaiters, Waiters

__all__ = ["AsyncQueue", "Queue", "resolve_url"]

T = TypeVar("T")


def _call_name(flow: Flow[Any]) -> str:
    """The call a flow makes, for its errors: its generator's name."""
    return str(getattr(flow, "__name__", "call"))


class _Common:
    """Settings, URL and the validation shared by both faces."""

    def __init__(self, url: str | None, settings: Settings | None) -> None:
        self.settings = settings or Settings.load()
        self._url = url
        self._every_queue = EveryQueue(self.settings.poll_interval_seconds)
        self._retrying = Retrying(self.settings)
        self._enqueue_flows = tracing.EnqueueFlows(self.settings)  # traced when tracing is on

    def _spec(self, task: Any, payload: Any, **fields: Any) -> JobSpec:
        given = {"task": task, "payload": payload, **fields}
        spec = JobSpec.from_fields(given, default_max_attempts=self.settings.default_max_attempts)
        return self._enqueue_flows.stamp([spec])[0]

    def _specs(self, jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[JobSpec]:
        specs = build_specs(jobs, default_max_attempts=self.settings.default_max_attempts)
        return self._enqueue_flows.stamp(specs)

    def _claim(self, limit: int, worker: str, queues: Sequence[str] | None) -> Flow[list[Job]]:
        if not 1 <= limit <= 10_000:
            raise ValueError(f"limit must be between 1 and 10000, got {limit}")
        if queues is None:
            return self._every_queue.claim(self.settings, limit=limit, worker=worker)
        return t.claim(self.settings, limit=limit, worker=worker, queues=queues)

    @staticmethod
    def _bulk(
        action: BulkAction | str, where: JobFilter | None, dry_run: bool, filters: dict[str, Any]
    ) -> Flow[int]:
        if where is not None and filters:
            raise TypeError("give a JobFilter or its fields as keywords, not both")
        return bulk(BulkAction(action), where or JobFilter.from_fields(filters), dry_run=dry_run)


class Queue(_Common):
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
        """Run a transition on the caller's connection (bounded by the
        caller's own timeouts), or on a pooled one (each statement by
        ``call_timeout_seconds``: retrying.Retrying.once)."""
        with errors_translated():
            if connection is not None:
                with driver.tuple_cursor(caller_connection(connection)) as cur:
                    return driver.run(flow, driver.CursorSession(cur))
            return self._retrying.once(self._pool, flow, _call_name(flow), transaction)

    def _retried(
        self,
        flow: Callable[[], Flow[T]],
        what: str,
        *,
        transaction: bool = False,
        call: CallKey | None = None,
    ) -> T:
        """Run a new ``flow()`` until one attempt ends (retrying.py); ``call``:
        the key its flows share (a PerAttempt's own, if not given)."""
        call = call or (flow.call if isinstance(flow, PerAttempt) else None)
        with errors_translated():
            return self._retrying.run(self._pool, self.url, flow, what, transaction, call)

    # -- producers ----------------------------------------------------------------

    def enqueue(
        self, task: str, payload: Any = None, *, connection: Any = None, **fields: Any
    ) -> Job:
        """Add a job. Fields: queue, priority, delay_seconds (or delay), run_at,
        max_attempts, timeout_seconds (or timeout), idempotency_key; see
        ``jobs.JOB_FIELDS``. A bad or unknown field raises InvalidJob naming
        it. With ``connection``, the job is part of the caller's transaction.
        ``job.duplicate`` says the key already existed. With ``depends_on``
        (job ids) it waits for those jobs (docs/workflows.md). Lost
        connections are retried, never adding the job twice, unless given
        ``connection`` or ``depends_on``."""
        spec = self._spec(task, payload, **fields)
        if connection is not None or spec.depends_on:
            return self.run(
                self._enqueue_flows.enqueue(spec), connection, transaction=bool(spec.depends_on)
            )
        return self._retried(per_attempt(self._enqueue_flows.enqueue, spec), "enqueue")

    def enqueue_workflow(self, flow: workflows.Workflow, *, connection: Any = None) -> WorkflowJobs:
        """Add a workflow (``chain``/``group`` of steps, or a list of named
        jobs) in one transaction, under a new workflow id."""
        return self.run(self._enqueue_flows.workflow(flow), connection, transaction=True)

    def workflow(self, workflow_id: UUID | str, action: str = "show") -> WorkflowJobs:
        """A workflow's jobs, after ``action``: show, cancel (every job not
        ended) or retry (its dead and cancelled jobs)."""
        return self.run(workflows.act(action, workflow_id), transaction=True)

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
        attempts = per_attempt(self._enqueue_flows.enqueue_many, specs)
        return self._retried(attempts, "enqueue_many", transaction=True)

    def wait(self, job_id: int, timeout: float) -> Job:
        """Block until the job succeeds, dies or is cancelled; raise WaitTimeout."""
        deadline = time.monotonic() + timeout
        with self._waiters.waiting(job_id) as ended:
            job = self.run(reads.watch(job_id, timeout))
            while True:
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

    # -- operators ----------------------------------------------------------------

    def get(self, job_id: int) -> Job:
        return self.run(reads.get(job_id))

    def cancel(self, job_id: int) -> Job:
        return self.run(t.cancel(job_id))

    def retry(self, job_id: int) -> Job:
        return self.run(t.retry(job_id))

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


class AsyncQueue(_Common):
    """The asyncio face: ``async with AsyncQueue() as q: await q.enqueue(...)``.
    With ``group_commit``, concurrent ``enqueue`` calls share statements and
    commits (grouping.py)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        group_commit: bool = False,
    ) -> None:
        super().__init__(url, settings)
        self.url = url or ""
        self._group = GroupCommitter(self._retried, self.settings) if group_commit else None
        self._pool: AsyncPool | None = None
        self._waiters: AsyncWaiters | None = None
        self._opening = asyncio.Lock()

    async def open(self) -> Self:
        async with self._opening:  # two first calls at once make one pool
            if self._pool is None:
                if not self.url:
                    self.url = await asyncio.to_thread(resolve_url, self.settings)
                self._pool = await open_async_pool(self.url, self.settings)
                self._waiters = AsyncWaiters(listen_url(self.settings, self.url))
        return self

    async def close(self) -> None:
        if self._group is not None:  # its callers are answered first
            await self._group.close()
        if self._waiters is not None:
            await self._waiters.close()
            self._waiters = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, flow: Flow[T], connection: Any = None, *, transaction: bool = False) -> T:
        """Run a transition on the caller's connection (bounded by the
        caller's own timeouts), or on a pooled one (each statement by
        ``call_timeout_seconds``: retrying.Retrying.once)."""
        with errors_translated():
            if connection is not None:
                connection = await async_caller_connection(connection)
            if connection is not None and is_asyncpg_connection(connection):
                return await driver.run_async(flow, driver.AsyncpgSession(connection))
            if connection is not None:
                async with driver.async_tuple_cursor(connection) as cur:
                    return await driver.run_async(flow, driver.AsyncCursorSession(cur))
            await self.open()
            assert self._pool is not None
            return await self._retrying.once_async(self._pool, flow, _call_name(flow), transaction)

    async def _retried(
        self,
        flow: Callable[[], Flow[T]],
        what: str,
        *,
        transaction: bool = False,
        call: CallKey | None = None,
    ) -> T:
        """As Queue._retried."""
        await self.open()
        assert self._pool is not None
        call = call or (flow.call if isinstance(flow, PerAttempt) else None)
        with errors_translated():
            return await self._retrying.run_async(
                self._pool, self.url, flow, what, transaction, call
            )

    async def enqueue(
        self, task: str, payload: Any = None, *, connection: Any = None, **fields: Any
    ) -> Job:
        """As Queue.enqueue."""
        spec = self._spec(task, payload, **fields)
        if connection is not None or spec.depends_on:
            flow = self._enqueue_flows.enqueue(spec)
            return await self.run(flow, connection, transaction=bool(spec.depends_on))
        if self._group is not None:
            return await self._enqueue_flows.grouped(self._group.enqueue, spec)
        return await self._retried(per_attempt(self._enqueue_flows.enqueue, spec), "enqueue")

    async def enqueue_workflow(
        self, flow: workflows.Workflow, *, connection: Any = None
    ) -> WorkflowJobs:
        """As Queue.enqueue_workflow."""
        return await self.run(self._enqueue_flows.workflow(flow), connection, transaction=True)

    async def workflow(self, workflow_id: UUID | str, action: str = "show") -> WorkflowJobs:
        """As Queue.workflow."""
        return await self.run(workflows.act(action, workflow_id), transaction=True)

    async def enqueue_many(
        self, jobs: Iterable[JobSpec | Mapping[str, Any]], *, connection: Any = None
    ) -> list[Enqueued]:
        specs = self._specs(jobs)
        if not specs:
            return []
        if connection is not None:  # which driver is behind it decides COPY or INSERT
            with errors_translated():
                connection = await async_caller_connection(connection)
            flow = self._enqueue_flows.enqueue_many(
                specs, copy=not is_asyncpg_connection(connection)
            )
            return await self.run(flow, connection)
        if any(spec.depends_on for spec in specs):
            return await self.run(self._enqueue_flows.enqueue_many(specs), transaction=True)
        attempts = per_attempt(self._enqueue_flows.enqueue_many, specs)
        return await self._retried(attempts, "enqueue_many", transaction=True)

    async def wait(self, job_id: int, timeout: float) -> Job:  # noqa: ASYNC109
        """As Queue.wait, without blocking the event loop."""
        deadline = time.monotonic() + timeout
        await self.open()
        assert self._waiters is not None
        async with self._waiters.waiting(job_id) as ended:
            job = await self.run(reads.watch(job_id, timeout))
            while True:
                remaining = deadline - time.monotonic()
                if job.state.finished:
                    return job
                if remaining <= 0:
                    raise WaitTimeout(job_id, timeout)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ended.wait(), min(remaining, WAIT_POLL_SECONDS))
                ended.clear()
                job = await self.get(job_id)

    async def claim(
        self, limit: int = 1, *, worker: str = "", queues: Sequence[str] | None = None
    ) -> list[Job]:
        return await self.run(self._claim(limit, worker, queues))

    async def heartbeat(self, jobs: Sequence[Job], lease_seconds: float | None = None) -> set[int]:
        held = [(job.id, attempt_token(job)) for job in jobs]
        return await self.run(t.heartbeat(held, lease_seconds or self.settings.lease_seconds))

    async def ack(self, job: Job, result: Any = None) -> JobState | None:
        return (await self.finish([Outcome.success(job, result)])).get(job.id)

    async def fail(self, job: Job, error: str, *, retryable: bool = True) -> JobState | None:
        return (await self.finish([Outcome.failure(job, error, retryable=retryable)])).get(job.id)

    async def finish(self, outcomes: Sequence[Outcome]) -> dict[int, JobState]:
        return await self.run(t.finish(self.settings, outcomes))

    async def reap(self, limit: int | None = None) -> dict[int, JobState]:
        return await self.run(t.reap(self.settings, limit))

    async def prune(self, limit: int | None = None) -> int:
        return await self.run(t.prune(self.settings, limit))

    async def pause(self, queue: str) -> QueueControls:
        """As Queue.pause."""
        return await self.run(queue_controls.change(queue, {"paused": True}), transaction=True)

    async def resume(self, queue: str) -> QueueControls:
        return await self.run(queue_controls.change(queue, {"paused": False}), transaction=True)

    async def set_limits(self, queue: str, **limits: Any) -> QueueControls:
        flow = queue_controls.change(queue, limits, allowed=queue_controls.LIMITS)
        return await self.run(flow, transaction=True)

    async def queue_controls(self) -> dict[str, QueueControls]:
        return await self.run(queue_controls.read_all())

    async def get(self, job_id: int) -> Job:
        return await self.run(reads.get(job_id))

    async def cancel(self, job_id: int) -> Job:
        return await self.run(t.cancel(job_id))

    async def retry(self, job_id: int) -> Job:
        return await self.run(t.retry(job_id))

    async def retry_dead(self, queue: str | None = None) -> int:
        return await self.run(retry_dead(queue))

    async def bulk(
        self,
        action: BulkAction | str,
        where: JobFilter | None = None,
        /,
        *,
        dry_run: bool = False,
        **filters: Any,
    ) -> int:
        """As Queue.bulk."""
        return await self.run(self._bulk(action, where, dry_run, filters))

    async def bulk_cancel(
        self, where: JobFilter | None = None, /, *, dry_run: bool = False, **filters: Any
    ) -> int:
        return await self.bulk(BulkAction.CANCEL, where, dry_run=dry_run, **filters)

    async def bulk_retry(
        self, where: JobFilter | None = None, /, *, dry_run: bool = False, **filters: Any
    ) -> int:
        return await self.bulk(BulkAction.RETRY, where, dry_run=dry_run, **filters)

    async def bulk_delete(
        self, where: JobFilter | None = None, /, *, dry_run: bool = False, **filters: Any
    ) -> int:
        return await self.bulk(BulkAction.DELETE, where, dry_run=dry_run, **filters)

    async def list_jobs(self, **filters: Any) -> list[Job]:
        return await self.run(reads.list_jobs(**filters))

    async def read(self, name: str, **params: Any) -> list[dict[str, Any]]:
        return await self.run(reads.read(name, **params))
