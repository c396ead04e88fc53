"""Running jobs inline, for your own tests (not for production).

``drain(queue, handlers)`` runs every runnable job, one at a time, in the
calling process, through the worker's own executor (snooze, cancel,
timeouts and all), and writes each outcome as a worker would; jobs that
handlers enqueue meanwhile run too, when they are runnable. It returns what
ran, in order. A failed job's retry waits for its backoff, so it is not run
again by the same drain; a delayed job is not runnable until its time.

``eager(queue, handlers)`` makes ``queue.enqueue`` and
``queue.enqueue_many`` drain at once: the job is written, run, and returned
as it ended. A transactional enqueue (``connection=``) is not run: its job
is not committed yet. For unit tests only: in production a job runs on a
worker, after its enqueue committed, possibly much later.

``assert_idempotent(queue, handler, payload, effects=..., reset=...)`` runs
a handler once, then through the faults of at-least-once delivery (two
attempts at once, a crash after its effects, a lost lease whose late result
is refused), each through the worker's own runner, executor and fenced
writes, and raises ``NotIdempotent`` (an AssertionError) saying which
effects differ from the single run's (docs/howto/idempotent-handlers.md).

The pytest plugin (``pgqueue.pytest_plugin``, loaded by pytest when pgqueue
is installed) gives fixtures for a throwaway database to run these against.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import tracing
from ..core.jobs import Job, JobState
from ..queue import AsyncQueue, Queue
from ..worker.executor import Executor
from ..worker.handlers import TaskRegistry, resolve_tasks
from ..worker.isolation import HandlerProcesses
from ..worker.supervision import EventLog
from ..worker.threads import ThreadPool
from .idempotency import (
    Attempt,
    NotIdempotent,
    Report,
    Scenario,
    assert_idempotent,
    assert_idempotent_async,
)

__all__ = [
    "Attempt",
    "NotIdempotent",
    "Ran",
    "Report",
    "Scenario",
    "assert_idempotent",
    "assert_idempotent_async",
    "drain",
    "drain_async",
    "eager",
    "eager_async",
]

WORKER = "pgqueue-testing"


@dataclass(frozen=True, slots=True)
class Ran:
    """One attempt that ``drain`` ran: the job as claimed, the state its
    outcome left it in, and what the handler returned or the error."""

    job: Job
    state: JobState
    result: Any
    error: str | None


Handlers = Mapping[str, Any] | TaskRegistry


async def drain_async(
    queue: AsyncQueue,
    handlers: Handlers,
    *,
    queues: Sequence[str] | None = None,
    limit: int = 10_000,
) -> list[Ran]:
    """Run every runnable job of ``queues`` (None: all) inline, at most
    ``limit``; see the module docstring."""
    tasks = resolve_tasks(handlers)
    threads = ThreadPool(1, name="pgqueue-testing")
    processes = HandlerProcesses(tasks.values())
    settings = queue.settings
    executor = Executor(
        tasks,
        threads,
        processes,
        EventLog(WORKER),
        max_snoozes=settings.max_snoozes,
        traced=tracing.enabled(settings),
        sealing=settings.sealing,
    )
    ran: list[Ran] = []
    try:
        while len(ran) < limit:
            claimed = await queue.claim(1, worker=WORKER, queues=queues)
            if not claimed:
                return ran
            outcome = await executor.execute(claimed[0])
            states = await queue.finish([outcome])
            result = None if outcome.result_json is None else json.loads(outcome.result_json)
            ran.append(Ran(claimed[0], states[claimed[0].id], result, outcome.error))
        return ran
    finally:
        threads.shutdown()
        processes.shutdown()


def drain(
    queue: Queue,
    handlers: Handlers,
    *,
    queues: Sequence[str] | None = None,
    limit: int = 10_000,
) -> list[Ran]:
    """As ``drain_async``, for a blocking ``Queue`` (not from inside a
    running event loop: use ``drain_async`` there)."""

    async def run() -> list[Ran]:
        async with AsyncQueue(queue.url, settings=queue.settings) as aqueue:
            return await drain_async(aqueue, handlers, queues=queues, limit=limit)

    return asyncio.run(run())


@contextlib.contextmanager
def eager(queue: Queue, handlers: Handlers) -> Iterator[Queue]:
    """Within the block, ``queue``'s enqueues run their jobs at once."""
    enqueue, enqueue_many = queue.enqueue, queue.enqueue_many

    def enqueue_and_run(task: str, payload: Any = None, **fields: Any) -> Job:
        job = enqueue(task, payload, **fields)
        if fields.get("connection") is not None:
            return job
        drain(queue, handlers)
        return queue.get(job.id)

    def enqueue_many_and_run(jobs: Any, **options: Any) -> Any:
        enqueued = enqueue_many(jobs, **options)
        if options.get("connection") is None:
            drain(queue, handlers)
        return enqueued

    with _replaced(queue, enqueue=enqueue_and_run, enqueue_many=enqueue_many_and_run):
        yield queue


@contextlib.asynccontextmanager
async def eager_async(queue: AsyncQueue, handlers: Handlers) -> AsyncIterator[AsyncQueue]:
    """As ``eager``, for an ``AsyncQueue``."""
    enqueue, enqueue_many = queue.enqueue, queue.enqueue_many

    async def enqueue_and_run(task: str, payload: Any = None, **fields: Any) -> Job:
        job = await enqueue(task, payload, **fields)
        if fields.get("connection") is not None:
            return job
        await drain_async(queue, handlers)
        return await queue.get(job.id)

    async def enqueue_many_and_run(jobs: Any, **options: Any) -> Any:
        enqueued = await enqueue_many(jobs, **options)
        if options.get("connection") is None:
            await drain_async(queue, handlers)
        return enqueued

    with _replaced(queue, enqueue=enqueue_and_run, enqueue_many=enqueue_many_and_run):
        yield queue


@contextlib.contextmanager
def _replaced(queue: Queue | AsyncQueue, **methods: Any) -> Iterator[None]:
    """The queue object's methods replaced for the block (this object only)."""
    for name, method in methods.items():
        setattr(queue, name, method)
    try:
        yield
    finally:
        for name in methods:
            delattr(queue, name)
