"""``AsyncQueue``, the asyncio face."""

from __future__ import annotations

import asyncio
import contextlib
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
from ..db.connections import async_caller_connection, listen_url, resolve_url
from ..db.driver import is_asyncpg_connection
from ..db.group_commit import GroupCommitter
from ..db.pools import AsyncPool, errors_translated, open_async_pool
from ..db.waiters import WAIT_POLL_SECONDS, AsyncWaiters
from .common import Common, call_name

__all__ = ["AsyncQueue"]

T = TypeVar("T")


class AsyncQueue(Common):
    """The asyncio face: ``async with AsyncQueue() as q: await q.enqueue(...)``.
    With ``group_commit``, concurrent ``enqueue`` calls share statements and
    commits (group_commit.py)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        group_commit: bool = False,
    ) -> None:
        super().__init__(url, settings)
        self.url = url or ""
        self._group_commit = group_commit
        self._pool: AsyncPool | None = None
        self._waiters: AsyncWaiters | None = None
        self._group: GroupCommitter | None = None  # the pool's, with group_commit
        self._opening = asyncio.Lock()

    async def open(self) -> Self:
        async with self._opening:  # two first calls at once make one pool
            if self._pool is None:
                if not self.url:
                    self.url = await asyncio.to_thread(resolve_url, self.settings)
                self._pool = await open_async_pool(self.url, self.settings)
                self._waiters = AsyncWaiters(listen_url(self.settings, self.url))
                if self._group_commit:
                    self._group = GroupCommitter(
                        self._retrying, self._pool, self.url, self.settings
                    )
        return self

    async def close(self) -> None:
        if self._group is not None:  # its callers are answered first
            await self._group.close()
        if self._waiters is not None:
            await self._waiters.close()
            self._waiters = None
        if self._pool is not None:
            await self._pool.close()
            self._pool, self._group = None, None

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, flow: Flow[T], connection: Any = None, *, transaction: bool = False) -> T:
        """Drive a flow (a transition, a read) on the caller's connection
        (bounded by the caller's own timeouts), or on a pooled one (each
        statement by ``call_timeout_seconds``: retrying.Retrying.once)."""
        with errors_translated():
            if connection is not None:
                connection = await async_caller_connection(connection)
            if connection is not None and is_asyncpg_connection(connection):
                return await driver.drive_async(flow, driver.AsyncpgSession(connection))
            if connection is not None:
                async with driver.async_tuple_cursor(connection) as cur:
                    return await driver.drive_async(flow, driver.AsyncCursorSession(cur))
            await self.open()
            assert self._pool is not None
            return await self._retrying.once_async(self._pool, flow, call_name(flow), transaction)

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
            return await self._retrying.drive_async(
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
        # (A job that joins a batch goes alone: a closed batch refuses it,
        # which must not fail the other callers of a group.)
        if self._group_commit and spec.batch_id is None:  # with other callers' single enqueues
            await self.open()
            assert self._group is not None
            return await self._enqueue_flows.grouped(self._group.enqueue, spec)
        attempts = per_attempt(self._enqueue_flows.enqueue, spec)
        return await self._retried(attempts, "enqueue", transaction=spec.batch_id is not None)

    async def enqueue_workflow(
        self, flow: workflows.Workflow, *, connection: Any = None
    ) -> WorkflowJobs:
        """As Queue.enqueue_workflow."""
        return await self.run(self._enqueue_flows.workflow(flow), connection, transaction=True)

    async def workflow(self, workflow_id: UUID | str, action: str = "show") -> WorkflowJobs:
        """As Queue.workflow."""
        return await self.run(workflows.act(action, workflow_id), transaction=True)

    async def list_workflows(
        self, *, state: str | None = None, before: int | None = None, limit: int = 50
    ) -> list[workflows.WorkflowSummary]:
        """As Queue.list_workflows."""
        return await self.run(workflows.list_workflows(state=state, before=before, limit=limit))

    async def open_batch(
        self,
        *,
        on_success: Callback | None = None,
        on_death: Callback | None = None,
        on_finish: Callback | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Batch:
        """As Queue.open_batch."""
        callbacks = {"on_success": on_success, "on_death": on_death, "on_finish": on_finish}
        flow = batches.open_batch(callbacks, metadata, self.settings.default_max_attempts)
        return await self.run(flow)

    async def close_batch(self, batch_id: UUID | str) -> Batch:
        """As Queue.close_batch."""
        return await self.run(batches.close_batch(batch_id), transaction=True)

    async def get_batch(self, batch_id: UUID | str) -> Batch:
        """As Queue.get_batch."""
        return await self.run(batches.get_batch(batch_id))

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
        attempts, transaction = self._bulk_attempts(specs)
        return await self._retried(attempts, "enqueue_many", transaction=transaction)

    async def wait(
        self,
        job_id: int,
        timeout: float,  # noqa: ASYNC109
        *,
        on_progress: Callable[[Job], object] | None = None,
    ) -> Job:
        """As Queue.wait, without blocking the event loop (``on_progress`` is
        a plain function, called on the loop)."""
        deadline = time.monotonic() + timeout
        await self.open()
        assert self._waiters is not None
        async with self._waiters.waiting(job_id) as ended:
            job = await self.run(reads.watch(job_id, timeout))
            seen = reads.ProgressSeen(on_progress)
            while True:
                seen(job)
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

    async def archive(self, limit: int | None = None) -> int:
        """Move up to ``limit`` (default ``archive_batch``) succeeded jobs
        past ``archive_after_seconds`` to the archive, creating the day
        partitions they need; how many moved (docs/howto/retention.md).
        Maintenance does it every ``prune_interval_seconds``."""
        await self.run(archive.partitions(self.settings))
        return (await self.run(archive.move(self.settings, limit))).jobs

    async def drop_archived(self) -> list[DroppedPartition]:
        """Drop the archive's day partitions wholly older than
        ``retention_seconds``: retention of archived jobs, no row deleted one
        by one. Maintenance does it with each prune."""
        return await self.run(archive.drop(self.settings))

    async def reseal_payloads(self) -> int:
        """Key rotation: seal again, with the first of ``encryption_keys``,
        every stored payload sealed with another key (the others must still
        be listed, to open them); how many were rewritten
        (docs/howto/encryption.md)."""
        return await self.run(sealing.reseal(self.settings.sealing))

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

    async def set_key_objective(
        self, queue: str, key: str, max_start_lag_seconds: float | None
    ) -> KeyObjective | None:
        """As Queue.set_key_objective."""
        flow = key_objectives.set_objective(queue, key, max_start_lag_seconds)
        return await self.run(flow, transaction=True)

    async def key_objectives(self, queue: str | None = None) -> list[KeyObjective]:
        return await self.run(key_objectives.read(queue))

    async def get(self, job_id: int) -> Job:
        return await self.run(reads.get(job_id))

    async def dependents(self, job_id: int) -> list[int]:
        """As Queue.dependents."""
        return await self.run(dependencies.dependents(job_id))

    async def cancel(self, job_id: int) -> Job:
        return await self.run(t.cancel(job_id))

    async def retry(self, job_id: int) -> Job:
        return await self.run(t.retry(job_id))

    async def signal(self, job_id: int, name: str, payload: Any = None) -> Job:
        """Send the signal ``name`` (letters, digits, ``_ . : -``; at most
        200) to a job, with ``payload`` (any JSON, checked as a job's
        payload is): a handler's ``job.wait_for_signal(name, ...)`` consumes
        it, once. A job asleep waiting for it is woken now. Returns the job
        as it is then. Raises InvalidJob for a bad name or payload,
        JobNotFound, or JobAlreadyFinished for a job that succeeded, died
        or was cancelled; nothing is stored then."""
        return await self.run(self._signal(job_id, name, payload), transaction=True)

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

    # -- schedules ----------------------------------------------------------------------

    async def list_schedules(self) -> list[ScheduleRecord]:
        """Every schedule, declared in code or created at run time, by name."""
        return await self.run(schedules.list_schedules())

    async def create_schedule(
        self, name: str, task: str | None = None, **fields: Any
    ) -> ScheduleRecord:
        """As Queue.create_schedule."""
        return await self.run(self._create_schedule(name, task, dict(fields)))

    async def update_schedule(self, name: str, **changes: Any) -> ScheduleRecord:
        """As Queue.update_schedule."""
        flow = runtime_schedules.update(name, changes)
        return await self.run(flow, transaction=True)

    async def delete_schedule(self, name: str) -> None:
        """As Queue.delete_schedule."""
        await self.run(schedules.delete(name))

    async def enable_schedule(self, name: str) -> ScheduleRecord:
        """As Queue.enable_schedule."""
        return await self.run(schedules.set_enabled(name, True))

    async def disable_schedule(self, name: str) -> ScheduleRecord:
        """As Queue.disable_schedule."""
        return await self.run(schedules.set_enabled(name, False))

    async def run_schedule_now(self, name: str) -> Job:
        """As Queue.run_schedule_now."""
        flow = runtime_schedules.run_now(name, self.settings.default_max_attempts)
        return await self.run(flow)

    async def doctor(
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
        first = await self.run(doctor_flows.sample())
        await asyncio.sleep(options.window_seconds)
        second = await self.run(doctor_flows.sample())
        return await self.run(doctor_flows.examine(self.settings, options, first, second))
